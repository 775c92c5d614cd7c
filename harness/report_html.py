"""The leaderboard as one static HTML page: tables plus matplotlib plots embedded as PNG data URIs
(no CDN, no network, opens from disk).

Per (task, data, model) group: the runs table; the primary metric against bits per element and
against KV memory per item with the Pareto front (runs no other run beats on both axes); per-category
bars. Then the paper's published numbers in their own hatched plots and tables, labelled published,
and the `make bench` speed rows. A script on load writes how many plots decoded into
<body data-plots-rendered>, which the headless-browser test reads.
"""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from harness import leaderboard as L

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:14px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}
tr.missed td{background:#fde8e8}table.targets td:first-child,table.targets td:nth-child(2),table.targets td:last-child{text-align:left}
td:first-child,th:first-child{text-align:left}table.bench td:first-child,table.history td:first-child{white-space:nowrap}
table.bench th,table.history th{font-size:12px}
section{margin-bottom:2.5em}img.plot{max-width:100%;border:1px solid #eee}
.badge{display:inline-block;padding:1px 8px;border-radius:4px;font-size:12px;font-weight:600;color:#fff}
.measured-badge{background:#2a7}.published-badge{background:#c60}.replica-badge{background:#777}
section.published{background:#fff8ef;border-left:4px solid #c60;padding:.5em 1em}
"""
ONLOAD = ("<script>window.addEventListener('load',function(){var n=0;"
          "document.querySelectorAll('img.plot').forEach(function(i){if(i.complete&&i.naturalWidth>0)n++;});"
          "document.body.setAttribute('data-plots-rendered',String(n));});</script>")


def png(fig) -> str:
    """A matplotlib figure as a data URI (the figure is closed)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def pareto(points: list[tuple[float, float]], higher_is_better: bool) -> list[int]:
    """Indices of points no other point beats: x (cost) no larger and y (quality) no worse, one strictly."""
    def better_or_equal(q, p):
        return q[0] <= p[0] and (q[1] >= p[1] if higher_is_better else q[1] <= p[1])

    return [i for i, p in enumerate(points)
            if not any(better_or_equal(q, p) and q != p for j, q in enumerate(points) if j != i)]


def tradeoff_plot(runs: list[dict[str, Any]], title: str) -> str | None:
    """Primary metric vs bits/element (left) and vs mean KV bytes per item (right), Pareto front drawn."""
    import matplotlib.pyplot as plt

    metric = runs[0]["primary_metric"]
    hib = runs[0]["metrics"][metric]["higher_is_better"]
    axes_def = [("bits per element", lambda r: r["system"]["bits_per_element"]),
                ("KV KiB per item", lambda r: (r["system"]["kv_bytes"]["total"] or 0) / 1024 or None)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    drawn = 0
    for ax, (xlabel, getx) in zip(axes, axes_def):
        pts = [(getx(r), r["metrics"][metric]["value"], r["method"]["name"]) for r in runs]
        pts = [p for p in pts if p[0] is not None and p[1] is not None]
        if not pts:
            ax.text(0.5, 0.5, f"no {xlabel} recorded", ha="center", transform=ax.transAxes)
            continue
        front = sorted((pts[i] for i in pareto([(x, y) for x, y, _ in pts], hib)), key=lambda p: p[0])
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], color="#48c", zorder=3)
        ax.plot([p[0] for p in front], [p[1] for p in front], "--", color="#d52", label="Pareto front", zorder=2)
        for x, y, name in pts:
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set(xlabel=xlabel, ylabel=f"{metric} ({'higher' if hib else 'lower'} is better)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        drawn += 1
    fig.suptitle(title, fontsize=10)
    return png(fig) if drawn else _discard(fig)


def category_plot(runs: list[dict[str, Any]], title: str) -> str | None:
    """Grouped bars: one group per category, one bar per method, the primary metric (or first metric)."""
    import matplotlib.pyplot as plt
    import numpy as np

    cats = sorted({c for r in runs for c in r["categories"]})
    if not cats:
        return None
    metric = runs[0]["primary_metric"]
    fig, ax = plt.subplots(figsize=(11, 3.8))
    width = 0.8 / len(runs)
    for k, r in enumerate(runs):
        vals = []
        for c in cats:
            cm = r["categories"].get(c, {}).get("metrics", {})
            vals.append(cm.get(metric, next(iter(cm.values()), None)) if cm else None)
        ax.bar(np.arange(len(cats)) + k * width, [np.nan if v is None else v for v in vals], width, label=r["method"]["name"])
    ax.set_xticks(np.arange(len(cats)) + 0.4 - width / 2, [c[:22] for c in cats], rotation=30, ha="right", fontsize=8)
    ax.set(ylabel=metric, title=f"{title}: per category")
    ax.legend(fontsize=7, ncol=min(len(runs), 5))
    ax.grid(axis="y", alpha=0.3)
    return png(fig)


def published_plot(bench: dict[str, Any]) -> str:
    """Hatched grouped bars of one published benchmark (rows = model or model/submetric)."""
    import matplotlib.pyplot as plt
    import numpy as np

    rows, methods = bench["rows"], bench["methods"]
    labels = [r["model"] + (f" {r['submetric']}" if "submetric" in r else "") for r in rows]
    fig, ax = plt.subplots(figsize=(11, 3.6))
    width = 0.8 / len(methods)
    for k, m in enumerate(methods):
        vals = [r["values"].get(m, np.nan) for r in rows]
        ax.bar(np.arange(len(rows)) + k * width, vals, width, hatch="//", edgecolor="white",
               label=bench.get("method_labels", {}).get(m, m))
    ax.set_xticks(np.arange(len(rows)) + 0.4 - width / 2, labels, fontsize=8)
    ax.set(title=f"PUBLISHED (paper, not measured here): {bench['task']} — {bench['metric']}")
    ax.set_ylim(0, 1.2 * max(v for r in rows for v in r["values"].values()))  # room for the legend
    ax.legend(fontsize=7, ncol=len(methods), loc="upper center")
    ax.grid(axis="y", alpha=0.3)
    return png(fig)


def _run_number(run: str) -> int:
    """The last number in a run folder's name (39 in h100-run39), -1 where it has none."""
    import re

    numbers = re.findall(r"\d+", run)
    return int(numbers[-1]) if numbers else -1


def latest_run(rows: list[dict[str, Any]]) -> str | None:
    """The newest run folder among bench rows: the largest number in its name (h100-run39 after h100-run36)."""
    runs = {r.get("run") for r in rows if r.get("run")}
    return max(runs, key=lambda run: (_run_number(run), run)) if runs else None


SPEED_SHAPES = {"qwen3-8b": "Qwen3-8B (32 q / 8 kv heads)", "llava-7b": "LLaVA-7B (32 / 32)",
                "qwen3-omni-thinker": "Qwen3-Omni thinker (32 / 4)"}


def _point_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Bench rows that name a variant, a context and a time (older formats' keys read too), with those three set;
    a row without a shape is the Qwen3-8B shape (the only one the first bench runs timed)."""
    out = []
    for row in rows:
        name = next((row[k] for k in ("variant", "name", "method") if k in row), None)
        ctx = next((row[k] for k in ("context", "seq_len") if k in row), None)
        t = next((row[k] for k in ("time_us", "median_us") if k in row), None)
        if name is not None and isinstance(ctx, (int, float)) and isinstance(t, (int, float)):
            out.append({**row, "variant": str(name), "context": ctx, "time_us": float(t),
                        "shape": row.get("shape") or "qwen3-8b", "batch": row.get("batch", 1)})
    return out


def _variant_order(names) -> list[str]:
    known = list(L.BENCH_VARIANTS.values())
    return sorted(set(names), key=lambda n: (known.index(n) if n in known else len(known), n))


def _graph_times(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where a run replayed its steps as CUDA graphs, its graph times and read floors only: the eager times carry the
    host's launch costs (the JSON files keep them)."""
    if any("graph" in r["variant"] for r in rows):
        return [r for r in rows if "graph" in r["variant"] or "floor" in r["variant"]]
    return rows


def speed_plot(rows: list[dict[str, Any]]) -> str | None:
    """Time vs context at batch 1 of the newest run, a panel per head shape. Where the run replayed its steps as CUDA
    graphs, only the graph times and the read floors are drawn (`_graph_times`)."""
    import matplotlib.pyplot as plt

    run = latest_run(rows)
    rows = [r for r in _point_rows(rows) if r["batch"] == 1 and (run is None or r.get("run") == run)]
    rows = _graph_times(rows)
    shapes = [s for s in SPEED_SHAPES if any(r["shape"] == s for r in rows)]
    shapes += sorted({r["shape"] for r in rows} - set(shapes))
    if not shapes:
        return None
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes) + 2.8, 4.2), squeeze=False, sharey=True)
    for ax, shape in zip(axes[0], shapes):
        series: dict[str, list[tuple[float, float]]] = {}
        for r in rows:
            if r["shape"] == shape:
                series.setdefault(r["variant"], []).append((r["context"], r["time_us"]))
        for label in _variant_order(series):
            pts = sorted(series[label])
            floor = "floor" in label
            style = ("s" if floor else "o") + (":" if "clean" in label else "--" if floor else "-")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label, markersize=4)
        ax.set(xscale="log", yscale="log", xlabel="context (tokens)", title=SPEED_SHAPES.get(shape, shape))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("time (us)")
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(f"make bench{' ' + run if run else ''}: decode attention at batch 1")
    fig.tight_layout()
    return png(fig)


HISTORY_VARIANT = "OScaR INT2 CUDA graph"
HISTORY_RUNS = 8


def speed_tables(rows: list[dict[str, Any]]) -> str:
    """The newest run's times (`_graph_times`), a row per point and a column per variant; then OScaR's CUDA graph time
    at those points across the last HISTORY_RUNS runs that timed it (each run is the code of its day:
    quant/kernels/NOTES.md)."""
    points = _point_rows(rows)
    run = latest_run(points)
    newest = _graph_times([r for r in points if r.get("run") == run])
    if not newest:
        return ""
    order = list(SPEED_SHAPES)
    grid: dict[tuple, dict[str, float]] = {}
    for r in sorted(newest, key=lambda r: (order.index(r["shape"]) if r["shape"] in order else len(order), r["shape"],
                                           r["batch"], r["context"])):
        grid.setdefault((r["shape"], r["batch"], r["context"]), {})[r["variant"]] = r["time_us"]
    variants = _variant_order(r["variant"] for r in newest)
    cells = [[shape, str(batch), str(ctx)] + [L.fmt(times[v]) if v in times else "" for v in variants]
             for (shape, batch, ctx), times in grid.items()]
    device = newest[0].get("device", "")
    parts = [f"<h3>{html.escape(run or '')}: decode attention, us ({html.escape(str(device))})</h3>",
             table(["shape", "batch", "context", *variants], cells, "bench")]
    timed = {r["run"] for r in points if r["variant"] == HISTORY_VARIANT and r.get("run")}
    runs = sorted(timed, key=lambda name: (_run_number(name), name))[-HISTORY_RUNS:]
    if len(runs) > 1:
        hist = {(r["run"], r["shape"], r["batch"], r["context"]): r["time_us"] for r in points
                if r["variant"] == HISTORY_VARIANT and r.get("run") in runs}
        cells = [[shape, str(batch), str(ctx)] + [L.fmt(hist[(run_, shape, batch, ctx)])
                                                  if (run_, shape, batch, ctx) in hist else "" for run_ in runs]
                 for shape, batch, ctx in grid]
        parts += [f"<h3>{HISTORY_VARIANT}, us, by run (the last {len(runs)}; each run is the code of its day, "
                  "quant/kernels/NOTES.md)</h3>", table(["shape", "batch", "context", *runs], cells, "history")]
    return "\n".join(parts)


def _discard(fig) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)
    return None


# ---------------------------------------------------------------- HTML


def table(header: list[str], rows: list[list[str]], cls: str, row_attrs: list[str] | None = None) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join(f"<tr{(' ' + attrs) if attrs else ''}>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>"
                   for row, attrs in zip(rows, row_attrs or [""] * len(rows)))
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def figure(uri: str | None, caption: str) -> str:
    if uri is None:
        return ""
    return f'<figure><img class="plot" alt="{html.escape(caption)}" src="{uri}"><figcaption>{html.escape(caption)}</figcaption></figure>'


def group_section(key, runs) -> str:
    title = L.group_title(key, runs)
    ref = L.reference_run(runs)
    rows = [L.run_row(r, ref) for r in runs]
    header = list(rows[0])
    header[1] = L.metric_header(runs)
    attrs = [f'data-run="{html.escape(r["_path"])}"' for r in runs]
    badge = '<span class="badge replica-badge">replica</span> ' if any(r["model"]["replica"] for r in runs) else ""
    parts = [f'<section class="measured"><h2><span class="badge measured-badge">measured</span> {badge}{html.escape(title)}</h2>',
             table(header, [list(r.values()) for r in rows], "runs", attrs),
             figure(tradeoff_plot(runs, title), f"{title}: quality vs bits per element and vs KV memory"),
             figure(category_plot(runs, title), f"{title}: per-category scores"), "</section>"]
    return "\n".join(parts)


def published_section(paper: dict[str, Any]) -> str:
    parts = ['<section class="published"><h2><span class="badge published-badge">published</span> '
             f"Paper numbers — not measured here</h2><p>Source: {html.escape(paper['source'])}.</p>"]
    for bench, (title, header, rows) in zip(paper.get("benchmarks", []), L.paper_tables(paper)):
        parts += [f"<h3>{html.escape(title)}</h3>", table(header, rows, "published"),
                  figure(published_plot(bench), title)]
    return "\n".join(parts + ["</section>"])


def targets_table(targets: list[dict[str, Any]] | None, source: str | None) -> str:
    """The kernel targets of the newest bench run (harness.bench.check.target_rows), missed ones marked."""
    if not targets:
        return ""
    f = lambda x: "–" if x is None else f"{x:.3g}"  # noqa: E731
    rows = [[t["target"], t["shape"], ("<= " if not t["higher_is_better"] else ">= ") + f"{t['threshold']:g}",
             f(t["dirty"]), f(t["clean"]),
             "–" if t["ceiling"] is None and t["ceiling_clean"] is None else f"{f(t['ceiling'])} / {f(t['ceiling_clean'])}",
             t["status"]] for t in targets]
    attrs = ['class="missed"' if t["status"].startswith("MISSED") else "" for t in targets]
    return (f"<h3>Kernel targets, {html.escape(source or '')}</h3><p>Dirty / clean: after do_bench's zero-fill "
            "flush / after a read-only flush. Ceiling: best BF16 over a bare stream of the same bytes (no kernel of "
            "these bytes goes beyond it); for the KV memory, the cap of OScaR's storage format with its 128-token "
            "bf16 window. <code>make bench-check B=... A=...</code> prints this and compares runs.</p>"
            + table(["target", "shape", "need", "dirty", "clean", "ceiling", "status"], rows, "targets", attrs))


def speed_section(rows: list[dict[str, Any]], targets: list[dict[str, Any]] | None = None,
                  targets_source: str | None = None) -> str:
    if not rows:
        return ('<section class="speed"><h2>Speed</h2><p>No <code>make bench</code> results under '
                "results/bench/ yet.</p></section>")
    return "\n".join(['<section class="speed"><h2>Speed (make bench)</h2>', targets_table(targets, targets_source),
                      figure(speed_plot(rows), "decode attention time vs context, batch 1"), speed_tables(rows),
                      "<p>Every time of every run: the JSON files under results/bench/.</p></section>"])


def render(groups, paper, bench_rows, n_files: int, targets=None, targets_source=None) -> str:
    body = [f"<h1>oscar-eval leaderboard</h1><p>Built by <code>make leaderboard</code> from {n_files} result files "
            "under results/runs/. Measured rows and the paper's published numbers are kept in separate sections. "
            "Replica rows ran tiny random-weight models: they show the pipeline, not model quality.</p>"]
    body += [group_section(key, runs) for key, runs in groups.items()]
    if paper:
        body.append(published_section(paper))
    body.append(speed_section(bench_rows, targets, targets_source))
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>oscar-eval leaderboard</title>"
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + f"\n{ONLOAD}</body></html>\n")


def write(path: Path, groups, paper, bench_rows, n_files: int, targets=None, targets_source=None) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display on CI machines
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(groups, paper, bench_rows, n_files, targets, targets_source), encoding="utf-8")
    return path
