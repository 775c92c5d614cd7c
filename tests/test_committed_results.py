"""The committed record: every result file is named by what ran (its config is what its name means today), and the
generated tables (results/LEADERBOARD.md, the README's results section) are what `make leaderboard` writes from the
committed files."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import provenance
from harness import results as R
from harness.report import leaderboard as L
from harness.report import speed as S

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / R.RUNS_DIR
FILES = R.find_results(RUNS)


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(RUNS)) for p in FILES])
def test_a_committed_result_is_what_its_name_says(path):
    """Its config equals its preset today (plus the changes its name lists); a partial run carries .first<N>."""
    result = R.read_result(path)
    drift = provenance.preset_drift(result)
    assert drift is None, f"{path}: {drift}; rerun it (make eval ... OPTS=--force) or rename it"
    name = result["method"]["name"]
    n, total = result["task"]["n_items"], result["task"].get("n_total")
    assert path.stem == (name + (f".first{n}" if total and n < total else "")), path
    assert total is not None, f"{path}: no task.n_total: whether it covers the whole set is unknown"


def test_the_leaderboard_and_the_readme_are_what_make_leaderboard_writes(monkeypatch):
    monkeypatch.chdir(ROOT)  # as `make leaderboard` runs: paths in the tables are relative to the checkout
    board = L.build_board(
        L.load_runs(R.RUNS_DIR), L.load_json(Path("results/paper.json")), S.load_bench(Path("results/bench"))
    )
    committed = (ROOT / "results" / "LEADERBOARD.md").read_text(encoding="utf-8")
    assert L.markdown(board) == committed, "results/LEADERBOARD.md is out of date: run `make leaderboard`"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index(L.README_START) + len(L.README_START) + 1 : readme.index(L.README_END)]
    assert section == L.markdown(board, short=True), "README.md's results section is out of date: `make leaderboard`"
