"""`oscar-eval compare`: deltas, paired tests, flipped items, exit codes and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import results as R
from harness.cli import main as cli
from tests.harness.test_results_factory import make_result

A_SCORES = [1, 1, 1, 1, 0, 1, 0, 1, 1, 1]  # 0.8
B_SCORES = [1, 0, 1, 0, 0, 1, 0, 0, 1, 1]  # 0.5: 3 items flipped right -> wrong
CATS = ["x"] * 5 + ["y"] * 5


def write(tmp_path, name, result):
    return str(R.write_result(result, tmp_path / f"{name}.json"))


def test_same_run_passes_a_strict_gate(tmp_path, capsys):
    a = write(tmp_path, "a", make_result("bf16", A_SCORES, CATS))
    b = write(tmp_path, "b", make_result("oscar", A_SCORES, CATS))
    assert cli(["compare", a, b, "--max-drop", "0"]) == 0
    assert "gate: ok: B is better or equal by 0, allowed 0" in capsys.readouterr().out


def test_regression_fails_the_gate_and_lists_flips(tmp_path, capsys):
    a = write(tmp_path, "a", make_result("bf16", A_SCORES, CATS))
    b = write(tmp_path, "b", make_result("kivi", B_SCORES, CATS))
    out_json = tmp_path / "cmp.json"
    assert cli(["compare", a, b, "--max-drop", "0.1", "--json", str(out_json)]) == 1
    out = capsys.readouterr().out
    assert "FAIL: B is worse by 0.3, allowed 0.1, p = 0.04995" in out
    # 3 discordant pairs all one way: p = 2 * 0.5**3 = 0.25
    assert "A-only right 3, B-only right 0, p=0.25" in out
    assert "flipped items (3):" in out and "item-1 [x] 1 -> 0" in out
    report = json.loads(out_json.read_text())
    assert report["total"]["delta"] == pytest.approx(-0.3)
    assert report["categories"]["x"]["delta"] == pytest.approx(-0.4)  # 0.8 -> 0.4
    assert report["categories"]["y"]["delta"] == pytest.approx(-0.2)  # 0.8 -> 0.6
    assert report["total"]["ci_low"] <= -0.3 <= report["total"]["ci_high"] <= 0
    assert report["gate"]["failed"] is True
    # The same drop passes a looser gate, absolute or relative (0.3 / 0.8 = 37.5%).
    assert cli(["compare", a, b, "--max-drop", "0.5"]) == 0
    assert cli(["compare", a, b, "--max-drop", "40%"]) == 0
    assert cli(["compare", a, b, "--max-drop", "30%"]) == 1


def test_lower_is_better_metric_direction(tmp_path, capsys):
    kw = dict(metric="ppl", higher_is_better=False)
    a = write(tmp_path, "a", make_result("bf16", [10.0, 12.0, 11.0, 9.0], **kw))
    b = write(tmp_path, "b", make_result("kivi", [12.0, 13.0, 12.0, 11.0], **kw))
    assert cli(["compare", a, b, "--max-drop", "1"]) == 1  # ppl rose by 1.5: worse
    assert cli(["compare", b, a, "--max-drop", "0"]) == 0  # ppl fell: better
    out = capsys.readouterr().out
    assert "lower is better" in out and "largest per-item changes of 'ppl'" in out


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(version=2), "version: 1 vs 2"),
        (dict(fingerprint="fp-2"), "data_fingerprint: 'fp-1' vs 'fp-2'"),
        (dict(task="other"), "name: 'handmade' vs 'other'"),
    ],
)
def test_incompatible_runs_are_refused_with_the_reason(tmp_path, capsys, change, words):
    a = write(tmp_path, "a", make_result("bf16", A_SCORES))
    b = write(tmp_path, "b", make_result("kivi", A_SCORES, **change))
    assert cli(["compare", a, b]) == 2
    err = capsys.readouterr().err
    assert "runs are not comparable" in err and words in err


def test_bad_inputs_exit_2(tmp_path, capsys):
    a = write(tmp_path, "a", make_result("bf16", A_SCORES))
    assert cli(["compare", a, a, "--max-drop", "lots"]) == 2
    assert "--max-drop 'lots' is not a number" in capsys.readouterr().err
    assert cli(["compare", a, a, "--metric", "bleu"]) == 2
    assert "metric 'bleu' is not in A (accuracy)" in capsys.readouterr().err
    assert cli(["compare", a, str(tmp_path / "missing.json")]) == 2
    assert "no such result file" in capsys.readouterr().err


def test_method_names_and_stored_baselines_resolve(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for method, scores in (("bf16", A_SCORES), ("kivi", B_SCORES)):
        R.write_result(make_result(method, scores), R.run_path("handmade", "generated", "tiny-model", method))
    R.write_result(make_result("bf16", A_SCORES), "results/baselines/handmade.generated/tiny-model/bf16.json")
    assert cli(["compare", "bf16", "kivi"]) == 1  # one run dir holds both: found without flags; a regression
    assert "bf16 (A) -> kivi (B)" in capsys.readouterr().out
    assert cli(["compare", "baseline:bf16", "kivi", "--max-drop", "0.1"]) == 1
    assert cli(["compare", "bf16", "oscar"]) == 2
    assert "ambiguous or not found" in capsys.readouterr().err


@pytest.mark.skipif("ocrbench" not in __import__("tasks").list_tasks(), reason="tasks.ocrbench not registered yet")
def test_real_task_aggregate_gives_category_deltas(tmp_path, capsys):
    # OCRBench-shaped records: per-item scores["score"] in {0, 1}; the metric "total" is the summed points
    # (tasks.ocrbench.score.aggregate), so per-category deltas are points won or lost in that category.
    cats = ["Regular Text Recognition"] * 5 + ["Doc-oriented VQA"] * 5
    kw = dict(task="ocrbench", metric="total", score_key="score")
    a = write(tmp_path, "a", make_result("bf16", A_SCORES, cats, **kw))
    b = write(tmp_path, "b", make_result("kivi", B_SCORES, cats, **kw))
    assert cli(["compare", a, b, "--json", str(tmp_path / "c.json"), "--max-drop", "3"]) == 0
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["total"]["delta"] == -3
    assert report["categories"]["Regular Text Recognition"]["delta"] == -2  # 4 -> 2 points
    assert report["categories"]["Doc-oriented VQA"]["delta"] == -1  # 4 -> 3 points
    assert report["items"]["test"]["name"] == "mcnemar_exact" and report["warnings"] == []


def test_gpu_runs_with_different_kernels_are_flagged(tmp_path, capsys):
    ra, rb = make_result("oscar", A_SCORES, CATS), make_result("oscar", A_SCORES, CATS)
    for r, linear in ((ra, True), (rb, False)):
        r["environment"].update(
            gpu="NVIDIA H100", kernels={"fused_norm": True, "fused_rope": True, "fused_linear": linear}
        )
    a, b = write(tmp_path, "a", ra), write(tmp_path, "b", rb)
    assert cli(["compare", a, b, "--max-drop", "0"]) == 0  # a warning, not a failure
    assert "different model-level kernels on the GPU (fused_linear True vs False)" in capsys.readouterr().out
    rb["environment"]["kernels"] = {**ra["environment"]["kernels"], "cuda_graphs": False}  # speed only: no warning
    a, b = write(tmp_path, "a1", ra), write(tmp_path, "b1", rb)
    assert cli(["compare", a, b]) == 0
    assert "model-level kernels" not in capsys.readouterr().out
    # a switch an older file lacks reads as that run's setting: wide_decode was off before it was recorded
    rb["environment"]["kernels"] = {**ra["environment"]["kernels"], "wide_decode": False}
    a, b = write(tmp_path, "a3", ra), write(tmp_path, "b3", rb)
    assert cli(["compare", a, b]) == 0
    assert "model-level kernels" not in capsys.readouterr().out
    rb["environment"]["kernels"]["wide_decode"] = True
    a, b = write(tmp_path, "a4", ra), write(tmp_path, "b4", rb)
    assert cli(["compare", a, b]) == 0
    assert "(wide_decode False vs True)" in capsys.readouterr().out
    for r in (ra, rb):  # on a CPU they never act: no warning
        r["environment"]["gpu"] = None
    a, b = write(tmp_path, "a2", ra), write(tmp_path, "b2", rb)
    assert cli(["compare", a, b]) == 0
    assert "model-level kernels" not in capsys.readouterr().out


def test_same_method_with_other_settings_is_flagged(tmp_path, capsys):
    # A default that changed between code versions (OScaR's value_rotation, absent from older result files).
    ra, rb = make_result("oscar", A_SCORES, CATS), make_result("oscar", A_SCORES, CATS)
    ra["method"]["config"].pop("value_rotation", None)
    rb["method"]["config"]["value_rotation"] = "offline"
    a, b = write(tmp_path, "a", ra), write(tmp_path, "b", rb)
    assert cli(["compare", a, b, "--max-drop", "0"]) == 0  # a warning, not a failure
    assert "oscar ran with different settings (value_rotation None vs 'offline')" in capsys.readouterr().out
    rb["method"]["config"] = dict(ra["method"]["config"])
    a, b = write(tmp_path, "a1", ra), write(tmp_path, "b1", rb)
    assert cli(["compare", a, b]) == 0
    assert "different settings" not in capsys.readouterr().out


def test_the_gate_is_on_by_default_and_ignores_noise(tmp_path, capsys):
    """No flag: a significant drop exits 1; a drop the paired test cannot tell from noise exits 0; --alpha 1 gates on
    the drop alone."""
    a = write(tmp_path, "a", make_result("bf16", A_SCORES, CATS))
    b = write(tmp_path, "b", make_result("kivi", B_SCORES, CATS))
    assert cli(["compare", a, b]) == 1
    assert "gate: FAIL: B is worse by 0.3, allowed 0" in capsys.readouterr().out
    one_flip = list(A_SCORES)
    one_flip[next(i for i, x in enumerate(one_flip) if x == 1)] = 0
    c = write(tmp_path, "c", make_result("kivi", one_flip, CATS))
    assert cli(["compare", a, c]) == 0
    assert "but not significantly (--alpha)" in capsys.readouterr().out
    assert cli(["compare", a, c, "--alpha", "1"]) == 1
    assert cli(["compare", a, c, "--alpha", "0"]) == 2


def test_committed_kivi_fails_against_oscar_without_flags(capsys):
    """The README's gate on the committed SmolLM2 perplexity results: KIVI's higher perplexity is a significant
    regression from OScaR's, OScaR against itself is not."""
    runs = R.RUNS_DIR.resolve() if R.RUNS_DIR.is_absolute() else Path(__file__).resolve().parents[2] / R.RUNS_DIR
    oscar, kivi = (str(runs / "ppl" / "smollm2-135m" / f"{m}.json") for m in ("oscar", "kivi"))
    assert cli(["compare", oscar, kivi]) == 1
    assert cli(["compare", oscar, oscar]) == 0


def test_runs_on_other_processors_are_flagged(tmp_path, capsys):
    ra, rb = make_result("oscar", A_SCORES, CATS), make_result("oscar", A_SCORES, CATS)
    ra["environment"]["cpu"], rb["environment"]["cpu"] = "AMD EPYC x2", "Intel(R) Xeon(R) Processor x2"
    a, b = write(tmp_path, "a", ra), write(tmp_path, "b", rb)
    assert cli(["compare", a, b]) == 0  # a warning, not a failure
    assert "ran on different processors (AMD EPYC x2 vs Intel(R) Xeon(R) Processor x2)" in capsys.readouterr().out


def test_batch_sizes_outside_the_invariant_mode_are_flagged_loudly(tmp_path, capsys):
    ra, rb = make_result("oscar", A_SCORES, CATS), make_result("oscar", A_SCORES, CATS)
    ra["system"]["batch_size"], rb["system"]["batch_size"] = 1, 16
    a, b = write(tmp_path, "a", ra), write(tmp_path, "b", rb)
    assert cli(["compare", a, b]) == 0  # a warning, not a failure
    assert "BATCH SIZES DIFFER (1 vs 16) outside the batch-invariant mode" in capsys.readouterr().out
    for r in (ra, rb):  # both invariant: the batch size cannot move an answer
        r["environment"]["kernels"] = {"batch_invariant": True}
    a, b = write(tmp_path, "a1", ra), write(tmp_path, "b1", rb)
    assert cli(["compare", a, b]) == 0
    assert "BATCH SIZES" not in capsys.readouterr().out
    rb["environment"].update(kernels={"batch_invariant": False}, gpu="NVIDIA H200")  # one invariant, one not
    a, b = write(tmp_path, "a2", ra), write(tmp_path, "b2", rb)
    assert cli(["compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "one run is batch-invariant and the other is not (kernels batch_invariant True vs False)" in out
    assert "model-level kernels" not in out


def test_a_method_name_finds_its_partial_run(tmp_path, monkeypatch, capsys):
    """A run over the first N items (<method>.first<N>.json) is found by its method name when it is the only one."""
    monkeypatch.chdir(tmp_path)
    folder = Path("results/runs/handmade.generated/tiny-model")
    R.write_result(make_result("bf16", A_SCORES), folder / "bf16.first10.json")
    R.write_result(make_result("kivi", A_SCORES), folder / "kivi.first10.json")
    assert cli(["compare", "bf16", "kivi"]) == 0
    assert "bf16 (A) -> kivi (B)" in capsys.readouterr().out
