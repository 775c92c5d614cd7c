"""Model families (harness/models/<family>/): each registered model's family exists, reads what it says and names
classes quant/ can find; a new family is one folder and one registry line, and runs every method."""

from __future__ import annotations

import pytest

import quant
from harness import models as M
from harness.models.base import ModelSpec


def test_every_registered_model_has_a_family_folder():
    assert set(M.FAMILIES) >= {"text", "llava", "qwen3_vl", "qwen3_omni", "whisper"}
    for name, spec in M.MODELS.items():
        family = M.family_of(name)
        assert family.name == spec.family and family.reads, name
        assert M.adapter_class(name).__name__.endswith("Adapter"), name
        if family.name == "whisper":  # speech in, and only its attentions' value fold (harness/models/whisper)
            assert family.reads == ("audio",) and family.traits.value_fold and not family.traits.attention
            continue
        assert "text" in family.reads, name
        assert family.traits.attention and family.traits.norm, name  # what preparing the model may touch


def test_a_family_from_one_folder_and_one_registry_line_runs_every_method(tmp_path, monkeypatch):
    """LLaVA-NeXT on a Qwen2 text model: the folder tests/harness/families/llava_qwen2/ (FAMILY and its tiny size),
    registered by its module path, and one model line; generated OCRBench items through every method of 'all'."""
    from harness.run import evaluate

    monkeypatch.setitem(M.FAMILIES, "llava_qwen2", "tests.harness.families.llava_qwen2")
    monkeypatch.setitem(
        M.MODELS,
        "tiny-llava-qwen2",
        ModelSpec("tiny-llava-qwen2", "random:tiny-llava-qwen2", "llava_qwen2", "ocrbench"),
    )
    adapter = M.load("tiny-llava-qwen2")
    assert any(type(m).__name__ == "Qwen2Attention" for m in adapter.model.modules())
    results = evaluate(
        "tiny-llava-qwen2",
        "all",
        task="ocrbench",
        data="generated",
        limit=2,
        batch_size=2,
        out=str(tmp_path / "{task}" / "{model}" / "{method}.json"),
    )
    assert [r["method"]["name"] for r in results] == quant.list_methods()
    for result in results:
        assert result["model"]["family"] == "llava_qwen2" and result["system"]["batch_size"] == 2
        for sample in result["samples"]:
            assert "error" not in sample and sample["new_tokens"] > 0 and len(sample["tokens_sha1"]) == 16
            assert (sample["kv_bytes"]["quantized"] > 0) == (result["method"]["name"] != "bf16")


def test_an_unknown_family_says_how_to_add_one(monkeypatch):
    monkeypatch.setitem(M.MODELS, "x", ModelSpec("x", "random:x", "speech", "ppl"))
    with pytest.raises(KeyError, match="unknown model family 'speech'"):
        M.load("x")
