"""`oscar-eval bench --what eval` (harness/bench/harnesses.py): lmms-eval's native LLaVA class and the project's
plugin answer the same items from one saved checkpoint, each timed after an untimed first batch."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("lmms_eval")
pytest.importorskip("decord")  # lmms-eval's llava_hf imports it at module level

from harness.bench import harnesses, main  # noqa: E402


def options(tmp_path, **changes):
    values = dict(
        what="eval",
        out=str(tmp_path / "bench.json"),
        eval_model="tiny-llava",
        eval_task="ocrbench",
        eval_data="generated",
        eval_limit=2,
        eval_batches="1,2",
        eval_quant="oscar",
        eval_max_new_tokens=4,
        eval_checkpoint=str(tmp_path / "checkpoint"),
        eval_seed=0,
    )
    return SimpleNamespace(**{**values, **changes})


def test_native_class_and_plugin_answer_the_same_items_from_one_checkpoint(tmp_path):
    assert main(options(tmp_path)) == 0
    result = json.loads((tmp_path / "bench.json").read_text())["eval"]
    assert result["items"] == 2 and result["max_new_tokens"] == 4
    rows = {(r["system"], r["method"], r["batch"]): r for r in result["rows"]}
    # lmms-eval's llava_hf answers one request at a time: no native row at batch 2
    assert set(rows) == {
        ("lmms-eval llava_hf", "bf16 (transformers' cache)", 1),
        ("oscar-eval (lmms-eval plugin)", "oscar", 1),
        ("oscar-eval (lmms-eval plugin)", "oscar", 2),
    }
    for r in rows.values():
        assert r["items_per_s"] > 0 and r["new_tokens_per_s"] > 0 and r["prompt_tokens_mean"] > 0
        assert r["setup_s"] >= 0 and r["load_s"] > 0
    assert rows[("lmms-eval llava_hf", "bf16 (transformers' cache)", 1)]["same_answers_as_native"] == 1.0
    assert rows[("oscar-eval (lmms-eval plugin)", "oscar", 2)]["same_answers_as_native"] is None
    # the checkpoint is saved once and reused
    assert (tmp_path / "checkpoint" / "config.json").is_file()
    assert harnesses.save_checkpoint("tiny-llava", tmp_path / "checkpoint", "cpu") == tmp_path / "checkpoint"


def test_a_family_without_a_native_class_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no native lmms-eval class"):
        harnesses.run_eval(options(tmp_path, eval_model="tiny-qwen3-omni"))


def test_the_timed_span_excludes_the_untimed_first_batch():
    calls = []

    class Fake:  # stands for an lmms-eval model: records what each generate_until call answered
        def generate_until(self, reqs):
            calls.append(len(reqs))
            return ["x"] * len(reqs)

    row = harnesses.time_system(Fake, list(range(5)), [], 2, "cpu", lambda lm, c: None)
    assert calls == [2, 5] and row["answers"] == ["x"] * 5
    assert row["items_per_s"] == pytest.approx(5 / row["wall_s"])


def test_a_native_class_that_cannot_run_here_is_named_before_anything_loads(monkeypatch):
    """Qwen3-VL's native class needs torchvision (its processor's video part), which a CPU machine must not have;
    a module that does not import names the error and the install."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchvision" else real(name, *a))
    with pytest.raises(SystemExit, match="qwen3_vl class needs torchvision"):
        harnesses.check_native(harnesses.NATIVE["qwen3_vl"])
    broken = harnesses.Native("no_such_module.anywhere", "X", "x", None)
    with pytest.raises(SystemExit, match=r"x class does not import here \(ModuleNotFoundError.*pip install lmms-eval"):
        harnesses.check_native(broken)
    harnesses.check_native(harnesses.NATIVE["llava"])  # installed by make setup: passes


def test_a_processor_without_its_video_part_is_saved_with_the_rest(tmp_path):
    """A processor built without torchvision lacks Qwen3-VL's video processor; the checkpoint keeps the tokenizer,
    the image processor's settings and the chat template."""
    from harness import models

    adapter = models.load("tiny-qwen3-vl")
    if adapter.processor.video_processor is not None:
        pytest.skip("torchvision is installed here: the processor has its video part")
    harnesses.save_processor(adapter.processor, tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert {"tokenizer.json", "chat_template.jinja", "processor_config.json"} <= names
    assert '"image_processor"' in (tmp_path / "processor_config.json").read_text()
