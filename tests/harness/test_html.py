"""The leaderboard page in a real headless Chromium: it loads, its sections come in a reader's order (the headline
table first), its tables hold the result files' rows, a value with its interval stays on one line, its plots decode,
the published section is apart and labelled, and the pipeline checks are collapsed and without plots."""

from __future__ import annotations

import html.parser
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.cli import main as cli
from tests.harness.test_leaderboard import workdir  # noqa: F401  (the same hand-made results tree)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--virtual-time-budget=5000",
]
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium: apt-get install -y chromium")


def chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class Page(html.parser.HTMLParser):
    """Counts what the browser's DOM holds: run rows by table class, plots (and those inside the pipeline checks), the
    order of the sections and the body's attributes."""

    def __init__(self):
        super().__init__()
        self.table, self.rows, self.run_paths, self.plots, self.body = None, {}, [], 0, {}
        self.sections, self.in_checks, self.check_plots, self.checks_open = [], False, 0, None
        self.tables, self.nobreak = [], 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        elif tag in ("section", "details") and "id" in a:
            self.sections.append(a["id"])
            self.in_checks = a["id"] == "checks"
            if self.in_checks:
                self.checks_open = "open" in a
        elif tag == "table":
            self.table = a.get("class")
            self.tables.append(self.table)
        elif tag == "td" and "nobreak" in (a.get("class") or ""):
            self.nobreak += 1
        elif tag == "tr" and self.table and "data-run" in a:
            self.run_paths.append((self.table, a["data-run"]))
        elif tag == "tr" and self.table:
            self.rows[self.table] = self.rows.get(self.table, 0) + 1
        elif tag == "img" and "plot" in (a.get("class") or ""):
            self.plots += 1
            self.check_plots += self.in_checks


def test_page_loads_with_all_rows_and_rendered_plots(workdir, tmp_path):  # noqa: F811
    assert cli(["leaderboard", "--paper", "paper.json"]) == 0
    page_path = Path("results/leaderboard/index.html")
    dom = chromium(tmp_path, page_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = Page()
    page.feed(dom.stdout)
    assert page.sections == ["results", "speed", "published", "checks"]  # what a reader came for first
    assert page.checks_open is False and page.check_plots == 0  # pipeline checks: collapsed, tables only
    expected = sorted(str(p) for p in Path("results/runs").rglob("*.json"))
    assert sorted(path for _, path in page.run_paths) == expected  # one row per result file, no more
    trained = {p for p in expected if "tiny-model" not in p and ".random" not in p}
    assert {path for cls, path in page.run_paths if cls == "runs"} == trained  # pipeline checks in their own tables
    assert page.rows["published"] == (1 + 3) + (1 + 3)  # header + 3 rows in each published table
    assert page.tables[0] == "headline" and page.rows["headline"] == 1 + 2  # ppl · smollm2-135m: bf16 and kivi
    assert page.nobreak >= 2 + 2  # the interval cells of the ppl table, at least
    # the ppl trade-off, the memory and speed plots of the reference, the two published charts
    assert page.plots == 5 and page.body.get("data-plots-rendered") == str(page.plots)  # every plot decoded
    assert "Paper numbers — not measured here" in dom.stdout

    shot = tmp_path / "page.png"
    result = chromium(tmp_path, page_path, "--window-size=1280,2000", f"--screenshot={shot}")
    assert result.returncode == 0 and shot.stat().st_size > 50_000  # a rendered page, not a blank one
    from PIL import Image

    colors = Image.open(shot).convert("RGB").resize((64, 100)).getcolors(maxcolors=64 * 100)
    assert len(colors) > 50  # tables, badges and plots: many distinct colours
