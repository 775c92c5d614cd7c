"""`oscar-eval leaderboard`: tables only from result files, the headline and the decisive tables of trained weights
first, pipeline checks collapsed at the end, published numbers apart, speed and memory from the bench reference of each
GPU kind, the README section (the headline table and links), numbers plain and intervals unbreakable."""

from __future__ import annotations

import html
import json
import math
import shutil
from pathlib import Path

import pytest

from harness import results as R
from harness.bench import check as bench_check
from harness.cli import main as cli
from harness.report import html as report_html
from harness.report import leaderboard as L
from harness.report import speed as S
from harness.report import tables as T
from tests.harness.test_bench_check import bench_file
from tests.harness.test_results_factory import make_result

REPO = Path(__file__).resolve().parents[2]


def real(result: dict) -> dict:
    result["model"]["replica"] = False
    return result


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """A results tree: 3 OCRBench methods on a tiny replica and one perplexity result of a real architecture with
    random weights (pipeline checks), 2 perplexity methods of trained weights (kivi with 2 failed items), the paper's
    numbers and the H100 bench reference."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(REPO / "results" / "paper.json", tmp_path / "paper.json")
    Path("results/bench").mkdir(parents=True)
    shutil.copy(REPO / "results" / "bench" / "h100.json", "results/bench/h100.json")
    cats = ["a", "b"] * 3
    for method, bits, kv in (("bf16", 16, 4096), ("kivi", 3, 800), ("oscar", 3, 820)):
        R.write_result(
            make_result(method, [0] * 6, cats, bits=bits, kv_total=kv, task="ocrbench"),
            R.run_path("ocrbench", "generated", "tiny-model", method),
        )
    for method, ppl in (("bf16", [10.0, 11.0, 12.0]), ("kivi", [13.0, 15.0, 14.0])):
        r = real(
            make_result(
                method,
                ppl,
                metric="ppl",
                higher_is_better=False,
                task="ppl",
                model="smollm2-135m",
                kv_total=4096 if method == "bf16" else 800,
            )
        )
        for sample, value in zip(r["samples"], ppl):  # what the ppl task aggregates (the paired tests redo it)
            sample["scores"].update(nll_sum=100 * math.log(value), n_tokens=100)
        if method == "kivi":
            r["samples"][1]["error"] = "RuntimeError: out of memory"
            r["samples"][2]["error"] = "RuntimeError: out of memory"
            r["n_errors"] = 2
        R.write_result(r, R.run_path("ppl", "generated", "smollm2-135m", method))
    shaped = real(
        make_result("oscar", [99.0, 98.0], metric="ppl", higher_is_better=False, task="ppl", model="qwen3-8b")
    )
    shaped["model"]["weights"] = "random"
    shaped["system"].update(items_per_s=2.5, kernel_step_share=1.0)
    R.write_result(shaped, R.run_path("ppl", "generated", "qwen3-8b.random", "oscar"))
    Path("README.md").write_text(f"# x\n\n## Results\n{L.README_START}\nold\n{L.README_END}\n\n## After\n")
    return tmp_path


def tables(md: str) -> dict[str, list[str]]:
    """{heading: the table's header and rows under it} of a markdown text (not the |---| line)."""
    out, title = {}, None
    for line in md.splitlines():
        if line.startswith("#"):
            title = line.lstrip("# ")
        elif line.startswith("| ") and title:
            out.setdefault(title, []).append(line)
    return out


def test_markdown_leads_with_trained_weights_and_collapses_the_pipeline_checks(workdir):
    assert cli(["leaderboard", "--paper", "paper.json"]) == 0
    md = Path("results/LEADERBOARD.md").read_text()
    t = tables(md)
    ppl = t["ppl · smollm2-135m (generated data)"]
    assert ppl[0].startswith(
        "| method | FP tokens | ppl ↓ (95% CI) | items | failed | bits/elt | KV KiB/item | vs bf16 |"
    )
    ci = T.NBSP.join(("11", "[10.9,", "11.1]"))  # the value and its interval: one unbreakable cell
    assert ppl[1].startswith(f"| bf16 | all | {ci} | 3 | 0 | 16 | 4 | 1.00x |")
    ci = T.NBSP.join(("14", "[13.9,", "14.1]"))
    assert ppl[2].startswith(f"| kivi | – | {ci} | 3 | 2 | 16 | 0.7812 | 5.12x |")  # 4096 / 800 bytes
    assert "1 GiB RSS" in ppl[1]
    checks = t["ocrbench · tiny-model (generated data, tiny replica)"]
    assert checks[0] == (
        "| method | FP tokens | items | failed | bits/elt | KV KiB/item | vs bf16 | tok/s "
        "| peak memory | device | commit |"
    )  # no accuracy column for random weights
    assert len(checks) == 1 + 3
    shaped = t["ppl · qwen3-8b (generated data, random weights)"]
    assert "items/s" in shaped[0] and "| 2.5 | 100% |" in shaped[1] and "99" not in shaped[1]  # no perplexity
    assert "qwen3-8b" not in md[: md.index("<details>")]  # never in an accuracy table
    order = [
        md.index(s)
        for s in (
            "### Headline: the real models against BF16 and KIVI",
            "### ppl · smollm2-135m",
            "### Speed and memory",
            "### Published numbers",
            "<details><summary>Pipeline checks: 4 results",
            "#### ocrbench · tiny-model (generated data, tiny replica)",
        )
    ]
    assert order == sorted(order) and md.rstrip().endswith("</details>")
    assert "| qwen3-vl-8b | 858 | 851 | 850 | 847 | 722 | 754 | 856 |" in md
    assert "858" not in md[: md.index("### Published numbers")]  # published numbers never enter the measured tables
    readme = Path("README.md").read_text()
    assert "\nold\n" not in readme and readme.endswith(f"{L.README_END}\n\n## After\n")
    section = readme[readme.index(L.README_START) : readme.index(L.README_END)]
    # the README is a manual: the headline table, as in LEADERBOARD.md, and links to the full tables, never a copy
    headline = md[md.index("### Headline") : md.index("### ppl · smollm2-135m")]
    title = "Headline: the real models against BF16 and KIVI"
    assert headline.strip() in section and tables(section) == {title: tables(md)[title]}  # one table, no other
    for full in ("### ppl · smollm2-135m", "Speed and memory", "Published numbers", "<details>", "Paired tests"):
        assert full not in section, full
    assert "#### Paired tests: ppl · smollm2-135m (generated data)" in md
    assert "[results/LEADERBOARD.md](results/LEADERBOARD.md)" in section
    assert "[results/leaderboard/index.html](results/leaderboard/index.html)" in section
    assert "the paper's published numbers and 4 pipeline checks (models without trained weights)" in section


def test_speed_and_memory_come_from_each_gpu_kinds_reference(workdir):
    Path("results/bench/h200.json").write_text(json.dumps(bench_file("NVIDIA H200")))
    assert cli(["leaderboard", "--paper", "paper.json"]) == 0
    md = Path("results/LEADERBOARD.md").read_text()
    h100 = tables(md)["Speed and memory: Decode end to end, Qwen3-8B shape, NVIDIA H100 80GB HBM3"]
    data = json.loads(Path("results/bench/h100.json").read_text())
    big = {r["kind"]: r for r in data["e2e"] if r.get("largest")}
    want = T.fmt(big["oscar"]["graph_tokens_per_s"] / big["bf16"]["graph_tokens_per_s"], 3)
    assert any(
        row.startswith(f"| 128K (largest batch that fits) | {big['bf16']['batch']} / {big['oscar']['batch']} |")
        and f"{float(want):.2f}x" in row
        for row in h100
    )
    h200 = tables(md)["Speed and memory: Decode end to end, Qwen3-8B shape, NVIDIA H200"]
    assert h200[1] == "| 128K | 1 / 1 | 12.3 | 7.58 | – | – | – | 18 | 3.42 | – | – |"
    assert md.index("NVIDIA H100 80GB HBM3") < md.index("NVIDIA H200")  # by file name: h100.json, h200.json


def test_the_public_page_shows_speed_and_memory_never_the_kernel_targets(workdir):
    assert any(
        t["status"].startswith("MISSED") for t in bench_check.target_rows(bench_check.load("results/bench/h100.json"))
    )  # the reference misses some: they would show if the page read the targets
    assert cli(["leaderboard", "--paper", "paper.json"]) == 0
    page = Path("results/leaderboard/index.html").read_text()
    md = Path("results/LEADERBOARD.md").read_text()
    readme = Path("README.md").read_text()
    assert "Decode end to end, Qwen3-8B shape" in page and "Decode attention, us" in page  # speed and memory
    for text in (page, md, readme):
        assert "MISSED" not in text and "beyond the bare stream" not in text and "Kernel targets" not in text
        assert "kernel targets" not in text


def test_bench_runs_are_never_a_gpu_kind(workdir, capsys):
    run = {**bench_file("NVIDIA H200"), "date": "20260102T000000Z"}
    Path("results/bench/runs").mkdir()
    Path("results/bench/runs/bench-20260102T000000Z.json").write_text(json.dumps(run))  # `oscar-eval bench` writes it
    assert cli(["leaderboard", "--paper", "paper.json"]) == 0
    md = Path("results/LEADERBOARD.md").read_text()
    assert "NVIDIA H200" not in md and "bench-2026" not in md
    assert list(S.load_bench(Path("results/bench"))) == ["h100"]

    Path("results/bench/bench-20260102T000000Z.json").write_text(json.dumps(run))  # a run written beside the kinds
    assert cli(["leaderboard", "--paper", "paper.json"]) == 2
    assert "bench-20260102T000000Z.json: a bench run, not a GPU kind's reference" in capsys.readouterr().err
    Path("results/bench/bench-20260102T000000Z.json").unlink()

    shutil.copy("results/bench/h100.json", "results/bench/h100-rerun.json")  # a run of a kind, under another name
    assert cli(["leaderboard", "--paper", "paper.json"]) == 2
    assert "two bench references of one GPU (NVIDIA H100 80GB HBM3)" in capsys.readouterr().err


def test_a_file_that_is_not_a_bench_reference_stops_the_build(workdir, capsys):
    Path("results/bench/notes.json").write_text('{"rows": []}')
    assert cli(["leaderboard", "--paper", "paper.json"]) == 2
    assert "results/bench/notes.json: not a `make bench` result" in capsys.readouterr().err


def test_invalid_result_file_stops_the_build(workdir, capsys):
    Path("results/runs/ppl.generated/smollm2-135m/oscar.json").write_text('{"schema_version": 1}')
    assert cli(["leaderboard", "--paper", "paper.json"]) == 2
    assert "oscar.json: $: 'date' is a required property" in capsys.readouterr().err


def test_models_without_trained_weights_are_pipeline_checks():
    r = real(make_result("oscar", [1.0]))
    assert not T.is_pipeline_check(r)
    assert T.is_pipeline_check(make_result("oscar", [1.0]))  # the factory's tiny replica
    for marker in ({"random_weights": True}, {"weights": "random"}):  # a real architecture with random weights
        assert T.is_pipeline_check({**r, "model": {**r["model"], **marker}})
    random = {**r, "model": {**r["model"], "weights": "random"}, "_path": "b"}
    real_groups, checks = L.group_runs([{**r, "_path": "a"}, random])
    assert [g[0]["_path"] for g in real_groups.values()] == ["a"] and [g[0]["_path"] for g in checks.values()] == ["b"]
    # what a random-weight run carries: speed, memory and the code path, shown where recorded; no accuracy
    random["system"] = {**random["system"], "items_per_s": 0.5, "kernel_step_share": 1.0}
    t = T.result_table(("ocrbench", "generated", "qwen3-vl-8b"), [random], pipeline_check=True)
    assert t.title == "ocrbench · qwen3-vl-8b (generated data, random weights)"
    assert t.header[:4] == ["method", "FP tokens", "items", "failed"]
    assert "items/s" in t.header and "kernel steps" in t.header
    assert t.rows[0][t.header.index("kernel steps")] == "100%"
    assert "items/s" not in T.result_table(("ppl", "official", "m"), [{**r, "_path": "a"}]).header


def test_failed_items_read_from_whichever_field_records_them():
    r = make_result("oscar", [1.0, 0.0, 1.0])
    assert T.failed_items(r) == 0
    r["samples"][0]["error"] = "ValueError: bad image"
    del r["n_errors"]
    assert T.failed_items(r) == 1  # counted from the samples
    r["n_errors"] = 3
    assert T.failed_items(r) == 3
    r["system"]["failed_items"] = 2
    assert T.failed_items(r) == 2


def test_pareto_front():
    # cost (x, lower better) and quality (y); (2, 0.5) is beaten by (1, 0.6)
    pts = [(16, 0.9), (3, 0.7), (2, 0.5), (1, 0.6), (3, 0.6)]
    assert report_html.pareto(pts, higher_is_better=True) == [0, 1, 3]
    assert report_html.pareto([(16, 10.0), (3, 12.0), (3, 11.0)], higher_is_better=False) == [0, 2]


def test_bench_tables_and_plots_of_a_reference():
    data = {**bench_check.load(REPO / "results" / "bench" / "h100.json"), "_path": "results/bench/h100.json"}
    kernels = S.kernel_table("h100", data)
    assert len(kernels.rows) == len(data["kernels"])
    assert [row[0] for row in kernels.rows] == sorted((row[0] for row in kernels.rows), key=S.shape_rank)
    first = next(k for k in data["kernels"] if (k["shape"], k["batch"], k["context"]) == ("qwen3-8b", 1, 1024))
    assert kernels.rows[0][:4] == ["qwen3-8b", "1", "1024", T.fmt(first["oscar_cuda_graph_us"], 3)]
    for plot in (report_html.speed_plot(data), report_html.memory_plot(data)):
        assert plot.startswith("data:image/png;base64,")
    assert report_html.speed_plot({"kernels": []}) is None and report_html.memory_plot({"e2e": []}) is None


def test_result_plots_leave_out_what_has_nothing_to_show():
    runs = [
        real(make_result(m, s, ["a", "b"] * 2, bits=b))
        for m, s, b in (("bf16", [1, 1, 1, 0], 16), ("kivi", [1, 0, 0, 0], 3), ("oscar", [1, 1, 0, 0], 3.1))
    ]
    style = report_html.colours(["bf16", "kivi", "oscar"])
    assert style["bf16"][0] != style["kivi"][0] != style["oscar"][0]
    assert report_html.tradeoff_plot(runs, "t", style).startswith("data:image/png;base64,")
    assert report_html.category_plot(runs, "t", style).startswith("data:image/png;base64,")
    zeros = [make_result(m, [0] * 4, ["a", "b"] * 2) for m in ("bf16", "kivi")]
    assert report_html.category_plot(zeros, "t", style) is None  # all bars zero: no chart


def test_speed_of_graph_decoded_runs_is_marked():
    r = make_result("oscar", [1.0, 0.0])
    assert "graphs" not in T.run_row(r, None)["tok/s"]
    r["system"]["graph_decode_share"] = 0.98  # OScaR's kernel path on a GPU: decode steps replayed as CUDA graphs
    assert T.run_row(r, None)["tok/s"] == "120 (graphs)"


def test_own_paper_settings_get_their_own_table():
    from harness.report.leaderboard import group_runs

    def run(folder, method, window):
        r = make_result(method, [1.0, 0.0])
        r["method"]["config"]["residual_length"] = window
        r["_path"] = f"results/runs/{folder}/smollm2-135m/{method}.json"
        return r

    real, checks = group_runs([run("ppl", "oscar", 128), run("ppl", "quarot", 128), run("ppl-own-paper", "quarot", 0)])
    assert sorted(k[0] for k in {**real, **checks}) == ["ppl", "ppl-own-paper"]


def test_whole_benchmark_cost_is_extrapolated_from_real_size_runs():
    from harness.report import eval_cost

    r = make_result("oscar", [0.0, 0.0], task="ocrbench")
    r["model"].update(weights="random", replica=False, name="qwen3-vl-8b")
    r["environment"]["gpu"] = "NVIDIA H100 80GB HBM3"
    r["system"].update(items_per_s=0.5, peak_item_cuda_bytes=3 * 2**30, kernel_step_share=1.0)
    replica = make_result("oscar", [0.0], task="ocrbench")
    replica["model"].update(weights="random", replica=True)
    rows = eval_cost.cost_rows([r, replica])
    assert list(rows) == [("ocrbench", "qwen3-vl-8b", "NVIDIA H100 80GB HBM3")]
    # 1,000 items at 2 s an item
    [row] = rows[("ocrbench", "qwen3-vl-8b", "NVIDIA H100 80GB HBM3")]
    assert row[3:] == ["2.00", "0.56 h", "kernels", "3.00 GiB"]


def test_numbers_are_written_plain_never_with_an_exponent():
    assert T.fmt(1163.4, 3) == "1163" and T.fmt(999.6, 3) == "1000" and T.fmt(1756.3, 3) == "1756"
    assert T.fmt(12.34, 3) == "12.3" and T.fmt(99.96, 3) == "100" and T.fmt(None) == "–"
    # the whole range plain: tiny and huge values too (a KL near zero, a broken method's perplexity)
    assert T.fmt(1.234e-5, 3) == "0.0000123" and T.fmt(2.5e6) == "2500000" and T.fmt(-0.0004567, 2) == "-0.00046"
    assert T.signed(1968.4) == "+1968" and T.signed(-0.25) == "-0.25" and T.signed(0.0) == "+0"
    from harness.stats import PairedResult

    cell = T.difference_cell(PairedResult(1968.4, 1500.0, 2400.0, 0.002, 22))  # a paired-difference cell
    assert cell == "+1968 (0.002)" and "e+" not in cell and "e-" not in cell


def test_paired_tables_test_each_method_against_bf16_and_oscar():
    scores = {"bf16": [1, 1, 1, 1, 0, 1, 1, 1], "kivi": [0, 0, 1, 0, 0, 1, 0, 0], "oscar": [1, 1, 1, 1, 0, 1, 0, 1]}
    runs = []
    for method, s in scores.items():
        r = real(make_result(method, s, model="smollm2-135m"))
        r["_path"] = f"results/runs/handmade/smollm2-135m/{method}.json"
        runs.append(r)
    t = T.paired_table("handmade · smollm2-135m", runs)
    assert t.header == ["method", "accuracy vs bf16", "accuracy vs oscar"]
    rows = {row[0]: row[1:] for row in t.rows}
    assert rows["bf16"][0] == "–" and rows["oscar"][1] == "–"
    delta, p = rows["kivi"][0].split()
    assert float(delta) == pytest.approx(2 / 8 - 7 / 8, abs=1e-3) and float(p.strip("()")) < 0.05
    from harness.report.compare import compare

    report = compare(runs[2], runs[1], "accuracy", 1000, seed=0)["total"]  # the CLI's test of the same pair
    assert rows["kivi"][1] == f"{T.signed(report['delta'])} ({T.fmt(report['p_value'], 2)})"
    board = L.build_board(runs, None, {})
    assert "#### Paired tests: handmade · smollm2-135m" in L.markdown(board)
    assert "Paired tests" not in L.markdown(board, short=True)  # the README's section stays short
    other = real(make_result("quarot", [1, 0, 1], model="smollm2-135m"))  # other items: no paired test
    assert T.paired_cells(runs[0], other, ["accuracy"]) == ["–"]


def test_asr_tables_show_the_reference_nll_beside_the_wer():
    runs = []
    for method, nll in (("bf16", 1.70), ("oscar", 1.75)):
        r = real(make_result(method, [5.0, 4.0], metric="wer", higher_is_better=False, task="asr"))
        r["metrics"]["nll"] = {**r["metrics"]["wer"], "value": nll, "ci_low": nll - 0.1, "ci_high": nll + 0.1}
        r["_path"] = f"results/runs/asr/whisper-base/{method}.json"
        runs.append(r)
    t = T.result_table(("asr", "generated", "whisper-base"), runs)
    assert t.header[2:4] == ["wer ↓ (95% CI)", "nll ↓ (95% CI)"]
    assert t.rows[1][3] == "1.75 [1.65, 1.85]"
    assert T.paired_metrics(runs[0]) == ["wer", "nll"]
    ppl = real(make_result("bf16", [5.0], metric="ppl", higher_is_better=False, task="ppl"))
    ppl["metrics"]["nll"] = dict(ppl["metrics"]["ppl"])
    assert T.paired_metrics(ppl) == ["ppl"]  # perplexity is exp(NLL): one of the two


def test_interval_cells_never_wrap_in_markdown_or_html():
    """A value and its interval, or a difference and its p-value, is one reading: its spaces are non-breaking in the
    markdown and its cell nowrap on the page, in the result, paired and headline tables alike."""
    runs = []
    for method, s in (("bf16", [1, 1, 0, 1]), ("oscar", [1, 0, 0, 1])):
        r = real(make_result(method, s, model="smollm2-135m"))
        r["_path"] = f"results/runs/handmade/smollm2-135m/{method}.json"
        runs.append(r)
    board = L.build_board(runs, None, {})
    (t, _), paired, headline = board.results[0], board.paired[board.results[0][0].title], board.headline
    for table, column in ((t, "accuracy ↑ (95% CI)"), (paired, "accuracy vs bf16"), (headline, "vs bf16")):
        i = table.header.index(column)
        assert i in table.nowrap and " " in table.rows[-1][i]  # the cell holds spaces to keep
        cell = T.md_table(table).splitlines()[-1].split(" | ")[i]
        assert cell == table.rows[-1][i].replace(" ", T.NBSP) and " " not in cell
        assert f'<td class="nobreak">{html.escape(table.rows[-1][i])}</td>' in report_html.table(table, "runs")
    assert "td.nobreak{white-space:nowrap}" in report_html.STYLE
    assert "<td>oscar</td>" in report_html.table(t, "runs")  # other cells wrap as they need


def run_in(folder: str, method: str, metrics: tuple[str, ...] = ()) -> dict:
    """A trained-weight perplexity run in results/runs/<folder>/<model>/, with extra metrics (kl, top1) if named."""
    task = folder.split(".")[0]
    r = real(make_result(method, [10.0, 12.0], metric="ppl", higher_is_better=False, task=task, model="smollm2-135m"))
    for m in metrics:
        r["metrics"][m] = dict(r["metrics"]["ppl"])
    r["_path"] = f"results/runs/{folder}/smollm2-135m/{method}.json"
    return r


def test_the_tables_that_separate_methods_come_first():
    """Reading order: perplexity with KL / top-1 (the most sensitive to a lossy cache), the needle tests, the other
    tasks, own-paper settings, and asr last (Whisper's short decodes leave every method inside the intervals), not
    the alphabetical order that led with asr."""
    runs = [
        run_in("asr", "bf16"),
        run_in("ppl-4k", "bf16"),
        run_in("ppl-own-paper", "bf16"),
        run_in("niah-4k", "bf16"),
        run_in("ppl", "bf16", ("kl", "top1")),
        run_in("ocrbench", "bf16"),
    ]
    board = L.build_board(runs, None, {})
    order = [t.title.split(" · ")[0] for t, _ in board.results]
    assert order == ["ppl", "niah-4k", "ocrbench", "ppl-4k", "ppl-own-paper", "asr"]
    assert board.niah_at == 2  # the needle-in-a-haystack summaries follow the needle tables
    md = L.markdown(board)
    assert md.index("### ppl · smollm2-135m") < md.index("### niah-4k") < md.index("### asr")


def test_the_headline_gives_each_real_model_its_verdict_against_bf16_and_kivi():
    bf16 = [1, 1, 1, 1, 0, 1, 1, 1] * 3
    scores = {
        "bf16": bf16,
        "kivi": [0, 0, 1, 0, 0, 1, 0, 0] * 3,
        "oscar": [0] + bf16[1:],  # one item from BF16: not separated from it
        "oscar-scaling-only": bf16,  # an ablation: the full tables' business, not the headline's
    }

    def run(model, method, folder="handmade"):
        r = real(make_result(method, scores[method], model=model, kv_total=4000 if method == "bf16" else 500))
        r["_path"] = f"results/runs/{folder}/{model}/{method}.json"
        for i, sample in enumerate(r["samples"]):  # oscar's answer leaves BF16's at item 0's second token
            sample["tokens"] = [5, 6] if method == "bf16" or i else [5, 7]
        return r

    runs = [run("smollm2-135m", m) for m in scores] + [run("qwen2.5-0.5b", m) for m in ("bf16", "kivi")]
    runs += [run("smollm2-135m", m, "niah-4k") for m in ("bf16", "oscar")]
    for r in runs[:2]:  # perplexity's distance to BF16's distribution, where a result has it
        r["metrics"]["kl"] = {**r["metrics"]["accuracy"], "value": 0.1097, "higher_is_better": False}
        r["metrics"]["top1"] = {**r["metrics"]["accuracy"], "value": 0.8335}
    board = L.build_board(runs, None, {})
    h = board.headline
    assert h.header == [
        "model · task",
        "metric",
        "method",
        "value (95% CI)",
        "as bf16",
        "KV KiB/item",
        "KV vs bf16",
        "vs bf16",
        "vs kivi",
    ]
    methods = [row[2].removesuffix(" (stale)") for row in h.rows]  # hand-made results have no commit: stale
    # one block a model's first table (KL first in the reading order), then its needle test; no ablation
    assert methods == ["bf16", "kivi", "oscar", "bf16", "oscar", "bf16", "kivi"]
    assert h.rows[0][0] == "handmade · smollm2-135m (generated data)" and h.rows[1][:2] == ["", ""]
    assert h.rows[3][0] == "niah-4k · smollm2-135m (generated data)"
    assert h.rows[5][:2] == ["handmade · qwen2.5-0.5b (generated data)", "accuracy ↑"]
    kivi, oscar = h.rows[1], h.rows[2]
    assert kivi[4] == "KL 0.11 · top-1 83%" and h.rows[0][4] == "–"  # BF16 against itself: nothing to show
    assert oscar[4] == "same 96% of 24"  # no distribution metrics: the items whose tokens equal BF16's
    assert h.rows[4][4] == "same 96% of 24"
    assert kivi[6] == "8.00x" and kivi[7].startswith("worse -") and kivi[8] == "–"
    assert oscar[7].startswith("n.s. -") and oscar[8].startswith("better +")
    readme = L.markdown(board, short=True)
    assert h.title in readme and "### handmade" not in readme  # the headline, never the full tables


def test_the_full_precision_budget_column_names_sinks_and_window():
    def method(**config):
        return {"name": "x", "config": config}

    assert T.fp_tokens(method(method="bf16", dtype="model")) == "all"
    assert T.fp_tokens(method(method="kivi", residual_length=128)) == "128"
    assert T.fp_tokens(method(method="together-oscar", sink_tokens=64, residual_length=256)) == "64 + 256"
    assert T.fp_tokens(method(method="together-oscar", sink_tokens=0, residual_length=128)) == "128"
    assert T.fp_tokens(method(method="quarot", residual_length=0)) == "0"
    assert T.fp_tokens(method(method="custom")) == "–"
