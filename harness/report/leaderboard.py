"""`oscar-eval leaderboard`: markdown and HTML tables built only from result files and the bench references.

Inputs: every result file under results/runs/ (validated; an invalid file stops the build with its name), the paper's
published numbers in results/paper.json (their own tables, marked published, never merged with measured rows) and the
reference `make bench` JSON of each GPU kind, results/bench/<gpu-kind>.json.
Outputs: results/LEADERBOARD.md, the README's results section (the text between README_START and README_END is
replaced by the short markdown: the headline table and links to the full tables) and
results/leaderboard/index.html (harness.report.html; built, not committed).
This module reads the inputs, groups and orders the results (build_board) and writes the markdown; the tables are
harness.report.tables' (the bench references': harness.report.speed, which also reads them, load_bench).

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
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import results as R
from harness.report import eval_cost
from harness.report.speed import Speed, e2e_table, kernel_table, load_bench
from harness.report.tables import (
    DISTRIBUTION_METRICS,
    Table,
    headline_table,
    is_pipeline_check,
    md_table,
    paired_table,
    paper_tables,
    result_table,
)

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
    from harness.report import html

    html_path = html.write(Path(args.html), board)
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


# ---------------------------------------------------------------- grouping


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
class Board:
    """What the markdown and the HTML page show, in their order (harness.report.html draws from it)."""

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
    niah_at: int = 0  # how many result tables come before the needle-in-a-haystack summaries (harness.report.niah)


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


def mark_stale(runs: list[dict[str, Any]]) -> None:
    """Put each run's harness.provenance.stale_reasons in '_stale' (empty when the run is what this checkout
    computes)."""
    from harness import provenance

    for r in runs:
        r["_stale"] = provenance.stale_reasons(r)


# ---------------------------------------------------------------- markdown


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
    """Each model's needle-in-a-haystack tables by context length and depth (harness.report.niah), placed right after
    the needle tests' result tables."""
    from harness.report import niah

    return niah.markdown_sections(board)


INTRO = (
    "Built by `make leaderboard` from {n} result files under `results/runs/` and the bench reference of each GPU "
    "kind under `results/bench/`. Intervals: percentile bootstrap over items, or over clusters of items (ᶜ: "
    "OCRBench's source datasets, MMAU-Pro's audio clips, NIAH's haystacks) where the items have them; failed: items "
    "that ended in an error. ppl: kl, the mean KL(BF16 || method) in nats per scored token over the whole "
    "vocabulary, kl_p99 its 99th percentile, top1 the share of tokens whose most likely next token is BF16's. "
    "Generating tasks: same tokens, the items whose generated tokens equal BF16's; 1st divergence, the mean number "
    "of the first token that differs (1: the first generated) over the items that differ."
)
NO_RESULTS = "No results of trained weights yet: `make eval MODEL=<model> QUANT=<method>` writes one."
README_MORE = (
    "The full tables: [results/LEADERBOARD.md](results/LEADERBOARD.md), every result of trained weights with its "
    "interval and the paired tests of each table (against BF16 and against OScaR), the ablations, the needle tests "
    "by context length and depth, speed and memory of each GPU, the paper's published numbers and {n} pipeline "
    "checks (models without trained weights); `make leaderboard` also writes the same as a page with plots, "
    "[results/leaderboard/index.html](results/leaderboard/index.html) (built, not committed)."
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
