"""`oscar-eval leaderboard`: markdown and HTML tables built only from result files and the bench references.

Inputs: every result file under results/runs/ (validated; an invalid file stops the build with its name), the paper's
published numbers in results/paper.json (their own tables, marked published, never merged with measured rows) and the
reference `make bench` JSON of each GPU kind, results/bench/<gpu-kind>.json.
Outputs: results/LEADERBOARD.md, the README's results section (the text between README_START and README_END is
replaced by the short markdown: the headline table and links to the full tables) and
results/leaderboard/index.html (harness.report_html; built, not committed).

Order, for a reader: the headline (each real model's first table, in one); measured results of trained weights, the
tables that separate methods first (reading_rank); speed and memory of each GPU kind; published numbers; then,
collapsed, the pipeline checks: results of models without trained weights (tiny replicas, or real shapes with random
weights), which show that the code path runs, how fast and in how much memory, never how accurate a method is.
Numbers are written plain (fmt: never an exponent), and a value with its interval or a difference with its p-value is
one unbreakable cell (Table.nowrap: non-breaking spaces in the markdown, nowrap on the page).
The kernel targets (met or missed) are a developer's gate, not a result: `oscar-eval bench-check` reads them, this page
does not show them. Bench runs (`oscar-eval bench` writes them to the git-ignored results/bench/runs/) are never read.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from harness import eval_cost, stats
from harness import results as R
from harness.bench import check as bench_check

# Display order of the presets (quant.list_methods()); unknown names follow alphabetically.
METHOD_ORDER = (
    "bf16",
    "kivi",
    "quarot",
    "rotatekv",
    "ott",
    "turboquant",
    "oscar",
    "oscar-rotation-only",
    "oscar-scaling-only",
)
README_START = "<!-- leaderboard:start -->"
README_END = "<!-- leaderboard:end -->"
GiB = 2**30
SAME_TOKENS, FIRST_DIVERGENCE = "same tokens as bf16", "1st divergence"  # generation agreement columns
NBSP = "\u00a0"  # the markdown's spaces in a Table.nowrap column: a renderer never wraps the cell there

Group = dict[tuple[str, str, str], list[dict[str, Any]]]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", default=str(R.RUNS_DIR))
    p.add_argument("--paper", default="results/paper.json")
    p.add_argument("--bench-dir", default="results/bench", help="one reference bench JSON per GPU kind: <kind>.json")
    p.add_argument("--markdown", default="results/LEADERBOARD.md")
    p.add_argument("--html", default="results/leaderboard/index.html")
    p.add_argument("--readme", default="README.md", help="README to update between the leaderboard markers")


def main(args: argparse.Namespace) -> int:
    try:
        runs = load_runs(Path(args.runs_dir))
        paper = load_json(Path(args.paper)) if Path(args.paper).exists() else None
        bench = load_bench(Path(args.bench_dir))
    except (R.ResultFileError, ValueError) as err:
        print(f"oscar-eval leaderboard: error: {err}", file=sys.stderr)
        return 2
    board = build_board(runs, paper, bench)
    md = markdown(board)
    Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
    Path(args.markdown).write_text(md, encoding="utf-8")
    updated = update_readme(Path(args.readme), markdown(board, short=True))
    from harness import report_html

    html_path = report_html.write(Path(args.html), board)
    print(
        f"{len(runs)} result files, {len(bench)} bench reference(s) -> {args.markdown}, {html_path}"
        + (f", {args.readme} (results section)" if updated else f" ({args.readme} has no {README_START} marker)")
    )
    return 0


# ---------------------------------------------------------------- inputs


def load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def load_runs(runs_dir: Path) -> list[dict[str, Any]]:
    """Every result under runs_dir, validated, each with its path (relative when possible) in '_path'."""
    out = []
    for path in R.find_results(runs_dir):
        result = R.read_result(path)
        result["_path"] = str(path)
        out.append(result)
    return out


def load_bench(bench_dir: Path) -> dict[str, dict[str, Any]]:
    """{GPU kind: its reference bench JSON (harness.bench's format), with the file's path in '_path'} for every
    <kind>.json directly under bench_dir (harness.bench.check.reference_paths: never a bench run). A file that is not
    a bench result, a bench run's file, or a second reference of one GPU stops the build with the names."""
    out: dict[str, dict[str, Any]] = {}
    by_device: dict[str, Path] = {}
    for path in bench_check.reference_paths(bench_dir):
        data = bench_check.load(path)
        device = (data.get("environment") or {}).get("device")
        if device and device in by_device:
            raise bench_check.BenchFileError(
                f"{by_device[device]} and {path}: two bench references of one GPU ({device}); keep one "
                f"<gpu-kind>.json per GPU kind (bench runs belong in {bench_dir}/runs/)"
            )
        by_device.setdefault(device, path)
        data["_path"] = str(path)
        out[path.stem] = data
    return out


# ---------------------------------------------------------------- grouping


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


def method_rank(name: str) -> tuple[int, str]:
    return (METHOD_ORDER.index(name), "") if name in METHOD_ORDER else (len(METHOD_ORDER), name)


def group_runs(runs: list[dict[str, Any]]) -> tuple[Group, Group]:
    """({(task, data, model): runs} of trained weights, the same of pipeline checks), groups by task then model,
    runs by method."""
    real: Group = {}
    checks: Group = {}
    for r in runs:
        groups = checks if is_pipeline_check(r) else real
        groups.setdefault((result_set(r), r["task"]["data"], r["model"]["name"]), []).append(r)
    return _by_method(real), _by_method(checks)


def result_set(r: dict[str, Any]) -> str:
    """The folder a result sits in under results/runs (its task, or a named setting such as ppl-own-paper: each
    method as its own paper runs it, never in one table with the paper comparison)."""
    parts = Path(r.get("_path", "")).parts
    return parts[-3].split(".")[0] if len(parts) >= 3 else r["task"]["name"]


def _by_method(groups: Group) -> Group:
    return {k: sorted(groups[k], key=lambda r: method_rank(r["method"]["name"])) for k in sorted(groups)}


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


@dataclass
class Speed:
    """One GPU kind's bench reference as tables, and the data its plots draw."""

    gpu: str
    data: dict[str, Any]
    e2e: Table | None
    kernels: Table | None


@dataclass
class Board:
    """What the markdown and the HTML page show, in their order (harness.report_html draws from it)."""

    n_files: int
    results: list[tuple[Table, list[dict[str, Any]]]]  # trained weights: a table and its runs per group
    speed: list[Speed]
    source: str | None  # of the published numbers
    published: list[tuple[Table, dict[str, Any]]]  # a table and its benchmark in paper.json
    checks: list[Table]  # pipeline checks
    methods: list[str]  # every method shown, in display order (one colour each on the page)
    intro: str = ""
    checks_title: str = ""
    costs: list[Table] = field(default_factory=list)  # whole benchmarks at real size, extrapolated (eval_cost)
    paired: dict[str, Table] = field(default_factory=dict)  # result table title -> its paired tests (paired_table)
    headline: Table | None = None  # each real model's first table in one (headline_table)
    niah_at: int = 0  # how many result tables come before the needle-in-a-haystack summaries (report_niah)


def build_board(runs: list[dict[str, Any]], paper: dict[str, Any] | None, bench: dict[str, dict[str, Any]]) -> Board:
    mark_stale(runs)
    real, checks = group_runs(runs)
    speed = [Speed(gpu, data, e2e_table(gpu, data), kernel_table(gpu, data)) for gpu, data in bench.items()]
    published = list(zip(paper_tables(paper), paper.get("benchmarks", []))) if paper else []
    methods = sorted({r["method"]["name"] for r in runs}, key=method_rank)
    n_checks = sum(len(g) for g in checks.values())
    costs = [
        Table(
            f"{task} · {model} · {gpu}",
            eval_cost.HEADER,
            rows,
            note=COST_NOTE.format(n=eval_cost.BENCHMARK_ITEMS[task]),
        )
        for (task, model, gpu), rows in sorted(eval_cost.cost_rows(runs).items())
    ]
    ordered = sorted(real.items(), key=lambda kv: reading_rank(*kv))
    results = [(result_table(k, g), g) for k, g in ordered]
    paired = {t.title: p for t, g in results if (p := paired_table(t.title, g)) is not None}
    return Board(
        len(runs),
        results,
        speed,
        paper["source"] if paper else None,
        published,
        [result_table(k, g, pipeline_check=True) for k, g in checks.items()],
        methods,
        INTRO.format(n=len(runs)),
        CHECKS_TITLE.format(n=n_checks),
        costs,
        paired,
        headline_table(ordered),
        sum(1 for k, g in ordered if reading_rank(k, g) <= NIAH_RANK),
    )


NIAH_RANK = 1  # reading_rank of the needle-in-a-haystack tables: their summaries follow them


def reading_rank(key: tuple[str, str, str], runs: list[dict[str, Any]]) -> int:
    """Where a table of trained weights comes in the reading order (ties by task, data, model). First the tables that
    tell methods apart: perplexity with the KL to BF16 and the top-1 agreement (small differences in the next-token
    distribution show there long before they move a score), then the needle tests (retrieval that a lossy key cache
    breaks); then the other text and multimodal tasks; each method's own-paper setting (a different experiment); last
    asr, where Whisper's short decodes leave every method inside the intervals."""
    task = key[0]
    if any(m in r["metrics"] for r in runs for m in DISTRIBUTION_METRICS):
        return 0
    if task.startswith("niah-"):
        return NIAH_RANK
    if task.endswith("-own-paper"):
        return 3
    return 4 if task == "asr" else 2


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
        "items/s": fmt(s.get("items_per_s"), 3),
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


def mark_stale(runs: list[dict[str, Any]]) -> None:
    """Put each run's harness.provenance.stale_reasons in '_stale' (empty when the run is what this checkout
    computes)."""
    from harness import provenance

    for r in runs:
        r["_stale"] = provenance.stale_reasons(r)


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


OPTIONAL_COLUMNS = ("items/s", "kernel steps", SAME_TOKENS, FIRST_DIVERGENCE)  # shown where a result records them


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
    from harness.compare import CompareError, paired_totals

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
    (key, runs) sorted by reading_rank), the methods the paper compares, with quality, KV size and the paired verdict
    against BF16 and against KIVI. The full tables, ablations and variants stay in LEADERBOARD.md; None without a
    model that has two such methods."""
    rows = []
    for key, runs in first_table_per_model(ordered):
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
                    fmt(kv / 1024 if kv is not None else None, 4),
                    f"{kv_ref / kv:.2f}x" if kv and kv_ref else "–",
                ]
                + [verdict(ref, r, metric, shared) for ref in refs]
            )
    if not rows:
        return None
    header = ["model · task", "metric", "method", "value (95% CI)", "KV KiB/item", "KV vs bf16"]
    header += [f"vs {name}" for name in HEADLINE_AGAINST]
    nowrap = (header.index("value (95% CI)"), *range(len(header) - len(HEADLINE_AGAINST), len(header)))
    return Table("Headline: the real models against BF16 and KIVI", header, rows, note=HEADLINE_NOTE, nowrap=nowrap)


def first_table_per_model(ordered: list[tuple[tuple[str, str, str], list[dict[str, Any]]]]) -> list:
    """(key, runs) of each model's first table in `ordered`: one table a model, the most decisive it has."""
    seen: set[str] = set()
    out = []
    for key, runs in ordered:
        if key[2] not in seen:
            seen.add(key[2])
            out.append((key, runs))
    return out


def verdict(reference: dict[str, Any] | None, r: dict[str, Any], metric: str, shared: dict) -> str:
    """'worse +1.26 (0.002)': the paired test of `metric` (r - reference over the items both hold, as the paired
    tables), named better or worse where p < SIGNIFICANT, else n.s.; '–' for the reference itself, a missing
    reference or runs over other items."""
    from harness.compare import CompareError, paired_totals

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


# ---------------------------------------------------------------- speed and memory tables (bench references)


def e2e_table(gpu: str, data: dict[str, Any]) -> Table | None:
    """The end-to-end decode of the bench's Qwen3-8B-shaped model (random weights: speed and memory do not depend on
    their values), BF16 against OScaR per batch and context: graph step, tokens/s, KV cache and peak GPU memory."""
    e2e = [r for r in data.get("e2e") or [] if "error" not in r]
    pairs = {}
    for r in e2e:
        pairs.setdefault((bool(r.get("largest")), r.get("context")), {})[r["kind"]] = r
    rows = []
    for (largest, ctx), by in sorted(pairs.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        bf, oq = by.get("bf16"), by.get("oscar")
        if not (bf and oq):
            continue
        tps = [r.get("graph_tokens_per_s", r.get("tokens_per_s")) for r in (bf, oq)]
        rows.append(
            [
                f"{ctx // 1024}K" + (" (largest batch that fits)" if largest else ""),
                f"{bf['batch']} / {oq['batch']}",
                fmt(bf.get("graph_step_ms"), 3),
                fmt(oq.get("graph_step_ms"), 3),
                fmt(tps[0], 3),
                fmt(tps[1], 3),
                ratio_text(bench_check.ratio(tps[1], tps[0])),
                gib(bf.get("kv_bytes")),
                gib(oq.get("kv_bytes")),
                gib(bf.get("peak_bytes")),
                gib(oq.get("peak_bytes")),
            ]
        )
    if not rows:
        return None
    header = [
        "context",
        "batch BF16 / OScaR",
        "step ms BF16",
        "step ms OScaR",
        "tok/s BF16",
        "tok/s OScaR",
        "tok/s ratio",
        "KV GiB BF16",
        "KV GiB OScaR",
        "peak GiB BF16",
        "peak GiB OScaR",
    ]
    device = (data.get("environment") or {}).get("device", gpu)
    return Table(
        f"Decode end to end, Qwen3-8B shape, {device}",
        header,
        rows,
        note=f"{data['_path']}: CUDA graph replays of one decode step over a filled cache; peak: the GPU's.",
    )


def ratio_text(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}x"


def gib(n: Any) -> str:
    x = bench_check.num(n)
    return fmt(x / GiB if x is not None else None, 3)


KERNEL_COLUMNS = {
    "oscar_cuda_graph_us": "OScaR CUDA",
    "oscar_cuda_graph_clean_us": "OScaR CUDA, clean L2",
    "oscar_triton_graph_us": "OScaR Triton",
    "best_bf16_graph_us": "best BF16",
    "best_bf16_graph_clean_us": "best BF16, clean L2",
    "speedup_cuda_graph": "speedup",
    "floor_read_us": "read floor",
    "floor_read_clean_us": "read floor, clean L2",
}
SHAPE_ORDER = ("qwen3-8b", "llava-7b", "qwen3-omni-thinker")


def kernel_table(gpu: str, data: dict[str, Any]) -> Table | None:
    """Decode attention per point (shape, batch, context): CUDA graph replay times in us, a column per
    KERNEL_COLUMNS."""
    points = [k for k in data.get("kernels") or [] if "error" not in k]
    points.sort(key=lambda k: (shape_rank(k.get("shape")), k.get("batch", 0), k.get("context", 0)))
    rows = [
        [str(k.get("shape")), str(k.get("batch")), str(k.get("context"))]
        + [fmt(bench_check.num(k.get(key)), 3) for key in KERNEL_COLUMNS]
        for k in points
    ]
    if not rows:
        return None
    return Table(
        f"Decode attention, us, {(data.get('environment') or {}).get('device', gpu)}",
        ["shape", "batch", "context", *KERNEL_COLUMNS.values()],
        rows,
        note="CUDA graph replays after do_bench's L2 flush, or after a read-only flush (clean L2: what a "
        "model's decode step sees); speedup: best BF16 / OScaR CUDA; read floor: a bare stream of the "
        "same packed bytes, what no decode goes below.",
    )


def shape_rank(shape: str | None) -> tuple[int, str]:
    return (SHAPE_ORDER.index(shape), "") if shape in SHAPE_ORDER else (len(SHAPE_ORDER), str(shape))


# ---------------------------------------------------------------- markdown


def md_table(t: Table) -> str:
    """The table in markdown, the spaces of its nowrap columns non-breaking."""
    rows = [[c.replace(" ", NBSP) if i in t.nowrap else c for i, c in enumerate(row)] for row in t.rows]
    esc = [[c.replace("|", "\\|") for c in row] for row in [t.header] + rows]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "|".join("---" for _ in t.header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in esc[1:]])


def markdown(board: Board, short: bool = False) -> str:
    """results/LEADERBOARD.md; short: the README's section, the headline table and links to the full tables (the
    README is a manual: it shows the verdict and leaves the tables to LEADERBOARD.md and the HTML page)."""
    h = board.headline
    headline = [f"### {h.title}\n\n{md_table(h)}\n\n{h.note}"] if h else []
    if short:
        more = README_MORE.format(n=sum(len(t.rows) for t in board.checks))
        return "\n\n".join((headline or [NO_RESULTS]) + [more]) + "\n"
    parts = [board.intro] + headline
    if not board.results:
        parts.append(NO_RESULTS)
    for i, (t, _) in enumerate(board.results):
        if i == board.niah_at:
            parts += niah_sections(board)
        parts.append(f"### {t.title}\n\n{md_table(t)}" + (f"\n\n{t.note}" if t.note else ""))
        if t.title in board.paired:
            p = board.paired[t.title]
            parts.append(f"#### {p.title}\n\n{md_table(p)}\n\n{p.note}")
    if board.niah_at >= len(board.results):
        parts += niah_sections(board)
    parts += [f"### Speed and memory: {s.e2e.title}\n\n{md_table(s.e2e)}\n\n{s.e2e.note}" for s in board.speed if s.e2e]
    parts += [f"### What a whole benchmark costs: {t.title}\n\n{md_table(t)}\n\n{t.note}" for t in board.costs]
    if board.published:
        parts.append(f"### Published numbers (not measured here)\n\nSource: {board.source}.")
        parts += [f"#### {t.title}\n\n" + md_table(t) for t, _ in board.published]
    if board.checks:
        tables = "\n\n".join(
            f"#### {t.title}\n\n{md_table(t)}" + (f"\n\n{t.note}" if t.note else "") for t in board.checks
        )
        parts.append(f"<details><summary>{board.checks_title}</summary>\n\n{tables}\n\n</details>")
    return "\n\n".join(parts) + "\n"


def niah_sections(board: Board) -> list[str]:
    """Each model's needle-in-a-haystack tables by context length and depth (harness.report_niah), placed right after
    the needle tests' result tables."""
    from harness import report_niah

    return report_niah.markdown_sections(board)


INTRO = (
    "Built by `make leaderboard` from {n} result files under `results/runs/` and the bench reference of each GPU "
    "kind under `results/bench/`. Intervals: percentile bootstrap over items, or over clusters of items (ᶜ: "
    "OCRBench's source datasets, MMAU-Pro's audio clips, NIAH's haystacks) where the items have them; failed: items "
    "that ended in an error. ppl: kl, the mean KL(BF16 || method) in nats per scored token over the whole "
    "vocabulary, kl_p99 its 99th percentile, top1 the share of tokens whose most likely next token is BF16's. "
    "Generating tasks: same tokens, the items whose generated tokens equal BF16's; 1st divergence, the mean number "
    "of the first token that differs (1: the first generated) over the items that differ."
)
PAIRED_NOTE = (
    "Each cell: the method's value minus the reference's over the items both hold, and in brackets the two-sided "
    "p-value of a paired bootstrap over items (1,000 resamples: 0.002 is the smallest it shows); "
    "`oscar-eval compare <reference> <method>` prints the same test with its interval."
)
NO_RESULTS = "No results of trained weights yet: `make eval MODEL=<model> QUANT=<method>` writes one."
README_MORE = (
    "The full tables: [results/LEADERBOARD.md](results/LEADERBOARD.md), every result of trained weights with its "
    "interval and the paired tests of each table (against BF16 and against OScaR), the ablations, the needle tests "
    "by context length and depth, speed and memory of each GPU, the paper's published numbers and {n} pipeline "
    "checks (models without trained weights); `make leaderboard` also writes the same as a page with plots, "
    "[results/leaderboard/index.html](results/leaderboard/index.html) (built, not committed)."
)
HEADLINE_NOTE = (
    "Each model's first table of results/LEADERBOARD.md, the methods the paper compares. value: the primary metric "
    "and its 95% bootstrap interval; KV: the cache's bytes per item and BF16's over the method's; vs bf16, vs kivi: "
    "the paired bootstrap test over the items both hold (`oscar-eval compare`), the method's value minus the "
    "reference's and in brackets its p-value, called better or worse where p < 0.05 and n.s. (not separated) "
    "otherwise; (stale): computed by older code, LEADERBOARD.md says what changed."
)

COST_NOTE = (
    "Extrapolated to the benchmark's {n} items from the measured items of a real-size model with random "
    "weights (speed and memory do not depend on the weights' values, but random weights never stop early: "
    "every item decodes its whole token budget, so the hours are an upper bound); decode: the path the steps "
    "took."
)

CHECKS_TITLE = (
    "Pipeline checks: {n} results of models without trained weights (tiny replicas or random weights): "
    "they show that the code path runs, its speed and memory, not accuracy"
)


def update_readme(readme: Path, md: str) -> bool:
    """Replace the text between README_START and README_END; False when the README lacks them."""
    if not readme.exists():
        return False
    text = readme.read_text(encoding="utf-8")
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        return False
    new = text[: start + len(README_START)] + "\n" + md + text[end:]
    readme.write_text(new, encoding="utf-8")
    return True
