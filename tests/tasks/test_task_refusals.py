"""Runs that cannot give a real number are refused with the cause: a model that cannot read the task's
inputs (before any weights load), and a run where every item failed (no result of 0 written); failures
of a finished run are listed under the summary table."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import models as M
from harness import run
from harness.cli import main as cli
from tasks.base import failure_summary
from tasks.mmau_pro import MMAUProTask, generate


@pytest.fixture()
def no_weights(monkeypatch):
    """Loading any model fails the test: refusals must come first."""

    def load(name, **options):
        raise AssertionError(f"weights of {name} were loaded before the refusal")

    monkeypatch.setattr(M, "load", load)


def test_a_text_model_is_refused_on_ocrbench(no_weights):
    with pytest.raises(ValueError) as err:
        run.evaluate("smollm2-135m", "bf16", task="ocrbench", data="generated")
    message = str(err.value)
    assert "smollm2-135m cannot run ocrbench: it reads text, the task needs image, text (no image)" in message
    assert "models that can: llava-v1.6-7b, llava-v1.6-mistral-7b, qwen3-omni-30b-a3b, qwen3-vl-4b" in message


def test_an_image_model_is_refused_on_mmau_pro(no_weights):
    with pytest.raises(
        ValueError,
        match=r"tiny-llava cannot run mmau-pro: .*\(no audio\); "
        r"models that can: qwen3-omni-30b-a3b, tiny-qwen3-omni$",
    ):
        run.evaluate("tiny-llava", "bf16", task="mmau-pro", data="generated")


def test_the_cli_exits_non_zero_with_the_refusal(no_weights, capsys):
    assert cli(["eval", "--model", "qwen3-vl-4b", "--quant", "oscar", "--task", "mmau-pro"]) == 2
    assert "qwen3-vl-4b cannot run mmau-pro" in capsys.readouterr().err


def test_every_registered_family_says_what_it_reads(monkeypatch):
    assert all(M.family_of(name).reads for name in M.MODELS)
    M.refuse_unreadable(MMAUProTask(), "qwen3-omni-30b-a3b")  # reads audio: no error
    monkeypatch.setitem(M.MODELS, "x", M.ModelSpec("x", "random:x", "speech", "ppl"))
    with pytest.raises(KeyError, match="unknown model family 'speech'.*FAMILY in its __init__.py"):
        M.refuse_unreadable(MMAUProTask(), "x")


@pytest.fixture(scope="module")
def aif_only(tmp_path_factory) -> Path:
    """Two generated AIF items: the first with its clip, the second without."""
    import pyarrow.parquet as pq

    source = generate.ensure_generated(tmp_path_factory.mktemp("cache"))
    table = pq.read_table(source / "test.parquet")
    rows = [r for r in table.to_pylist() if r["category"] == "instruction following"][:2]
    rows[1] = dict(rows[1], audio_path=["data/not-there.wav"])
    target = tmp_path_factory.mktemp("aif")
    (target / "data").mkdir()
    for rel in rows[0]["audio_path"]:
        (target / rel).write_bytes((source / rel).read_bytes())
    pq.write_table(table.from_pylist(rows, schema=table.schema), target / "test.parquet")
    return target


def test_a_run_where_every_item_failed_exits_non_zero(aif_only, tmp_path, capsys, monkeypatch):
    import pyarrow.parquet as pq

    monkeypatch.setenv("MMAU_PRO_JUDGE", "smollm2-135m")  # the run checks its judge before the first item

    table = pq.read_table(aif_only / "test.parquet")
    rows = [dict(r, audio_path=["data/gone.wav"]) for r in table.to_pylist()]
    pq.write_table(table.from_pylist(rows, schema=table.schema), tmp_path / "test.parquet")
    out = tmp_path / "{method}.json"
    code = cli(
        [
            "eval",
            "--model",
            "tiny-qwen3-omni",
            "--quant",
            "bf16",
            "--task",
            "mmau-pro",
            "--data",
            str(tmp_path),
            "--out",
            str(out),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "mmau-pro with bf16: all 2 items failed, no result written" in err
    assert "audio 'data/gone.wav' not found" in err and not (tmp_path / "bf16.json").exists()


def test_the_summary_lists_failures(aif_only, tmp_path, monkeypatch):
    from harness.models import tiny

    monkeypatch.setenv("MMAU_PRO_JUDGE", "smollm2-135m")  # the run checks its judge before the first item

    [result] = run.evaluate(
        "tiny-qwen3-omni",
        "bf16",
        task=MMAUProTask(max_new_tokens=4),
        data=str(aif_only),
        adapter=tiny("qwen3_omni"),
        out=str(tmp_path / "{method}.json"),
    )
    assert result["n_errors"] == 1 and result["categories"]["instruction following"]["metrics"]["n_failed_audio"] == 1
    assert failure_summary(result["samples"]) == {"audio": {"n": 1, "first": result["samples"][1]["error"]}}
    table = run.summary_table([result])
    assert "bf16: 1 of 2 items failed (audio); first: item gen-" in table
