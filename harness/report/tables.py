"""The leaderboard's tables as text cells (Table), shared by the markdown (harness.report.leaderboard) and the HTML
page (harness.report.html): each result's row (run_row: the metric with its interval, items, bits per element, KV
memory, speed), a group's table (result_table), its paired tests against BF16 and OScaR (paired_table), the README's
headline (headline_table) and the paper's published numbers (paper_tables); and the formatting they share (fmt: plain
numbers, never an exponent; md_table: a table as markdown). The bench references' tables are harness.report.speed's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from harness import stats

GiB = 2**30
SAME_TOKENS, FIRST_DIVERGENCE = "same tokens as bf16", "1st divergence"  # generation agreement columns
NBSP = "\u00a0"  # the markdown's spaces in a Table.nowrap column: a renderer never wraps the cell there


@dataclass
class Table:
    """A table as text cells, shared by the markdown and the HTML page."""

    title: str
    header: list[str]
    rows: list[list[str]]
    row_ids: list[str] = field(default_factory=list)  # result file of each row (HTML data-run)
    note: str = ""
    # columns whose cells read as one unit (a value and its interval, a difference and its p-value): a wrapped
    # '[12.3,' over '14.5]' reads as two numbers, so the markdown and the page never break them
    nowrap: tuple[int, ...] = ()


def is_pipeline_check(result: dict[str, Any]) -> bool:
    """True for a model without trained weights: a tiny replica (model.replica) or a real architecture with random
    weights (model.random_weights, or model.weights == "random"). Such a result shows the code path, speed and memory,
    never accuracy."""
    model = result["model"]
    return bool(model.get("replica") or model.get("random_weights") or model.get("weights") == "random")


def failed_items(result: dict[str, Any]) -> int:
    """Items that ended in an error: system.failed_items or n_errors where recorded, else samples with an 'error'."""
    for recorded in (result["system"].get("failed_items"), result.get("n_errors")):
        if isinstance(recorded, int):
            return recorded
    return sum(1 for s in result.get("samples", []) if "error" in s)


# ---------------------------------------------------------------- result tables


def fmt(x: float | None, digits: int = 4) -> str:
    """x as a plain number, never with an exponent (a reader compares 1756 with 0.0012 at a glance, not 1.76e+03 with
    1.2e-03): `digits` significant digits, or the whole integer where it has more digits than that (1756, not 1760:
    rounding to zeros would hide a digit and save no width)."""
    if x is None:
        return "–"
    if not math.isfinite(x):
        return str(x)
    if abs(x) >= 10 ** (digits - 1):
        return f"{x:.0f}"
    return f"{Decimal(f'{x:.{digits}g}'):f}"


def signed(x: float, digits: int = 3) -> str:
    """fmt with the sign always written: a difference reads as one ('+1968', '-0.25')."""
    return ("+" if x >= 0 else "") + fmt(x, digits)


def group_title(key: tuple[str, str, str], runs: list[dict[str, Any]]) -> str:
    task, data, model = key
    tags = [f"{data} data"] if data != "official" else []
    if task.endswith("-own-paper"):
        tags.append("each method as its own paper runs it")
    if any(r["model"].get("replica") for r in runs):
        tags.append("tiny replica")
    elif any(is_pipeline_check(r) for r in runs):
        tags.append("random weights")
    return f"{task} · {model}" + (f" ({', '.join(tags)})" if tags else "")


def reference_run(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((r for r in runs if r["method"]["name"] == "bf16"), None)


def peak_memory(system: dict[str, Any]) -> str:
    peak = system["peak_memory"]
    if peak.get("cuda_bytes"):
        return f"{fmt(peak['cuda_bytes'] / GiB, 3)} GiB GPU"
    return f"{fmt(peak['cpu_rss_bytes'] / GiB, 3)} GiB RSS" if peak.get("cpu_rss_bytes") else "–"


def run_row(r: dict[str, Any], reference: dict[str, Any] | None, with_metric: bool = True) -> dict[str, str]:
    """One table row: method, metric with its interval, items and failed items, bits/element, KV memory, compression,
    speed, peak memory. Pipeline checks (with_metric=False) leave the metric out."""
    s = r["system"]
    kv = s["kv_bytes"]["total"]
    ref_kv = reference["system"]["kv_bytes"]["total"] if reference else None
    row = {"method": r["method"]["name"] + partial_tag(r), "FP tokens": fp_tokens(r["method"])}
    if with_metric:  # the primary metric, then those the paired tables test too (asr's NLL, ppl's KL and top-1)
        for i, name in enumerate(paired_metrics(r)):
            row["metric" if i == 0 else f"metric:{name}"] = metric_cell(r["metrics"][name])
        row |= agreement_cells(reference, r)
    return {
        **row,
        "items": str(len(r["samples"])),
        "failed": str(failed_items(r)),
        "bits/elt": fmt(s["bits_per_element"], 3),
        "KV KiB/item": fmt(kv / 1024 if kv is not None else None, 4),
        "vs bf16": f"{ref_kv / kv:.2f}x" if kv and ref_kv else "–",
        "tok/s": fmt(s["tokens_per_s"], 3) + (" (graphs)" if (s.get("graph_decode_share") or 0) >= 0.5 else ""),
        "items/s": fmt(s.get("items_per_s_steady") or s.get("items_per_s"), 3),  # one-time costs are no item's
        "TTFT s": fmt(s.get("ttft_s_median"), 3),
        "TPOT ms": fmt(s["tpot_s_median"] * 1000 if s.get("tpot_s_median") is not None else None, 3),
        "kernel steps": percent(s.get("kernel_step_share")),
        "peak memory": peak_memory(s),
        "device": s["device"],
        "commit": (r["environment"]["git_commit"] or "–")[:8] + (" (stale)" if r.get("_stale") else ""),
    }


def fp_tokens(method: dict[str, Any]) -> str:
    """The tokens a method keeps in full precision beside its codes: 'all' for BF16, 'S + W' with S sink tokens
    (the prompt's first) and a window of the W newest, 'W' without sinks, '–' for a method with neither setting. A
    method keeping more exact tokens has an easier task, so the tables never compare budgets silently."""
    config = method["config"]
    if config.get("method") == "bf16":
        return "all"
    window, sink = config.get("residual_length"), config.get("sink_tokens") or 0
    if window is None:
        return "–"
    return f"{sink} + {window}" if sink else str(window)


def partial_tag(r: dict[str, Any]) -> str:
    """' (first N of M)' for a run over the first N items of a set of M (--limit), else ''."""
    n, total = r["task"]["n_items"], r["task"].get("n_total")
    return f" (first {n} of {total})" if total and n < total else ""


def stale_note(runs: list[dict[str, Any]]) -> str:
    """One sentence naming the table's stale runs, grouped by reason."""
    by_reason: dict[str, list[str]] = {}
    for r in runs:
        for reason in r.get("_stale") or []:
            by_reason.setdefault(reason, []).append(r["method"]["name"] + partial_tag(r))
    if not by_reason:
        return ""
    parts = [
        f"{', '.join(names) if len(names) < len(runs) else 'all'}: {reason}" for reason, names in by_reason.items()
    ]
    return "Stale, not what this code computes (`make eval ... OPTS=--force` reruns one): " + " · ".join(parts) + "."


# shown where a result records them
OPTIONAL_COLUMNS = ("items/s", "TTFT s", "TPOT ms", "kernel steps", SAME_TOKENS, FIRST_DIVERGENCE)


def metric_cell(m: dict[str, Any]) -> str:
    """'0.81 [0.78, 0.84]': the value and its interval, the interval over clusters of items where the result has one
    (marked ᶜ), else over items."""
    clustered = m.get("clustered") or {}
    if clustered.get("ci_low") is not None:
        return f"{fmt(m['value'])} [{fmt(clustered['ci_low'])}, {fmt(clustered['ci_high'])}]ᶜ"
    ci = f" [{fmt(m['ci_low'])}, {fmt(m['ci_high'])}]" if m.get("ci_low") is not None else ""
    return f"{fmt(m['value'])}{ci}"


def agreement_cells(reference: dict[str, Any] | None, r: dict[str, Any]) -> dict[str, str]:
    """The share of items whose generated tokens equal BF16's and the mean first divergent step
    (harness.stats.token_agreement), against the table's BF16 run of the same task version and data; '–' where
    there is none, for BF16 itself, for tasks that generate nothing and for older results without tokens (no step)."""
    cells = {SAME_TOKENS: "–", FIRST_DIVERGENCE: "–"}
    same_items = reference is not None and all(
        reference["task"][k] == r["task"][k] for k in ("name", "version", "data_fingerprint")
    )
    if r is reference or not same_items:
        return cells
    agreement = stats.token_agreement(reference["samples"], r["samples"])
    if agreement is not None:
        cells[SAME_TOKENS] = f"{percent(agreement['share'])} of {agreement['n']}"
        cells[FIRST_DIVERGENCE] = fmt(agreement["mean_first"], 3)
    return cells


def percent(share: float | None) -> str:
    return "–" if share is None else f"{100 * share:.0f}%"


def metric_header(runs: list[dict[str, Any]], name: str = "") -> str:
    """'wer ↓ (95% CI)' for metric `name` (default: the primary one), as the first run that has it records it."""
    name = name or runs[0]["primary_metric"]
    r = next(r for r in runs if name in r["metrics"])
    arrow = "↑" if r["metrics"][name]["higher_is_better"] else "↓"
    return f"{name} {arrow} (95% CI)"


def result_table(key, runs: list[dict[str, Any]], pipeline_check: bool = False) -> Table:
    ref = reference_run(runs)
    rows = [run_row(r, ref, with_metric=not pipeline_check) for r in runs]
    empty = {c for c in OPTIONAL_COLUMNS if all(row.get(c, "–") == "–" for row in rows)}
    keys = [k for k in columns(rows) if k not in empty]
    header = [metric_header(runs, k.partition(":")[2]) if k.startswith("metric") else k for k in keys]
    return Table(
        group_title(key, runs),
        header,
        [[row.get(k, "–") for k in keys] for row in rows],
        [r["_path"] for r in runs],
        note=stale_note(runs),
        nowrap=tuple(i for i, k in enumerate(keys) if k.startswith("metric")),
    )


def columns(rows: list[dict[str, str]]) -> list[str]:
    """The first row's columns, with a metric only later rows have (a run of newer code) after the other metrics."""
    keys = list(rows[0])
    for row in rows[1:]:
        for k in row:
            if k not in keys:
                at = max((i for i, c in enumerate(keys) if c.startswith("metric")), default=len(keys) - 1)
                keys.insert(at + 1 if k.startswith("metric") else len(keys), k)
    return keys


PAIRED_AGAINST = ("bf16", "oscar")  # the references of the paired tests: the full-precision cache and OScaR


DISTRIBUTION_METRICS = ("kl", "kl_p99", "top1")  # ppl's distance to BF16's next-token distribution


def paired_metrics(r: dict[str, Any]) -> list[str]:
    """The metrics a paired table tests: the primary one, the NLL where the primary metric is not a function of it
    (asr's WER: the reference transcript's log-likelihood is the more sensitive measure), and the KL to BF16, its
    99th percentile and the top-1 agreement where the result has them (ppl)."""
    primary = r["primary_metric"]
    nll = ["nll"] if "nll" in r["metrics"] and primary not in ("ppl", "nll") else []
    return [primary] + nll + [m for m in DISTRIBUTION_METRICS if m in r["metrics"]]


def paired_cells(
    reference: dict[str, Any], r: dict[str, Any], metrics: list[str], shared: dict | None = None
) -> list[str]:
    """'+0.21 (0.22)' per metric: the paired bootstrap difference r - reference over the items both hold, with its
    p-value (oscar-eval compare's test of the total); '–' for the reference itself or runs over other items."""
    from harness.report.compare import CompareError, paired_totals

    if r is reference:
        return ["–"] * len(metrics)
    try:
        totals = paired_totals(
            reference, r, [m for m in metrics if m in reference["metrics"]], stats.DEFAULT_RESAMPLES, 0, shared
        )
    except CompareError:
        return ["–"] * len(metrics)
    return [difference_cell(totals.get(m)) for m in metrics]


def difference_cell(t) -> str:
    """'+0.21 (0.22)': a paired difference and its p-value (harness.stats.PairedResult)."""
    if t is None or t.delta is None:
        return "–"
    return f"{signed(t.delta)} ({'–' if t.p_value is None else fmt(t.p_value, 2)})"


def paired_table(title: str, runs: list[dict[str, Any]]) -> Table | None:
    """Each run against BF16 and against OScaR of the same group, per paired metric (the tests of `oscar-eval
    compare`); None when the group holds neither reference or a single run."""
    refs = [(name, next((r for r in runs if r["method"]["name"] == name), None)) for name in PAIRED_AGAINST]
    refs = [(name, ref) for name, ref in refs if ref is not None]
    if not refs or len(runs) < 2:
        return None
    metrics = list(dict.fromkeys(m for r in runs for m in paired_metrics(r)))
    header = ["method"] + [f"{m} vs {name}" for m in metrics for name, _ in refs]
    shared: dict = {}  # each run's bootstrap draws, aggregated once for both references and every metric
    rows = []
    for r in runs:
        cells = {name: paired_cells(ref, r, metrics, shared) for name, ref in refs}
        rows.append(
            [r["method"]["name"] + partial_tag(r)] + [cells[name][i] for i in range(len(metrics)) for name, _ in refs]
        )
    nowrap = tuple(range(1, len(header)))  # every test's cell: a difference and its p-value
    # rows without data-run: the page keeps one data-run row per result file
    return Table(f"Paired tests: {title}", header, rows, note=PAIRED_NOTE, nowrap=nowrap)


HEADLINE_METHODS = ("bf16", "kivi", "quarot", "rotatekv", "ott", "turboquant", "oscar")  # the paper's comparison
HEADLINE_AGAINST = ("bf16", "kivi")  # the full-precision cache, and the 2-bit cache every other method improves on
SIGNIFICANT = 0.05  # a headline verdict says better or worse only below this p-value


def headline_table(ordered: list[tuple[tuple[str, str, str], list[dict[str, Any]]]]) -> Table | None:
    """One table for the README: each model of trained weights in its first table of the reading order (ordered:
    (key, runs) sorted by reading_rank) and its needle test where it has one, the methods the paper compares, with
    quality, how close each stays to BF16's outputs, KV size and the paired verdict against BF16 and against KIVI.
    The full tables, ablations and variants stay in LEADERBOARD.md; None without a model that has two such
    methods."""
    rows = []
    for key, runs in headline_groups(ordered):
        shown = [r for r in runs if r["method"]["name"] in HEADLINE_METHODS]
        if len(shown) < 2:
            continue
        refs = [next((r for r in runs if r["method"]["name"] == name), None) for name in HEADLINE_AGAINST]
        bf16 = reference_run(runs)
        metric, kv_ref = runs[0]["primary_metric"], bf16["system"]["kv_bytes"]["total"] if bf16 else None
        shared: dict = {}  # each run's bootstrap draws, aggregated once for both references
        for i, r in enumerate(shown):
            kv = r["system"]["kv_bytes"]["total"]
            rows.append(
                [
                    group_title(key, runs) if i == 0 else "",
                    metric_header(runs).removesuffix(" (95% CI)") if i == 0 else "",
                    r["method"]["name"] + partial_tag(r) + (" (stale)" if r.get("_stale") else ""),
                    metric_cell(r["metrics"][metric]) if metric in r["metrics"] else "–",
                    closeness_cell(bf16, r),
                    fmt(kv / 1024 if kv is not None else None, 4),
                    f"{kv_ref / kv:.2f}x" if kv and kv_ref else "–",
                ]
                + [verdict(ref, r, metric, shared) for ref in refs]
            )
    if not rows:
        return None
    header = ["model · task", "metric", "method", "value (95% CI)", "as bf16", "KV KiB/item", "KV vs bf16"]
    header += [f"vs {name}" for name in HEADLINE_AGAINST]
    nowrap = (header.index("value (95% CI)"), *range(len(header) - len(HEADLINE_AGAINST), len(header)))
    return Table("Headline: the real models against BF16 and KIVI", header, rows, note=HEADLINE_NOTE, nowrap=nowrap)


def closeness_cell(bf16: dict[str, Any] | None, r: dict[str, Any]) -> str:
    """How close a method stays to BF16's own outputs: 'KL 0.11 · top-1 83%' where the result has the distribution
    metrics (ppl), else the share of items whose generated tokens equal BF16's ('same 45% of 40'); '–' for BF16
    itself and where neither exists."""
    if r is bf16:
        return "–"
    m = r["metrics"]
    if "kl" in m and "top1" in m:
        return f"KL {fmt(m['kl']['value'], 3)} · top-1 {percent(m['top1']['value'])}"
    same = agreement_cells(bf16, r)[SAME_TOKENS]
    return "–" if same == "–" else f"same {same}"


def headline_groups(ordered: list[tuple[tuple[str, str, str], list[dict[str, Any]]]]) -> list:
    """(key, runs) of each model's first table in `ordered` (the most decisive it has) and of its first needle test
    (niah-*) when that is not the same table: the paper's two claims on text, quality and retrieval."""
    seen: set[tuple[str, bool]] = set()
    out = []
    for key, runs in ordered:
        needle = key[0].startswith("niah-")
        if (key[2], False) not in seen:
            seen.add((key[2], False))
            seen.add((key[2], needle))
            out.append((key, runs))
        elif needle and (key[2], True) not in seen:
            seen.add((key[2], True))
            out.append((key, runs))
    first = {}
    for key, _ in out:
        first.setdefault(key[2], len(first))
    return sorted(out, key=lambda kr: first[kr[0][2]])  # each model's two together, in the reading order


def verdict(reference: dict[str, Any] | None, r: dict[str, Any], metric: str, shared: dict) -> str:
    """'worse +1.26 (0.002)': the paired test of `metric` (r - reference over the items both hold, as the paired
    tables), named better or worse where p < SIGNIFICANT, else n.s.; '–' for the reference itself, a missing
    reference or runs over other items."""
    from harness.report.compare import CompareError, paired_totals

    if reference is None or r is reference:
        return "–"
    try:
        t = paired_totals(reference, r, [metric], stats.DEFAULT_RESAMPLES, 0, shared)[metric]
    except CompareError:
        return "–"
    if t.delta is None:
        return "–"
    if t.p_value is None or t.p_value >= SIGNIFICANT or t.delta == 0:
        word = "n.s."
    else:
        word = "better" if (t.delta > 0) == r["metrics"][metric]["higher_is_better"] else "worse"
    return f"{word} {difference_cell(t)}"


def paper_tables(paper: dict[str, Any]) -> list[Table]:
    """One table per published benchmark."""
    out = []
    for bench in paper.get("benchmarks", []):
        labels = bench.get("method_labels", {})
        sub = bool(bench.get("submetrics"))
        header = ["model"] + (["metric"] if sub else []) + [labels.get(m, m) for m in bench["methods"]]
        rows = [
            [row["model"]] + ([row["submetric"]] if sub else []) + [fmt(row["values"].get(m)) for m in bench["methods"]]
            for row in bench["rows"]
        ]
        out.append(Table(f"{bench['task']} — {bench['metric']} (published)", header, rows))
    return out


PAIRED_NOTE = (
    "Each cell: the method's value minus the reference's over the items both hold, and in brackets the two-sided "
    "p-value of a paired bootstrap over items (1,000 resamples: 0.002 is the smallest it shows); "
    "`oscar-eval compare <reference> <method>` prints the same test with its interval."
)
HEADLINE_NOTE = (
    "Each model's first table of results/LEADERBOARD.md and its needle test, the methods the paper compares. value: "
    "the primary metric and its 95% bootstrap interval; as bf16: how close the method stays to BF16's own outputs, "
    "the mean KL(BF16 || method) per scored token in nats and the share of tokens whose most likely next token is "
    "BF16's (perplexity), or the share of items whose generated tokens equal BF16's (generating tasks); KV: the "
    "cache's bytes per item and BF16's over the method's; vs bf16, vs kivi: "
    "the paired bootstrap test over the items both hold (`oscar-eval compare`), the method's value minus the "
    "reference's and in brackets its p-value, called better or worse where p < 0.05 and n.s. (not separated) "
    "otherwise; (stale): computed by older code, LEADERBOARD.md says what changed."
)


# ---------------------------------------------------------------- markdown


def md_table(t: Table) -> str:
    """The table in markdown, the spaces of its nowrap columns non-breaking."""
    rows = [[c.replace(" ", NBSP) if i in t.nowrap else c for i, c in enumerate(row)] for row in t.rows]
    esc = [[c.replace("|", "\\|") for c in row] for row in [t.header] + rows]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "|".join("---" for _ in t.header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in esc[1:]])
