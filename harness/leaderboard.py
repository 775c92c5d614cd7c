"""`oscar-eval leaderboard`: markdown and HTML tables built only from result files.

Inputs: every result file under results/runs/ (validated; an invalid file stops the build with its
name), the paper's published numbers in results/paper.json (shown in their own tables, marked
published, never merged with measured rows) and speed figures from `make bench` under results/bench/.
Outputs: results/LEADERBOARD.md, the README's results section (between the markers below, when the
README has them) and results/leaderboard/index.html with its plots embedded.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness import results as R

# Display order of the presets (quant.list_methods()); unknown names follow alphabetically.
METHOD_ORDER = ("bf16", "kivi", "quarot", "rotatekv", "ott", "turboquant", "oscar",
                "oscar-rotation-only", "oscar-scaling-only")
README_START = "<!-- leaderboard:start -->"
README_END = "<!-- leaderboard:end -->"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", default=str(R.RUNS_DIR))
    p.add_argument("--paper", default="results/paper.json")
    p.add_argument("--bench-dir", default="results/bench")
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
    groups = group_runs(runs)
    md = markdown(groups, paper, len(runs))
    Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
    Path(args.markdown).write_text(md, encoding="utf-8")
    updated = update_readme(Path(args.readme), md)
    from harness import report_html

    newest = newest_bench_file(Path(args.bench_dir), bench)
    targets = None
    if newest is not None:
        from harness.bench import check as bench_check

        targets = bench_check.target_rows(bench_check.load(newest))
    html_path = report_html.write(Path(args.html), groups, paper, bench, len(runs), targets,
                                  str(newest) if newest else None)
    print(f"{len(runs)} result files -> {args.markdown}, {html_path}"
          + (f", {args.readme} (results section)" if updated else f" ({args.readme} has no {README_START} marker)"))
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


BENCH_VARIANTS = {"sdpa_cudnn": "BF16 SDPA cuDNN", "sdpa_flash": "BF16 SDPA flash", "flex": "BF16 FlexAttention",
                  "oscar_cuda_us": "OScaR INT2 CUDA", "oscar_triton_us": "OScaR INT2 Triton",
                  "oscar_cuda_graph_us": "OScaR INT2 CUDA graph",
                  # after a read-only L2 flush (harness.bench._clean_l2_us), as in a model's decode step
                  "sdpa_cudnn_clean": "BF16 SDPA cuDNN, clean L2", "sdpa_flash_clean": "BF16 SDPA flash, clean L2",
                  "oscar_cuda_graph_clean_us": "OScaR INT2 CUDA graph, clean L2",
                  "sdpa_cudnn_graph": "BF16 SDPA cuDNN graph", "sdpa_flash_graph": "BF16 SDPA flash graph",
                  "sdpa_cudnn_graph_clean": "BF16 SDPA cuDNN graph, clean L2",
                  "sdpa_flash_graph_clean": "BF16 SDPA flash graph, clean L2",
                  "oscar_triton_graph_us": "OScaR INT2 Triton graph",
                  "oscar_triton_graph_clean_us": "OScaR INT2 Triton graph, clean L2",
                  # a bare stream of the step's packed bytes (harness/bench/floor.py): what no decode goes below
                  "floor_read_us": "read floor (bare stream)", "floor_read_clean_us": "read floor, clean L2"}


def load_bench(bench_dir: Path) -> list[dict[str, Any]]:
    """Decode-attention rows of `make bench` files (results/bench/**/*bench*.json, harness.bench's format:
    {"environment": {"device"}, "kernels": [{shape, batch, context, <variant>: us, ...}]}), one row per
    (run folder, device, shape, batch, context, variant); files holding {"rows": [...]} pass through.
    Folders named "experiments" hold runs of code that is not the current one: they are skipped."""
    rows = []
    for path in sorted(bench_dir.glob("**/*bench*.json")) if bench_dir.exists() else []:
        if "experiments" in path.relative_to(bench_dir).parts:
            continue
        data = load_json(path)
        run = str(path.parent.relative_to(bench_dir)) if path.parent != bench_dir else path.stem
        if isinstance(data, dict) and "kernels" in data:
            device = data.get("environment", {}).get("device", "?")
            for k in data["kernels"]:
                for key, label in BENCH_VARIANTS.items():
                    if isinstance(k.get(key), (int, float)):
                        rows.append({"run": run, "device": device, "shape": k.get("shape"), "batch": k.get("batch"),
                                     "context": k.get("context"), "variant": label, "time_us": float(k[key])})
        elif isinstance(data, dict) and isinstance(data.get("rows"), list):
            rows += [{**row, "run": run} for row in data["rows"] if isinstance(row, dict)]
    return rows


def newest_bench_file(bench_dir: Path, rows: list[dict[str, Any]]) -> Path | None:
    """The `make bench` JSON of the newest run folder (report_html.latest_run), if it has kernel rows."""
    from harness.report_html import latest_run

    run = latest_run(rows)
    if run is None:
        return None
    files = sorted(p for p in (bench_dir / run).glob("*bench*.json") if "kernels" in load_json(p))
    return files[-1] if files else None


def method_rank(name: str) -> tuple[int, str]:
    return (METHOD_ORDER.index(name), "") if name in METHOD_ORDER else (len(METHOD_ORDER), name)


def group_runs(runs: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """{(task, data, model): runs sorted by method}; groups of real weights first, tiny replicas after,
    each by task then model."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["task"]["name"], r["task"]["data"], r["model"]["name"]), []).append(r)
    order = sorted(groups, key=lambda k: (any(r["model"]["replica"] for r in groups[k]), k))
    return {k: sorted(groups[k], key=lambda r: method_rank(r["method"]["name"])) for k in order}


# ---------------------------------------------------------------- rows shared by markdown and HTML


def fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "–"
    return f"{x:.{digits}g}" if abs(x) < 1e6 else f"{x:.3e}"


def group_title(key: tuple[str, str, str], runs: list[dict[str, Any]]) -> str:
    task, data, model = key
    tags = [f"{data} data"] if data != "official" else []
    if any(r["model"]["replica"] for r in runs):
        tags.append("tiny random-weight replica: pipeline check, not model quality")
    return f"{task} · {model}" + (f" ({'; '.join(tags)})" if tags else "")


def run_row(r: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, str]:
    """One table row: method, metric with its interval, n, bits/element, KV memory, compression, speed."""
    m = r["metrics"][r["primary_metric"]]
    s = r["system"]
    ci = f" [{fmt(m['ci_low'])}, {fmt(m['ci_high'])}]" if m["ci_low"] is not None else ""
    kv = s["kv_bytes"]["total"]
    ref_kv = reference["system"]["kv_bytes"]["total"] if reference else None
    ratio = f"{ref_kv / kv:.2f}x" if kv and ref_kv else "–"
    return {
        "method": r["method"]["name"],
        "metric": f"{fmt(m['value'])}{ci}",
        "n": str(m["n"]) + (f" ({r.get('n_errors', 0)} err)" if r.get("n_errors") else ""),
        "bits/elt": fmt(s["bits_per_element"], 3),
        "KV KiB/item": fmt(kv / 1024 if kv is not None else None, 4),
        "vs bf16": ratio,
        "tok/s": fmt(s["tokens_per_s"], 3) + (" (graphs)" if (s.get("graph_decode_share") or 0) >= 0.5 else ""),
        "device": s["device"],
        "commit": (r["environment"]["git_commit"] or "–")[:8],
    }


def reference_run(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((r for r in runs if r["method"]["name"] == "bf16"), None)


def metric_header(runs: list[dict[str, Any]]) -> str:
    r = runs[0]
    arrow = "↑" if r["metrics"][r["primary_metric"]]["higher_is_better"] else "↓"
    return f"{r['primary_metric']} {arrow} (95% CI)"


def paper_tables(paper: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) per published benchmark."""
    out = []
    for bench in paper.get("benchmarks", []):
        labels = bench.get("method_labels", {})
        header = ["model"] + (["metric"] if bench.get("submetrics") else []) + [labels.get(m, m) for m in bench["methods"]]
        rows = []
        for row in bench["rows"]:
            cells = [row["model"]] + ([row["submetric"]] if bench.get("submetrics") else [])
            rows.append(cells + [fmt(row["values"].get(m)) for m in bench["methods"]])
        out.append((f"{bench['task']} — {bench['metric']} (published)", header, rows))
    return out


# ---------------------------------------------------------------- markdown


def md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = [[c.replace("|", "\\|") for c in row] for row in [header] + rows]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in esc[1:]])


def markdown(groups, paper: dict[str, Any] | None, n_files: int) -> str:
    parts = [f"Built by `make leaderboard` from {n_files} result files under `results/runs/` "
             "(measured here). Intervals: percentile bootstrap over items. Rows marked replica ran tiny "
             "random-weight models: they show that the pipeline runs, not how good a method is."]
    for key, runs in groups.items():
        ref = reference_run(runs)
        rows = [run_row(r, ref) for r in runs]
        header = list(rows[0])
        header[1] = metric_header(runs)
        parts.append(f"### {group_title(key, runs)}\n\n" + md_table(header, [list(r.values()) for r in rows]))
    if paper:
        parts.append(f"### Published numbers (not measured here)\n\nSource: {paper['source']}.")
        parts += [f"#### {title}\n\n" + md_table(h, rows) for title, h, rows in paper_tables(paper)]
    return "\n\n".join(parts) + "\n"


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
