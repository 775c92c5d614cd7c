"""`oscar-eval compare A B`: paired comparison of two runs of the same task and data.

A and B are result files, method names (resolved to results/runs/<task>/<model>/<method>.json with
--model/--task, or found when only one run directory has both), or `baseline:<method>` for a stored
baseline under results/baselines/ (a result file copied there on purpose).

Reports, for the chosen metric (default: A's primary metric), delta = B - A in total and per category
with paired-bootstrap intervals and p-values (items matched by id, the task's own aggregate as the
statistic), McNemar's exact test and the items that flipped when per-item scores are 0/1, or the
largest per-item changes otherwise; for tasks that generate, the share of items whose generated tokens are equal and
the mean first divergent step over the others (harness.stats.token_agreement).

The gate, on by default: exit 1 when B is worse than A by more than the allowed drop (--max-drop, default 0:
absolute in metric units, or relative with a % suffix; "worse" follows the metric's direction) and the paired
bootstrap's p-value of the total is below --alpha (default 0.05), so a significant regression fails and noise does
not. --alpha 1 fails on any drop beyond --max-drop. Exit 0 otherwise; 2 = bad input or incompatible runs
(different task, task version or data), with the reason.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

from harness import results as R
from harness import stats

BASELINES_DIR = Path("results") / "baselines"
ALPHA = 0.05  # the gate's significance level


class CompareError(ValueError):
    """The inputs cannot be compared; the message says why and what to pass instead."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="reference: result file, method name, or baseline:<method>")
    p.add_argument("b", help="candidate: result file, method name, or baseline:<method>")
    p.add_argument("--model", default=None, help="model of method-name inputs")
    p.add_argument("--task", default=None, help="task directory of method-name inputs (e.g. ppl, ocrbench.generated)")
    p.add_argument("--metric", default=None, help="metric to compare and gate on (default: A's primary metric)")
    p.add_argument(
        "--max-drop",
        default="0",
        help="allowed drop: exit 1 when B is worse than A by more than this (0.5 in metric units, or 2%% "
        "of A) and the difference is significant (--alpha); default 0: any significant regression "
        "fails",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=ALPHA,
        help="significance level of the gate (paired bootstrap p-value of the total, default "
        f"{ALPHA}); 1 gates on the drop alone",
    )
    p.add_argument("--resamples", type=int, default=stats.DEFAULT_RESAMPLES)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--show", type=int, default=20, help="how many flipped / changed items to list")
    p.add_argument("--runs-dir", default=str(R.RUNS_DIR))
    p.add_argument("--json", default=None, help="also write the comparison as JSON to this path")


def main(args: argparse.Namespace) -> int:
    try:
        path_a, path_b = resolve_pair(args.a, args.b, args.model, args.task, Path(args.runs_dir))
        a, b = R.read_result(path_a), R.read_result(path_b)
        threshold = parse_threshold(args.max_drop)
        if not 0 < args.alpha <= 1:
            raise CompareError(f"--alpha must be in (0, 1], got {args.alpha}")
        report = compare(a, b, args.metric, args.resamples, args.seed)
    except (CompareError, R.ResultFileError) as err:
        print(f"oscar-eval compare: error: {err}", file=sys.stderr)
        return 2
    report["a"], report["b"] = str(path_a), str(path_b)
    failed, verdict = gate(report, threshold, args.alpha)
    report["gate"] = {"max_drop": args.max_drop, "alpha": args.alpha, "failed": failed, "verdict": verdict}
    print(format_report(report, args.show))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 1 if failed else 0


# Kernel switches that change how fast, not what is computed (graph replay gives the eager bits).
SAME_BITS = {"cuda_graphs"}
# Switches that result files written before them lack, read as the setting those runs had.
ABSENT_MEANS = {"wide_decode": False, "batch_invariant": False}


# ---------------------------------------------------------------- inputs


def resolve_pair(a: str, b: str, model: str | None, task: str | None, runs_dir: Path) -> tuple[Path, Path]:
    """Paths of the two inputs; method names need --model/--task unless exactly one run dir has both."""
    names = [x for x in (a, b) if not _is_path(x) and not x.startswith("baseline:")]
    if names and (model is None or task is None):
        model, task = _find_run_dir(names, model, task, runs_dir)
    elif any(x.startswith("baseline:") for x in (a, b)) and (model is None or task is None):
        raise CompareError("baseline:<method> needs --model and --task (or a run name beside it to infer them)")
    return _resolve_one(a, model, task, runs_dir), _resolve_one(b, model, task, runs_dir)


def _is_path(x: str) -> bool:
    return x.endswith(".json") or "/" in x


def _resolve_one(x: str, model: str | None, task: str | None, runs_dir: Path) -> Path:
    if _is_path(x):
        return Path(x)
    folder = (BASELINES_DIR if x.startswith("baseline:") else runs_dir) / task / model
    name = x.removeprefix("baseline:")
    path = result_of(folder, name)
    if path is None:
        have = sorted(p.stem for p in folder.glob("*.json"))
        raise CompareError(f"no result {folder / name}.json; results there: {', '.join(have) or 'none'}")
    return path


def result_of(folder: Path, name: str) -> Path | None:
    """The result of method `name` in a run folder: <name>.json, else its one run over the first N items
    (<name>.first<N>.json, a --limit run); None when there is neither or more than one partial run."""
    whole = folder / f"{name}.json"
    partial = sorted(folder.glob(f"{name}.first*.json"))
    return whole if whole.exists() else partial[0] if len(partial) == 1 else None


def _find_run_dir(methods: list[str], model: str | None, task: str | None, runs_dir: Path) -> tuple[str, str]:
    dirs = {(p.parent.parent.name, p.parent.name) for p in R.find_results(runs_dir)}
    fits = sorted(
        (t, m)
        for t, m in dirs
        if (task in (None, t)) and (model in (None, m)) and all(result_of(runs_dir / t / m, x) for x in methods)
    )
    if len(fits) != 1:
        listed = ", ".join(f"--task {t} --model {m}" for t, m in fits) or "none"
        raise CompareError(
            f"method names {methods} are ambiguous or not found under {runs_dir}; "
            f"pass --model and --task (candidates: {listed})"
        )
    task, model = fits[0]
    return model, task


def parse_threshold(text: str | None) -> tuple[float, bool] | None:
    """'0.5' -> (0.5, False) absolute; '2%' -> (2.0, True) relative to A; None -> no gate."""
    if text is None:
        return None
    relative = text.strip().endswith("%")
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise CompareError(
            f"--max-drop {text!r} is not a number; use e.g. 0.5 (metric units) or 2% (relative)"
        ) from None
    if value < 0:
        raise CompareError(f"--max-drop must be >= 0, got {text!r}")
    return value, relative


def check_compatible(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Raise CompareError if the runs did not score the same items the same way; return warnings."""
    ta, tb = a["task"], b["task"]
    problems = [
        f"{k}: {ta[k]!r} vs {tb[k]!r}" for k in ("name", "version", "data", "data_fingerprint") if ta[k] != tb[k]
    ]
    if problems:
        raise CompareError(
            "runs are not comparable (" + "; ".join(problems) + "): compare runs of the same task "
            "version on the same data (same --data and --limit), or rerun one of them"
        )
    warnings = []
    if a["model"]["name"] != b["model"]["name"] or a["model"]["weight_hash"] != b["model"]["weight_hash"]:
        warnings.append(f"different models: {a['model']['name']} vs {b['model']['name']}")
    if a["seed"] != b["seed"]:
        warnings.append(f"different seeds: {a['seed']} vs {b['seed']}")
    ca, cb = a["method"]["config"], b["method"]["config"]
    if a["method"]["name"] == b["method"]["name"] and ca != cb:  # e.g. a default that changed between code versions
        keys = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
        diff = ", ".join(f"{k} {ca.get(k)!r} vs {cb.get(k)!r}" for k in keys)
        warnings.append(f"{a['method']['name']} ran with different settings ({diff})")
    where = [processor(r) for r in (a, b)]
    if where[0] != where[1]:  # oneDNN / cuBLAS pick other kernels per processor: last bits move, 2-bit codes flip
        warnings.append(
            f"ran on different processors ({where[0]} vs {where[1]}): the same code and config give "
            "other last bits there, which a 2-bit cache can amplify"
        )
    ka, kb = a["environment"].get("kernels"), b["environment"].get("kernels")  # absent in older result files
    gpus = a["environment"].get("gpu") or b["environment"].get("gpu")
    ka, kb = ({**ABSENT_MEANS, **k} if k is not None else None for k in (ka, kb))
    differ = sorted(
        k
        for k in set(ka or {}) | set(kb or {})
        if k not in SAME_BITS and k != "batch_invariant" and (ka or {}).get(k) != (kb or {}).get(k)
    )  # batch_invariant acts on any processor: batch_warnings
    if gpus and ka is not None and kb is not None and differ:  # they act on a GPU only
        diff = ", ".join(f"{k} {ka.get(k)} vs {kb.get(k)}" for k in differ)
        warnings.append(f"different model-level kernels on the GPU ({diff}): scores can differ in the last bits")
    warnings += batch_warnings(a, b, ka, kb)
    return warnings


def batch_warnings(a: dict[str, Any], b: dict[str, Any], ka, kb) -> list[str]:
    """What the batch may have moved: one run in the batch-invariant mode and one not (on any processor: the mode
    prefills and multiplies otherwise), or two runs of different batch sizes outside it (a padded batch's prefill and
    GEMMs of another size round otherwise, and near-ties flip)."""
    inv = [bool((k or {}).get("batch_invariant")) for k in (ka, kb)]
    if inv[0] != inv[1]:
        return [
            "one run is batch-invariant and the other is not (kernels batch_invariant "
            f"{inv[0]} vs {inv[1]}): their answers differ in the last bits, which a 2-bit cache can amplify"
        ]
    sizes = [r["system"].get("batch_size") for r in (a, b)]
    if not inv[0] and None not in sizes and sizes[0] != sizes[1]:
        return [
            f"BATCH SIZES DIFFER ({sizes[0]} vs {sizes[1]}) outside the batch-invariant mode: answers move with the "
            "batch size, so item changes may be the batch's, not the method's or the code's; rerun both with "
            "--kernels batch_invariant=on (docs/METHODS.md, Batch-invariant decoding)"
        ]
    return []


def processor(result: dict[str, Any]) -> str | None:
    """The processor that computed a result: its GPU when it ran on one, else its CPU."""
    env = result["environment"]
    on_gpu = str(result["system"].get("device", "")).startswith("cuda")
    return env.get("gpu") if on_gpu else env.get("cpu")


# ---------------------------------------------------------------- the comparison


def compare(a: dict[str, Any], b: dict[str, Any], metric: str | None, n_resamples: int, seed: int) -> dict[str, Any]:
    warnings = check_compatible(a, b)
    metric = metric or a["primary_metric"]
    for name, r in (("A", a), ("B", b)):
        if metric not in r["metrics"]:
            raise CompareError(f"metric {metric!r} is not in {name} ({', '.join(r['metrics'])})")
    sa, sb = _paired_samples(a, b)
    statistic = metric_statistic(a["task"]["name"], metric, warnings)
    total = stats.paired_bootstrap(sa, sb, statistic, n_resamples, seed=seed)
    per_category = {}
    for cat in sorted({s.get("category") for s in sa if s.get("category") is not None}):
        idx = [i for i, s in enumerate(sa) if s.get("category") == cat]
        pr = stats.paired_bootstrap([sa[i] for i in idx], [sb[i] for i in idx], statistic, n_resamples, seed=seed)
        per_category[cat] = {**pr.__dict__, "a": statistic([sa[i] for i in idx]), "b": statistic([sb[i] for i in idx])}
    return {
        "metric": metric,
        "higher_is_better": a["metrics"][metric]["higher_is_better"],
        "methods": [a["method"]["name"], b["method"]["name"]],
        "task": a["task"]["name"],
        "n": len(sa),
        "warnings": warnings,
        "total": {**total.__dict__, "a": a["metrics"][metric]["value"], "b": b["metrics"][metric]["value"]},
        "categories": per_category,
        "items": item_changes(sa, sb, metric),
        "agreement": stats.token_agreement(sa, sb),  # generated tokens of B against A's (None: nothing generated)
    }


def _paired_samples(a, b) -> tuple[list[dict], list[dict]]:
    ia = {str(s["id"]): s for s in a["samples"]}
    ib = {str(s["id"]): s for s in b["samples"]}
    if set(ia) != set(ib):
        only_a, only_b = sorted(set(ia) - set(ib))[:5], sorted(set(ib) - set(ia))[:5]
        raise CompareError(
            f"the runs hold different items (only in A: {only_a}; only in B: {only_b}); "
            "finish both runs or rerun them with the same --limit"
        )
    ids = [str(s["id"]) for s in a["samples"]]
    return [ia[i] for i in ids], [ib[i] for i in ids]


def metric_statistic(
    task_name: str, metric: str, warnings: list[str], shared: dict | None = None
) -> Callable[[list], float | None]:
    """The task's own aggregate restricted to one metric; a per-item mean if the task cannot be imported. `shared`:
    a dict that statistics of several metrics over the same records share, so that a list of records (a bootstrap
    draw) is aggregated once for all of them."""
    try:
        import tasks

        task = tasks.get_task(task_name)
    except (KeyError, ImportError) as err:
        warnings.append(f"task {task_name!r} not importable ({err}); using the mean of per-item scores[{metric!r}]")
        return lambda rs: _mean_score(rs, metric)

    def aggregate(rs):
        if shared is None:
            return task.aggregate(rs)["metrics"]
        key = tuple(map(id, rs))
        if key not in shared:
            shared[key] = task.aggregate(rs)["metrics"]
        return shared[key]

    return lambda rs: R.number(aggregate(rs).get(metric)) if rs else None


def paired_totals(
    a: dict[str, Any], b: dict[str, Any], metrics: list[str], n_resamples: int, seed: int, shared: dict | None = None
) -> dict[str, stats.PairedResult]:
    """compare's test of the total for each of `metrics` (B - A over the items both hold, the same draws), with one
    aggregate of each draw for all metrics (the leaderboard's paired tables). `shared`: the aggregates of earlier
    calls over the same result dicts (a reference's draws are the same against every run), kept by the caller."""
    sa, sb = _paired_samples(a, b)
    shared = {} if shared is None else shared
    return {
        m: stats.paired_bootstrap(sa, sb, metric_statistic(a["task"]["name"], m, [], shared), n_resamples, seed=seed)
        for m in metrics
    }


def _mean_score(records, metric):
    vals = [R.number((r.get("scores") or {}).get(metric)) for r in records]
    vals = [v for v in vals if v is not None]
    if not vals:
        raise CompareError(
            f"the task is not available here to recompute {metric!r}, and per-item scores have "
            f"no {metric!r} to average; compare where the task is installed (oscar-eval list tasks)"
        )
    return sum(vals) / len(vals)


def score_key(samples: list[dict], metric: str) -> str | None:
    """The per-item score behind `metric`: the same name, else the only 0/1 score, else None."""
    keys = {k for s in samples for k in (s.get("scores") or {})}
    if metric in keys:
        return metric
    binary = [k for k in sorted(keys) if stats.is_binary([(s.get("scores") or {}).get(k) for s in samples])]
    return binary[0] if len(binary) == 1 else None


def item_changes(sa: list[dict], sb: list[dict], metric: str) -> dict[str, Any]:
    """McNemar + flipped items for 0/1 per-item scores; otherwise per-item deltas sorted by size."""
    key = score_key(sa, metric)
    if key is None:
        return {"score": None, "test": None, "changed": []}
    xa = [R.number((s.get("scores") or {}).get(key)) for s in sa]
    xb = [R.number((s.get("scores") or {}).get(key)) for s in sb]
    both = [i for i in range(len(sa)) if xa[i] is not None and xb[i] is not None]
    rows = [
        {
            "id": sa[i]["id"],
            "category": sa[i].get("category"),
            "a": xa[i],
            "b": xb[i],
            "prediction_a": sa[i].get("prediction"),
            "prediction_b": sb[i].get("prediction"),
        }
        for i in both
        if xa[i] != xb[i]
    ]
    if stats.is_binary([xa[i] for i in both] + [xb[i] for i in both]):
        m = stats.mcnemar_exact([xa[i] for i in both], [xb[i] for i in both])
        return {"score": key, "test": {"name": "mcnemar_exact", **m.__dict__}, "changed": rows}
    rows.sort(key=lambda r: -abs(r["b"] - r["a"]))
    return {"score": key, "test": None, "changed": rows}


def gate(report: dict[str, Any], threshold: tuple[float, bool] | None, alpha: float = ALPHA) -> tuple[bool, str]:
    """(failed, sentence): failed when B is worse than A by more than `threshold` (None: 0) and the total's paired
    p-value is below `alpha` (alpha 1: the drop alone decides). drop = how much worse B is, in the metric's
    direction."""
    a, b = report["total"]["a"], report["total"]["b"]
    if a is None or b is None:
        return True, "FAIL: the metric is undefined in A or B"
    value, relative = threshold or (0.0, False)
    drop = (a - b) if report["higher_is_better"] else (b - a)
    if relative and a == 0:
        return drop > 0, f"{'FAIL' if drop > 0 else 'ok'}: A is 0, a relative drop is undefined; any drop fails"
    measured = 100 * drop / abs(a) if relative else drop
    unit = "%" if relative else ""
    p = report["total"].get("p_value")
    significant = alpha >= 1 or (p is not None and p < alpha)
    failed = measured > value and significant
    where = f"B is worse by {measured:.4g}{unit}" if drop > 0 else f"B is better or equal by {abs(measured):.4g}{unit}"
    allowed = f"allowed {value:g}{unit}"
    p_text = "" if alpha >= 1 else f", p = {_f(p)} (alpha {alpha:g})"
    if failed:
        return True, f"FAIL: {where}, {allowed}{p_text}"
    why = "" if measured <= value else " but not significantly (--alpha)"
    return False, f"ok: {where}{why}, {allowed}{p_text}"


def format_report(report: dict[str, Any], show: int) -> str:
    t = report["total"]
    arrow = "higher is better" if report["higher_is_better"] else "lower is better"
    lines = [
        f"compare {report['task']}: {report['methods'][0]} (A) -> {report['methods'][1]} (B), "
        f"{report['metric']} ({arrow}), {report['n']} paired items"
    ]
    lines += [f"warning: {w}" for w in report["warnings"]]
    lines.append(f"{'':<28} {'A':>10} {'B':>10} {'B-A':>10}  {'95% CI':<22} p")
    lines.append(_row("total", t))
    lines += [_row(f"  {cat}", c) for cat, c in report["categories"].items()]
    items = report["items"]
    if items["test"]:
        m = items["test"]
        lines.append(
            f"McNemar exact on per-item {items['score']!r}: A-only right {m['b']}, "
            f"B-only right {m['c']}, p={m['p_value']:.4g}"
        )
        lines.append(f"flipped items ({len(items['changed'])}):")
    elif items["score"]:
        lines.append(f"largest per-item changes of {items['score']!r} ({len(items['changed'])} changed):")
    for r in items["changed"][:show]:
        lines.append(
            f"  {r['id']}"
            + (f" [{r['category']}]" if r["category"] is not None else "")
            + f" {r['a']:.4g} -> {r['b']:.4g}"
            + (
                f"  A: {_short(r['prediction_a'])}  B: {_short(r['prediction_b'])}"
                if r["prediction_a"] is not None
                else ""
            )
        )
    if report.get("agreement"):
        lines.append(agreement_line(report["agreement"]))
    if report.get("gate"):
        lines.append(f"gate: {report['gate']['verdict']}")
    return "\n".join(lines)


def agreement_line(a: dict[str, Any]) -> str:
    """One sentence: the items whose generated tokens B shares with A, and where the others first differ."""
    line = f"generated tokens: B's equal A's in {a['same']} of {a['n']} items ({100 * a['share']:.1f}%)"
    if a["by"] == "tokens_sha1":
        return line + " (by their digests: these results hold no tokens, so no first divergent step)"
    if a["mean_first"] is not None:
        line += (
            f"; where they differ ({a['diverged']} items), the first differing token is number "
            f"{a['mean_first']:.1f} on average (1: the first generated)"
        )
    return line


def _row(label: str, c: dict[str, Any]) -> str:
    ci = f"[{c['ci_low']:.4g}, {c['ci_high']:.4g}]" if c["ci_low"] is not None else "-"
    p = f"{c['p_value']:.3g}" if c["p_value"] is not None else "-"
    return f"{label[:28]:<28} {_f(c['a']):>10} {_f(c['b']):>10} {_f(c['delta']):>10}  {ci:<22} {p}"


def _f(x) -> str:
    return "-" if x is None else f"{x:.4g}"


def _short(text: str | None, n: int = 40) -> str:
    text = (text or "").replace("\n", " ")
    return repr(text if len(text) <= n else text[: n - 1] + "…")
