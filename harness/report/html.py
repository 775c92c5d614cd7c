"""The leaderboard as one static HTML page: tables plus matplotlib plots embedded as PNG data URIs (no CDN, no network,
opens from disk). Built by `make leaderboard` (harness.report.leaderboard builds the tables), not committed.

Order: the headline table, then results of trained weights in the leaderboard's reading order (per group the table,
quality against bits per element and against KV memory with the Pareto front, per-category bars where categories
differ; the needle-in-a-haystack heat maps after the needle tests' tables); speed and memory per GPU kind (the
end-to-end decode, decode attention against context, the kernel times); the paper's published numbers, labelled;
then, collapsed and without plots, the pipeline checks of models without trained weights.

Every chart colours a method as every other chart does (colours: one map for the measured and the published charts,
OScaR's red for OScaR alone) and writes its numbers plain, as the tables do (plain_ticks, harness.report.tables.fmt).
A script on load writes how many plots decoded into <body data-plots-rendered>, which the headless-browser test reads.
"""

from __future__ import annotations

import base64
import html
import io
import re
from pathlib import Path
from typing import Any

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:14px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
td.nobreak{white-space:nowrap}
table.headline td:nth-child(-n+3),table.headline th:nth-child(-n+3){text-align:left}
div.wide{overflow-x:auto;max-width:100%}
table.kernels th,table.e2e th{font-size:12px}
section{margin-bottom:2.5em}img.plot{max-width:100%;border:1px solid #eee}p.note{font-size:13px;color:#555}
.badge{display:inline-block;padding:1px 8px;border-radius:4px;font-size:12px;font-weight:600;color:#fff}
.measured-badge{background:#2a7}.published-badge{background:#c60}.check-badge{background:#777}
section.published{background:#fff8ef;border-left:4px solid #c60;padding:.5em 1em}
details.checks{border-left:4px solid #aaa;padding:.5em 1em;background:#f7f7f7}
details.checks summary{cursor:pointer;font-weight:600}
"""
ONLOAD = (
    "<script>window.addEventListener('load',function(){var n=0;"
    "document.querySelectorAll('img.plot').forEach(function(i){if(i.complete&&i.naturalWidth>0)n++;});"
    "document.body.setAttribute('data-plots-rendered',String(n));});</script>"
)
# One (colour, marker) per preset (quant.methods.PRESETS), fixed so a method looks the same on every plot whichever
# others are shown: BF16 grey, OScaR red, each comparison preset a strong colour, its own-paper preset or variant the
# light shade of that colour (OScaR's float zero point light red), OScaR's RoPE-fitted variants dark red and
# indigo, its guarded rotation dark cyan, Together AI's OSCAR goldenrod (its own-paper budget light), every marker
# distinct as well.
PRESET_STYLES = {
    "bf16": ("#555555", "o"),
    "kivi": ("#1f77b4", "s"),
    "quarot": ("#ff7f0e", "D"),
    "rotatekv": ("#2ca02c", "^"),
    "ott": ("#9467bd", "v"),
    "turboquant": ("#8c564b", "<"),
    "oscar": ("#d62728", ">"),
    "oscar-rotation-only": ("#e377c2", "p"),
    "oscar-scaling-only": ("#17becf", "h"),
    "kivi-own-paper": ("#aec7e8", "*"),
    "quarot-own-paper": ("#ffbb78", "P"),
    "rotatekv-own-paper": ("#98df8a", "X"),
    "turboquant-own-paper": ("#c49c94", "d"),
    "oscar-float-zero": ("#ff9896", "H"),
    "turboquant-rotated-split": ("#bcbd22", "8"),
    "oscar-pairwise": ("#8b0000", "1"),
    "oscar-prerope": ("#4b0082", "2"),
    "oscar-guarded": ("#008b8b", "+"),
    "together-oscar": ("#b8860b", "3"),
    "together-oscar-own-paper": ("#eedc82", "4"),
}
# Methods of no preset (a custom config's name) take pairs no preset uses, in the order they are shown.
OTHER_COLOURS = ("#7f7f7f", "#c5b0d5", "#f7b6d2", "#dbdb8d", "#9edae5")
MARKERS = "osD^v<>ph*PXdH81234+"
FLOOR_COLOUR = "#000000"  # the bare-stream read floor of the speed plot: a bound, not a method, so no method's colour


def colours(methods: list[str]) -> dict[str, tuple[str, str]]:
    """{method: (colour, marker)}, the same on every plot of the page (measured and published) and distinct between
    methods."""
    taken = set(PRESET_STYLES.values())
    spare = [pair for pair in ((c, m) for m in MARKERS for c in OTHER_COLOURS) if pair not in taken]
    others = [m for m in dict.fromkeys(methods) if m not in PRESET_STYLES]
    return {m: PRESET_STYLES.get(m) or spare[others.index(m) % len(spare)] for m in methods}


def png(fig) -> str:
    """A matplotlib figure as a data URI (the figure is closed)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def plain_ticks(ax) -> None:
    """Tick labels as plain numbers, as the tables write them (1500 and 0.002, never 1.5e+03, an offset or 10^3):
    linear axes without scientific notation, log axes labelled where matplotlib would but with fmt's text. Axes with
    their own labels (categories) keep them."""
    from matplotlib import ticker

    from harness.report.tables import fmt

    class PlainLog(ticker.LogFormatterSciNotation):
        def __call__(self, x, pos=None):
            return fmt(x, 3) if super().__call__(x, pos) else ""

    for axis in (ax.xaxis, ax.yaxis):
        major, minor = axis.get_major_formatter(), axis.get_minor_formatter()
        if axis.get_scale() == "log":  # base 10, as every log axis here; which ticks get labels stays matplotlib's
            for old, setter in ((major, axis.set_major_formatter), (minor, axis.set_minor_formatter)):
                if isinstance(old, ticker.LogFormatter):
                    setter(PlainLog(labelOnlyBase=old.labelOnlyBase, minor_thresholds=old.minor_thresholds))
        elif isinstance(major, ticker.ScalarFormatter):
            major.set_scientific(False)
            major.set_useOffset(False)


def pareto(points: list[tuple[float, float]], higher_is_better: bool) -> list[int]:
    """Indices of points no other point beats: x (cost) no larger and y (quality) no worse, one strictly."""

    def better_or_equal(q, p):
        return q[0] <= p[0] and (q[1] >= p[1] if higher_is_better else q[1] <= p[1])

    return [
        i
        for i, p in enumerate(points)
        if not any(better_or_equal(q, p) and q != p for j, q in enumerate(points) if j != i)
    ]


# ---------------------------------------------------------------- plots of results


def tradeoff_plot(runs: list[dict[str, Any]], title: str, style: dict[str, tuple[str, str]]) -> str | None:
    """The primary metric against bits per element, the Pareto front dashed and BF16's value as a grey line. Left:
    every method; right (when two or more qualify): the quantized methods within NEAR of BF16's value, on their own
    axes, where the close ones are told apart. Methods are named in one legend by colour and marker (text beside
    close points would overlap)."""
    import matplotlib.pyplot as plt

    metric = runs[0]["primary_metric"]
    hib = runs[0]["metrics"][metric]["higher_is_better"]
    pts = [(r["system"]["bits_per_element"], r["metrics"][metric]["value"], r["method"]["name"]) for r in runs]
    pts = [p for p in pts if p[0] is not None and p[1] is not None]
    if not pts:
        return None
    ref = next((y for _, y, name in pts if name == "bf16"), None)
    near = [p for p in pts if p[2] != "bf16" and ref and abs(p[1] - ref) <= NEAR * abs(ref)]
    panels = [(pts, "all methods")] + ([(near, f"within {NEAR:.0%} of BF16")] if len(near) >= 2 else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels) + 1.6, 3.8), squeeze=False)
    for ax, (shown, subtitle) in zip(axes[0], panels):
        front = sorted((shown[i] for i in pareto([(x, y) for x, y, _ in shown], hib)), key=lambda p: p[0])
        ax.plot([p[0] for p in front], [p[1] for p in front], "--", color="#bbb", label="Pareto front", zorder=2)
        if ref is not None:
            ax.axhline(ref, color="#555", linewidth=0.8, linestyle=":", label="BF16 value", zorder=1)
        for x, y, name in shown:
            colour, marker = style[name]
            ax.scatter([x], [y], color=colour, marker=marker, s=50, label=name, zorder=3, edgecolors="white")
        ax.set(xlabel="bits per element", ylabel=f"{metric} ({'higher' if hib else 'lower'} is better)", title=subtitle)
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3)
        plain_ticks(ax)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return png(fig)


NEAR = 0.25  # the zoomed panel of tradeoff_plot: methods within 25% of BF16's value


def category_plot(runs: list[dict[str, Any]], title: str, style: dict[str, tuple[str, str]]) -> str | None:
    """Grouped bars: one group per category, one bar per method, the primary metric (or the first metric). None where
    fewer than two categories or every bar would be the same height (nothing to compare)."""
    import matplotlib.pyplot as plt
    import numpy as np

    cats = sorted({c for r in runs for c in r["categories"]})
    metric = runs[0]["primary_metric"]
    values = []
    for r in runs:
        cms = [r["categories"].get(c, {}).get("metrics", {}) for c in cats]
        values.append([cm.get(metric, next(iter(cm.values()), None)) if cm else None for cm in cms])
    if len(cats) < 2 or len({v for vs in values for v in vs if v is not None}) < 2:
        return None
    fig, ax = plt.subplots(figsize=(11, 3.8))
    width = 0.8 / len(runs)
    for k, (r, vals) in enumerate(zip(runs, values)):
        ax.bar(
            np.arange(len(cats)) + k * width,
            [np.nan if v is None else v for v in vals],
            width,
            color=style[r["method"]["name"]][0],
            label=r["method"]["name"],
        )
    ax.set_xticks(np.arange(len(cats)) + 0.4 - width / 2, [c[:22] for c in cats], rotation=30, ha="right", fontsize=8)
    ax.set(ylabel=metric, title=f"{title}: per category")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.grid(axis="y", alpha=0.3)
    plain_ticks(ax)
    fig.tight_layout()
    return png(fig)


def published_plot(bench: dict[str, Any], style: dict[str, tuple[str, str]]) -> str:
    """Hatched grouped bars of one published benchmark (rows = model or model/submetric), each method in its colour of
    the measured charts (style: colours()), so a colour names one method across the page."""
    import matplotlib.pyplot as plt
    import numpy as np

    rows, methods = bench["rows"], bench["methods"]
    labels = [r["model"] + (f" {r['submetric']}" if "submetric" in r else "") for r in rows]
    fig, ax = plt.subplots(figsize=(11, 3.6))
    width = 0.8 / len(methods)
    for k, m in enumerate(methods):
        vals = [r["values"].get(m, np.nan) for r in rows]
        ax.bar(
            np.arange(len(rows)) + k * width,
            vals,
            width,
            color=style[m][0],
            hatch="//",
            edgecolor="white",
            label=bench.get("method_labels", {}).get(m, m),
        )
    ax.set_xticks(np.arange(len(rows)) + 0.4 - width / 2, labels, fontsize=8)
    ax.set(title=f"PUBLISHED (paper, not measured here): {bench['task']} — {bench['metric']}")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.grid(axis="y", alpha=0.3)
    plain_ticks(ax)
    fig.tight_layout()
    return png(fig)


# ---------------------------------------------------------------- plots of speed and memory

SPEED_SHAPES = {
    "qwen3-8b": "Qwen3-8B (32 q / 8 kv heads)",
    "llava-7b": "LLaVA-7B (32 / 32)",
    "qwen3-omni-thinker": "Qwen3-Omni thinker (32 / 4)",
}
# Both OScaR backends in OScaR's colour (told apart by line and marker), BF16 in BF16's, the floor in no method's.
SPEED_SERIES = {
    "oscar_cuda_graph_us": ("OScaR INT2, CUDA", PRESET_STYLES["oscar"][0], "o-"),
    "oscar_triton_graph_us": ("OScaR INT2, Triton", PRESET_STYLES["oscar"][0], "D:"),
    "best_bf16_graph_us": ("best BF16 (SDPA)", PRESET_STYLES["bf16"][0], "s-"),
    "floor_read_us": ("read floor (bare stream)", FLOOR_COLOUR, "^--"),
}


def speed_plot(data: dict[str, Any]) -> str | None:
    """Decode attention time vs context at batch 1 (CUDA graph replays), a panel per head shape."""
    import matplotlib.pyplot as plt

    points = [k for k in data.get("kernels") or [] if k.get("batch") == 1 and "error" not in k]
    shapes = [s for s in SPEED_SHAPES if any(k.get("shape") == s for k in points)]
    shapes += sorted({k.get("shape") for k in points} - set(shapes), key=str)
    if not shapes:
        return None
    fig, axes = plt.subplots(1, len(shapes), figsize=(3.6 * len(shapes) + 2.6, 3.8), squeeze=False, sharey=True)
    for ax, shape in zip(axes[0], shapes):
        rows = sorted((k for k in points if k.get("shape") == shape), key=lambda k: k["context"])
        for key, (label, colour, fmt) in SPEED_SERIES.items():
            xy = [(k["context"], k[key]) for k in rows if isinstance(k.get(key), (int, float))]
            if xy:
                ax.plot(*zip(*xy), fmt, color=colour, label=label, markersize=4)
        ax.set(xscale="log", yscale="log", xlabel="context (tokens)", title=SPEED_SHAPES.get(shape, shape))
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3)
        plain_ticks(ax)
    axes[0][0].set_ylabel("time (us)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("decode attention at batch 1, CUDA graph replays", fontsize=10)
    fig.tight_layout()
    return png(fig)


def memory_plot(data: dict[str, Any]) -> str | None:
    """The end-to-end decode, BF16 against OScaR per context (and the largest batch at the longest one): KV cache GiB
    (left) and tokens/s (right), values written on the bars as plain numbers (fmt, as in the tables)."""
    import matplotlib.pyplot as plt
    import numpy as np

    from harness.report.tables import fmt

    pairs: dict[tuple, dict[str, dict]] = {}
    for r in data.get("e2e") or []:
        if "error" not in r:
            pairs.setdefault((bool(r.get("largest")), r["context"]), {})[r["kind"]] = r
    keys = sorted((k for k, by in pairs.items() if {"bf16", "oscar"} <= set(by)), key=lambda k: (k[0], k[1]))
    if not keys:
        return None
    labels = [
        f"{ctx // 1024}K"
        + (
            f"\nlargest batch\n{pairs[(big, ctx)]['bf16']['batch']} vs {pairs[(big, ctx)]['oscar']['batch']} seqs"
            if big
            else ""
        )
        for big, ctx in keys
    ]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    x = np.arange(len(keys))
    panels = [
        ("KV cache (GiB)", lambda r: r.get("kv_bytes", np.nan) / 2**30),
        ("decode tokens/s", lambda r: r.get("graph_tokens_per_s", r.get("tokens_per_s", np.nan))),
    ]
    for ax, (what, get) in zip(axes, panels):
        for k, (kind, label) in enumerate([("bf16", "BF16"), ("oscar", "OScaR INT2")]):
            vals = [get(pairs[key][kind]) for key in keys]
            bars = ax.bar(x + (k - 0.5) * 0.38, vals, 0.38, color=PRESET_STYLES[kind][0], label=label)
            ax.bar_label(bars, labels=[fmt(v, 3) for v in vals], fontsize=7, padding=1)
        ax.set_xticks(x, labels, fontsize=8)
        ax.set(ylabel=what, title=what)
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
        plain_ticks(ax)
    axes[1].legend(fontsize=8, loc="upper left")
    fig.suptitle("Qwen3-8B shape, one decode step end to end (CUDA graphs)", fontsize=10)
    fig.tight_layout()
    return png(fig)


# ---------------------------------------------------------------- HTML


def table(t, cls: str) -> str:
    """A harness.report.tables.Table as HTML; rows carry data-run (their result file). The cells of its nowrap columns
    (a value with its interval, a difference with its p-value) stay on one line; the table scrolls sideways where
    that makes it wider than the page."""
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in t.header)
    body = []
    for i, row in enumerate(t.rows):
        attrs = f' data-run="{e(t.row_ids[i])}"' if i < len(t.row_ids) else ""
        cells = "".join(
            f'<td class="nobreak">{e(c)}</td>' if j in t.nowrap else f"<td>{e(c)}</td>" for j, c in enumerate(row)
        )
        body.append(f"<tr{attrs}>{cells}</tr>")
    markup = f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    return f'<div class="wide">{markup}</div>'  # a table wider than the page scrolls on its own, the page does not


def figure(uri: str | None, caption: str) -> str:
    if uri is None:
        return ""
    return (
        f'<figure><img class="plot" alt="{html.escape(caption)}" src="{uri}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def prose(text: str) -> str:
    """Escaped text with its `code` spans as <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def titled(t, cls: str, level: int = 3) -> str:
    note = f'<p class="note">{prose(t.note)}</p>' if t.note else ""
    return f"<h{level}>{html.escape(t.title)}</h{level}>{table(t, cls)}{note}"


def page_colours(board) -> dict[str, tuple[str, str]]:
    """colours() of every method the page draws, measured or published: one map for all its charts."""
    published = [m for _, bench in board.published for m in bench["methods"]]
    return colours(list(board.methods) + published)


def results_section(board) -> str:
    from harness.report import niah  # the needle-in-a-haystack heat maps, right after the needle tests' tables

    style = page_colours(board)
    parts = [
        (
            '<section class="results" id="results"><h2><span class="badge measured-badge">measured</span> '
            "Results of trained weights</h2>"
        )
    ]
    if board.headline:
        parts.append(titled(board.headline, "headline"))
    if not board.results:
        parts.append(
            "<p>No results of trained weights yet: <code>make eval MODEL=&lt;model&gt; "
            "QUANT=&lt;method&gt;</code> writes one.</p>"
        )
    for i, (t, runs) in enumerate(board.results):
        if i == board.niah_at:
            parts.append(niah.html_section(board))
        parts += [
            titled(t, "runs"),
            titled(board.paired[t.title], "paired", level=4) if t.title in board.paired else "",
            figure(tradeoff_plot(runs, t.title, style), f"{t.title}: quality against bits per element"),
            figure(category_plot(runs, t.title, style), f"{t.title}: per-category scores"),
        ]
    if board.niah_at >= len(board.results):
        parts.append(niah.html_section(board))
    return "\n".join(parts + ["</section>"])


def speed_section(board) -> str:
    parts = ['<section class="speed" id="speed"><h2>Speed and memory</h2>']
    if not board.speed:
        parts.append("<p>No bench reference under results/bench/ yet (<code>make bench</code> writes one).</p>")
    for s in board.speed:
        device = (s.data.get("environment") or {}).get("device", s.gpu)
        when = html.escape(str(s.data.get("date", "")))
        parts.append(f"<h3>{html.escape(device)} ({html.escape(s.data['_path'])}, {when})</h3>")
        if s.e2e:
            parts += [titled(s.e2e, "e2e", 4), figure(memory_plot(s.data), "KV cache and tokens/s, BF16 and OScaR")]
        parts.append(figure(speed_plot(s.data), "decode attention time vs context, batch 1"))
        if s.kernels:
            parts.append(titled(s.kernels, "kernels", 4))
    return "\n".join(parts + ["</section>"])


def published_section(board) -> str:
    parts = [
        (
            '<section class="published" id="published"><h2><span class="badge published-badge">published</span> '
            f"Paper numbers — not measured here</h2><p>Source: {html.escape(board.source or '')}.</p>"
        )
    ]
    style = page_colours(board)
    for t, bench in board.published:
        parts += [titled(t, "published"), figure(published_plot(bench, style), t.title)]
    return "\n".join(parts + ["</section>"])


def checks_section(board) -> str:
    parts = [
        (
            '<details class="checks" id="checks"><summary><span class="badge check-badge">pipeline check</span> '
            f"{html.escape(board.checks_title)}</summary>"
        )
    ]
    parts += [titled(t, "checks") for t in board.checks]
    return "\n".join(parts + ["</details>"])


def render(board) -> str:
    body = [
        "<h1>oscar-eval leaderboard</h1>",
        f"<p>{prose(board.intro)}</p>",
        results_section(board),
        speed_section(board),
    ]
    if board.published:
        body.append(published_section(board))
    if board.checks:
        body.append(checks_section(board))
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>oscar-eval leaderboard</title>'
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + f"\n{ONLOAD}</body></html>\n"
    )


def write(path: Path, board) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display on CI machines
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(board), encoding="utf-8")
    return path
