"""`oscar-eval bench-check`: the kernel issue's targets read from a bench JSON, and speed regressions between two runs
(the stored H100 runs 99 and 107 of results/bench, and small hand-made files for the edge cases)."""
import json

import pytest

from harness.bench import check as bc
from harness.cli import main as cli

RUN99 = "results/bench/h100-run99/bench-all.json"
RUN107 = "results/bench/h100-run107/bench-all.json"


def row(rows, target, shape):
    return next(r for r in rows if r["target"].startswith(target) and r["shape"] == shape)


def test_targets_of_run107():
    rows = bc.target_rows(bc.load(RUN107))
    r = row(rows, "decode 1 x 128K", "qwen3-8b")
    assert r["dirty"] == pytest.approx(3.67, abs=0.01) and r["clean"] == pytest.approx(3.61, abs=0.01)
    assert r["ceiling"] == pytest.approx(4.38, abs=0.01)  # the clean one is 4.76
    assert r["status"] == "MISSED, beyond the bare stream after the dirty flush"
    assert row(rows, "decode 64 x 4K", "qwen3-8b")["status"] == "met"
    assert row(rows, "decode 16 x 32K", "llava-7b")["status"] == "met"
    assert row(rows, "effective bandwidth 16 x 32K", "qwen3-8b")["status"] == "met"
    assert row(rows, "pack per step 16 x 32K", "qwen3-8b")["status"] == "met"
    assert row(rows, "e2e step 1 x 128K", "qwen3-8b (e2e)")["dirty"] == pytest.approx(12.3246 / 7.5839, rel=1e-3)
    kv = row(rows, "e2e KV memory", "qwen3-8b (e2e)")
    assert kv["dirty"] == pytest.approx(19368050688 / 3672299520)
    # 772 bytes a token and layer against 4096, and the 128-token bf16 window: 5.28x, below 5.3x for any kernel
    assert kv["ceiling"] == pytest.approx(131072 * 4096 / (131072 * 772 + 128 * 4096))
    assert kv["status"] == "MISSED, beyond the format's cap"
    big = row(rows, "e2e tokens/s, largest 128K batch", "qwen3-8b (e2e)")
    assert "3 vs 17 seqs" in big["target"] and big["status"] == "met"
    text = bc.format_targets(rows)
    assert "decode 1 x 128K vs best BF16" in text
    # a row met after the read-only flush alone is counted apart (run 107: the thinker's 16 x 32K bandwidth)
    assert "18 of 30 met after both flushes, 1 after the read-only one only, 11 missed" in text


@pytest.mark.parametrize("flushes, want", [
    ([(4.6, 4.9), (4.7, 5.0)], "met"),
    ([(4.3, 4.6), (4.6, 4.9)], "met (clean only)"),
    ([(4.3, 4.5), (4.49, 4.74)], "MISSED"),
    ([(4.3, 4.31), (4.49, 4.74)], "MISSED, beyond the bare stream after the dirty flush"),  # run 154's Qwen3 1 x 128K
    ([(4.6, 4.9), (4.3, 4.31)], "MISSED, beyond the bare stream"),  # only the clean flush misses, beyond its ceiling
    ([(4.6, 4.4), (4.3, 4.6)], "MISSED"),
    ([(4.3, 4.31), (4.4, 4.45)], "MISSED, beyond the bare stream"),
    ([(4.3, 4.31), (4.6, 4.9)], "met (clean only), beyond the bare stream"),
    ([(None, None), (None, None)], "no data"),
    ([(4.3, None), (None, None)], "MISSED"),
])
def test_status(flushes, want):
    assert bc.status(bc.Target("x", 4.5), flushes) == want


def test_lower_is_better_target():
    t = bc.Target("pack", 0.10, higher_is_better=False)
    assert bc.status(t, [(0.003, None)]) == "met" and bc.status(t, [(0.2, None)]) == "MISSED"


def test_compare_run99_with_run107_finds_the_clean_flush_regression():
    changes = bc.compare(bc.load(RUN99), bc.load(RUN107), 0.05)
    by = {(c["what"], *c["point"]): c for c in changes}
    r = by[("oscar_cuda_graph_clean_us", "qwen3-8b", 1, 4096)]
    assert r["regression"] and r["change"] == pytest.approx(16.99 / 13.98 - 1, abs=0.01)
    t = by[("oscar_triton_graph_us", "qwen3-8b", 1, 131072)]
    assert t["gated"] and not t["regression"] and t["change"] < -0.5  # the tl-order Triton decode: 2.2x faster
    assert not by[("sdpa_flash_clean", "qwen3-8b", 1, 1024)]["gated"]  # a baseline moved +330%: reported, not gated
    assert not by[("pack_block128_us", "qwen3-8b", 16, 32768)]["gated"]  # eager, host-bound
    assert by[("oscar graph_step_ms", 1, 131072)]["gated"] and not by[("bf16 graph_step_ms", 1, 131072)]["gated"]
    text = bc.format_changes(changes, 0.05)
    assert "REGRESSION" in text and "sdpa_flash_clean" not in text
    assert "sdpa_flash_clean" in bc.format_changes(changes, 0.05, show_all=True)


def test_cli_exit_status(tmp_path, capsys):
    assert cli(["bench-check", RUN107]) == 0
    assert cli(["bench-check", RUN107, "--require-targets"]) == 1  # targets are missed in run 107
    assert cli(["bench-check", RUN107, "--against", RUN99]) == 1
    assert cli(["bench-check", RUN107, "--against", RUN107]) == 0
    assert cli(["bench-check", RUN107, "--against", RUN99, "--max-slowdown", "25%"]) == 0
    out = capsys.readouterr().out
    assert "against results/bench/h100-run99" in out and "0 regression(s)" in out


def test_bad_inputs(tmp_path, capsys):
    cut = tmp_path / "cut.json"
    cut.write_text('{"kernels": [')
    other = json.loads(open(RUN107).read())
    other["environment"]["device"] = "NVIDIA H200"
    h200 = tmp_path / "h200.json"
    h200.write_text(json.dumps(other))
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"date": "x"}))
    assert cli(["bench-check", str(tmp_path / "missing.json")]) == 2
    assert cli(["bench-check", str(cut)]) == 2
    assert cli(["bench-check", str(empty)]) == 2
    assert cli(["bench-check", str(h200), "--against", RUN107]) == 2
    assert cli(["bench-check", RUN107, "--max-slowdown", "fast"]) == 2
    out = capsys.readouterr().out
    assert "no such file" in out and "not JSON" in out and "not a `make bench` result" in out
    assert "different GPUs" in out and "--max-slowdown 'fast'" in out


def test_parse_slowdown():
    assert bc.parse_slowdown("5%") == pytest.approx(0.05) and bc.parse_slowdown("0.1") == pytest.approx(0.1)
    with pytest.raises(bc.BenchFileError, match="negative"):
        bc.parse_slowdown("-1%")
