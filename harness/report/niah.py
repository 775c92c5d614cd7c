"""The needle-in-a-haystack heat maps of the leaderboard: per model and method, RULER's string_match_all in each
(context length, needle depth) cell, every niah-* result of the pair merged, drawn as needle-in-a-haystack papers draw
it (x: context length, y: depth, colour: score). harness.report.leaderboard adds the markdown tables
(`markdown_sections`), harness.report.html the figures (`html_section`); only results of trained weights are drawn (a
pipeline check's answers mean nothing).

Cells are computed by the task's own scorer (tasks.niah.score.cells) from the results' records, so a cell here is the
number the result's category holds. Where a length has several results of one method (a whole run and a --limit
run), the one with the most items is drawn.
"""

from __future__ import annotations

import html
from typing import Any

from tasks.niah import score

PREFIX = "niah-"
Runs = list[dict[str, Any]]


def groups(board) -> dict[tuple[str, str], dict[str, Runs]]:
    """{(model, data kind): {method: its niah runs, one per length}}, methods in the board's display order."""
    found: dict[tuple[str, str], dict[str, dict[int, dict[str, Any]]]] = {}
    for _, runs in board.results:
        for r in runs:
            if not r["task"]["name"].startswith(PREFIX):
                continue
            lengths = {s.get("length") for s in r["samples"]} - {None}
            if len(lengths) != 1:
                continue  # not one length's niah records (an older or foreign result): nothing to place
            by_length = found.setdefault((r["model"]["name"], r["task"]["data"]), {}).setdefault(
                r["method"]["name"], {}
            )
            length = int(lengths.pop())
            if length not in by_length or len(r["samples"]) > len(by_length[length]["samples"]):
                by_length[length] = r
    order = {m: i for i, m in enumerate(board.methods)}
    return {
        key: {m: list(found[key][m].values()) for m in sorted(found[key], key=lambda m: (order.get(m, len(order)), m))}
        for key in sorted(found)
    }


def grid(runs: Runs) -> tuple[dict[int, float], dict[tuple[int, int], tuple[float, int]], float]:
    """({length: string_match_all}, {(length, depth row): (string_match_all, items)}, string_match_all over all the
    runs' items)."""
    records = [s for r in runs for s in r["samples"]]
    return score.by_length(records), score.cells(records), score.aggregate(records)["metrics"][score.METRIC]


def title(model: str, data: str) -> str:
    return f"niah · {model}" + (f" ({data} data)" if data != "official" else "")


# ---------------------------------------------------------------------------------------------- markdown


def markdown_sections(board) -> list[str]:
    """Per model: string_match_all per method and context length, then (collapsed) each method's depth x length
    table."""
    from harness.report.tables import Table, fmt, md_table

    parts = []
    for (model, data), methods in groups(board).items():
        grids = {m: grid(runs) for m, runs in methods.items()}
        lengths = sorted({length for ls, _, _ in grids.values() for length in ls})
        header = ["method"] + [score.length_label(x) for x in lengths] + ["all lengths"]
        rows = []
        for m, (per_length, _, overall) in grids.items():
            rows.append([m] + [fmt(per_length.get(length)) for length in lengths] + [fmt(overall)])
        summary = Table(f"{title(model, data)}: string_match_all by context length", header, rows)
        depth_tables = []
        for m, (_, cells, _) in grids.items():
            depth_rows = [
                [score.depth_label(row)] + [cell_text(cells.get((length, row))) for length in lengths]
                for row in range(len(score.DEPTH_BINS))
            ]
            depth_tables.append(f"#### {m}\n\n" + md_table(Table(m, ["depth"] + header[1:-1], depth_rows)))
        parts.append(
            f"### {summary.title}\n\n{md_table(summary)}\n\n{NOTE}\n\n<details><summary>{title(model, data)}: "
            f"string_match_all per needle depth (rows) and context length (columns)</summary>\n\n"
            + "\n\n".join(depth_tables)
            + "\n\n</details>"
        )
    return parts


def cell_text(cell: tuple[float, int] | None) -> str:
    from harness.report.tables import fmt

    return "–" if cell is None else f"{fmt(cell[0])} ({cell[1]})"


NOTE = (
    "RULER's string_match_all (0-100) of the eight niah variants together, every niah-* result of a method merged; "
    "a length's column: its items; depth tables: each cell's score and, in brackets, its items."
)


# ---------------------------------------------------------------------------------------------- HTML


def heatmap_plot(model: str, data: str, methods: dict[str, Runs]) -> str | None:
    """One panel per method: depth rows (0% at the top) x context lengths, colour = score (0 red .. 100 green),
    each cell's value written in it."""
    import matplotlib.pyplot as plt
    import numpy as np

    from harness.report.html import png
    from harness.report.tables import fmt

    grids = {m: grid(runs) for m, runs in methods.items()}
    lengths = sorted({length for ls, _, _ in grids.values() for length in ls})
    if not lengths:
        return None
    cols = min(3, len(grids))
    rows = -(-len(grids) // cols)
    width = max(3.2, 0.9 * len(lengths) + 1.8)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols + 1.2, 3.9 * rows), squeeze=False)
    image = None
    for i, (ax, (m, (_, cells, overall))) in enumerate(zip(axes.flat, grids.items())):
        values = np.full((len(score.DEPTH_BINS), len(lengths)), np.nan)
        for (length, row), (value, _) in cells.items():
            values[row, lengths.index(length)] = value
        image = ax.imshow(values, cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
        for (row, col), value in np.ndenumerate(values):
            if not np.isnan(value):
                ax.text(col, row, f"{value:.0f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(lengths)), [score.length_label(x) for x in lengths], fontsize=8)
        ax.set_yticks(range(len(score.DEPTH_BINS)), [score.depth_label(r) for r in range(len(score.DEPTH_BINS))])
        ax.tick_params(axis="y", labelsize=7)
        ax.set(
            xlabel="context length (tokens)",
            ylabel="" if i % cols else "needle depth",
            title=f"{m}: {fmt(overall)} overall",
        )
        ax.title.set_fontsize(9)
    for ax in list(axes.flat)[len(grids) :]:
        ax.axis("off")
    fig.colorbar(image, ax=axes, shrink=0.8, label="string_match_all")
    fig.suptitle(f"{title(model, data)}: RULER needle retrieval by context length and depth", fontsize=10)
    return png(fig)


def html_section(board) -> str:
    """The heat maps of every model with niah results of trained weights; empty when there are none."""
    from harness.report.html import figure

    parts = []
    for (model, data), methods in groups(board).items():
        caption = f"{title(model, data)}: string_match_all per context length and needle depth"
        parts.append(f"<h3>{html.escape(caption)}</h3>" + figure(heatmap_plot(model, data, methods), caption))
    if not parts:
        return ""
    return '<section class="niah" id="niah"><h2>Needle in a haystack</h2>' + "".join(parts) + "</section>"
