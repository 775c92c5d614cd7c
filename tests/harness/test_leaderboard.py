"""`oscar-eval leaderboard`: tables only from result files, published numbers apart, README section."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tests.harness.test_results_factory import make_result

from harness import leaderboard as L
from harness import report_html
from harness import results as R
from harness.cli import main as cli

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """A results tree of hand-made runs: 3 OCRBench-like methods and 2 perplexity methods."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(REPO / "results" / "paper.json", tmp_path / "paper.json")
    cats = ["a", "b"] * 3
    for method, scores, bits, kv in (("bf16", [1, 1, 1, 0, 1, 1], 16, 4096), ("kivi", [1, 0, 0, 0, 1, 0], 3, 800),
                                     ("oscar", [1, 1, 0, 0, 1, 1], 3, 820)):
        R.write_result(make_result(method, scores, cats, bits=bits, kv_total=kv, task="ocrbench"),
                       R.run_path("ocrbench", "generated", "tiny-model", method))
    for method, ppl in (("bf16", [10.0, 11.0]), ("kivi", [13.0, 15.0])):
        R.write_result(make_result(method, ppl, metric="ppl", higher_is_better=False, task="ppl", model="smollm2-135m"),
                       R.run_path("ppl", "generated", "smollm2-135m", method))
    Path("README.md").write_text(f"# x\n\n## Results\n{L.README_START}\nold\n{L.README_END}\n\n## After\n")
    return tmp_path


def test_markdown_has_one_row_per_result_and_published_apart(workdir):
    assert cli(["leaderboard", "--paper", "paper.json"]) == 0
    md = Path("results/LEADERBOARD.md").read_text()
    measured, published = md.split("### Published numbers (not measured here)")
    rows = [line for line in measured.splitlines() if line.startswith("| ") and not line.startswith("| method")]
    assert len(rows) == 5
    assert "| kivi | 0.3333 [0.2333, 0.4333] | 6 | 3 | 0.7812 | 5.12x |" in measured  # 4096 / 800 bytes
    assert "ppl ↓ (95% CI)" in measured and "accuracy ↑ (95% CI)" in measured
    assert "| qwen3-vl-8b | 858 | 851 | 850 | 847 | 722 | 754 | 856 |" in published
    assert "858" not in measured  # published numbers never enter the measured tables
    readme = Path("README.md").read_text()
    assert "old" not in readme and md in readme and readme.endswith(f"{L.README_END}\n\n## After\n")


def test_invalid_result_file_stops_the_build(workdir, capsys):
    Path("results/runs/ppl.generated/smollm2-135m/oscar.json").write_text('{"schema_version": 1}')
    assert cli(["leaderboard", "--paper", "paper.json"]) == 2
    assert "oscar.json: $: 'date' is a required property" in capsys.readouterr().err


def test_pareto_front():
    # cost (x, lower better) and quality (y); (2, 0.5) is beaten by (1, 0.6)
    pts = [(16, 0.9), (3, 0.7), (2, 0.5), (1, 0.6), (3, 0.6)]
    assert report_html.pareto(pts, higher_is_better=True) == [0, 1, 3]
    assert report_html.pareto([(16, 10.0), (3, 12.0), (3, 11.0)], higher_is_better=False) == [0, 2]


def test_bench_rows_are_read_and_plotted(workdir):
    """harness.bench's JSON (one file per run folder) becomes one row per variant and point."""
    Path("results/bench/h100-a").mkdir(parents=True)
    kernels = [{"shape": "qwen3-8b", "batch": 1, "context": c, "sdpa_cudnn": 2.0 * c / 100, "oscar_cuda_us": c / 100,
                "speedup_cuda": 2.0, "floor_read_us": c / 200, "floor_read_config": "264 CTAs x 128"}
               for c in (4096, 32768)]
    Path("results/bench/h100-a/bench.json").write_text(json.dumps({"environment": {"device": "NVIDIA H100"}, "kernels": kernels}))
    rows = L.load_bench(Path("results/bench"))
    assert len(rows) == 6  # cuDNN, OScaR and the read floor at two contexts; the floor's config is not a time
    assert {(r["variant"], r["context"], r["time_us"]) for r in rows} >= {
        ("OScaR INT2 CUDA", 4096, 40.96), ("BF16 SDPA cuDNN", 32768, 655.36), ("read floor (bare stream)", 4096, 20.48)}
    assert all(r["run"] == "h100-a" and r["device"] == "NVIDIA H100" for r in rows)
    assert report_html.speed_plot(rows).startswith("data:image/png;base64,")
    assert report_html.latest_run([{"run": "h100-run9"}, {"run": "h100-run39"}, {"run": "h100-run36"}]) == "h100-run39"


def test_speed_tables_pivot_the_newest_run_and_follow_oscar_across_runs(workdir):
    """The page's bench tables: the newest run a row per point (graph times and floors only, where it has graph
    times), then OScaR's CUDA graph time at those points in each run that timed it, oldest first."""
    for run, t in (("h100-run9", 30.0), ("h100-run10", 25.0)):
        Path(f"results/bench/{run}").mkdir(parents=True)
        kernels = [{"shape": shape, "batch": 1, "context": c, "sdpa_cudnn": 99.0, "sdpa_cudnn_graph": 2 * t * k,
                    "oscar_cuda_us": 99.0, "oscar_cuda_graph_us": t * k, "floor_read_us": t * k / 2}
                   for k, c in ((1, 4096), (4, 131072)) for shape in ("qwen3-omni-thinker", "qwen3-8b")]
        Path(f"results/bench/{run}/bench-all.json").write_text(json.dumps(
            {"environment": {"device": "NVIDIA H100"}, "kernels": kernels}))
    html = report_html.speed_tables(L.load_bench(Path("results/bench")))
    newest = html[html.index('<table class="bench">'):html.index('<table class="history">')]
    assert "h100-run10: decode attention" in html and "99" not in newest  # the eager times stay in the JSON
    assert newest.index("OScaR INT2 CUDA graph") < newest.index("BF16 SDPA cuDNN graph") < newest.index("read floor")
    assert ("<tr><td>qwen3-8b</td><td>1</td><td>4096</td><td>25</td><td>50</td><td>12.5</td></tr>" in newest
            and newest.index("qwen3-8b") < newest.index("qwen3-omni-thinker"))  # Qwen3 first, whatever the file's order
    history = html[html.index('<table class="history">'):]
    assert "<th>h100-run9</th><th>h100-run10</th>" in history  # by run number, not by name
    assert "<tr><td>qwen3-omni-thinker</td><td>1</td><td>131072</td><td>120</td><td>100</td></tr>" in history


def test_html_shows_the_newest_runs_kernel_targets(workdir):
    """The speed section opens with the kernel targets of the newest bench run (bench_check), missed rows marked."""
    for run in ("h100-run99", "h100-run107"):
        Path(f"results/bench/{run}").mkdir(parents=True)
        shutil.copy(REPO / "results" / "bench" / run / "bench-all.json", f"results/bench/{run}/bench-all.json")
    assert cli(["leaderboard", "--paper", "paper.json"]) == 0
    page = Path("results/leaderboard/index.html").read_text()
    assert "Kernel targets, results/bench/h100-run107/bench-all.json" in page
    table = page[page.index('<table class="targets">'):]
    table = table[:table.index("</table>")]
    assert "<td>decode 1 x 128K vs best BF16</td><td>qwen3-8b</td><td>&gt;= 4.5</td><td>3.67</td>" in table
    assert table.count('class="missed"') == 11 and "<td>met</td>" in table  # run 107: 19 of 30 met

def test_speed_of_graph_decoded_runs_is_marked():
    r = make_result("oscar", [1.0, 0.0])
    assert "graphs" not in L.run_row(r, None)["tok/s"]
    r["system"]["graph_decode_share"] = 0.98  # OScaR's kernel path on a GPU: decode steps replayed as CUDA graphs
    assert L.run_row(r, None)["tok/s"] == "120 (graphs)"
