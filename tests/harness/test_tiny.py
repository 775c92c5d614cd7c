"""Tiny presets (harness/models/synthetic.py): real model/processor classes, shrunken configs, offline tokenizers,
deterministic."""

from __future__ import annotations

import pytest
import torch

from harness.models import load as load_adapter
from harness.models import tiny
from harness.models.common import count_modalities, modality_tags
from harness.models.qwen3_vl.adapter import smart_resize


@pytest.mark.parametrize(
    "family, model_cls",
    [
        ("llava", "LlavaNextForConditionalGeneration"),
        ("qwen3_vl", "Qwen3VLForConditionalGeneration"),
        ("qwen3_omni", "Qwen3OmniMoeForConditionalGeneration"),
    ],
)
def test_replica_is_the_real_class_and_deterministic(family, model_cls):
    a, b = tiny(family), tiny(family)
    assert type(a.model).__name__ == model_cls
    cfg = a.text_config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (2, 4, 2, 64)
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.equal(p, q), name
    assert sum(p.numel() for p in a.model.parameters()) < 2_000_000


def test_tokenizer_round_trip_and_specials():
    tok = tiny("qwen3_vl").tokenizer
    text = "Grüße <|image_pad|> 42"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert ids.count(tok.image_token_id) == 1 and tok.image_token_id >= 256


def test_registry_names_and_errors():
    from harness.models import MODELS

    assert {n for n, s in MODELS.items() if s.hub_id.startswith("random:")} == {
        "tiny-llava",
        "tiny-qwen3-vl",
        "tiny-qwen3-omni",
        "tiny-whisper",
    }
    assert load_adapter("tiny-qwen3-omni").spec.family == "qwen3_omni"
    with pytest.raises(KeyError, match="no tiny model 'gpt2'; choose one of tiny-llava"):
        tiny("gpt2")


def test_modality_helpers():
    ids = torch.tensor([[5, 9, 9, 7, 3]])
    tags = modality_tags(ids, {9: 1, 7: 3})
    assert tags.tolist() == [[0, 1, 1, 3, 0]]
    assert count_modalities(tags) == {"text": 2, "image": 2, "audio": 1}


def test_smart_resize_rule():
    assert smart_resize(480, 640, 32, 4 * 32 * 32, 16384 * 32 * 32) == (480, 640)
    h, w = smart_resize(20, 30, 32, 4 * 32 * 32, 16384 * 32 * 32)  # too small: scaled up to >= 4 tokens
    assert h % 32 == 0 and w % 32 == 0 and h * w >= 4 * 32 * 32
    h, w = smart_resize(4000, 3000, 8, 4 * 64, 64 * 64)  # too large: scaled down to <= 64 tokens
    assert h * w <= 64 * 64 and abs(h / w - 4 / 3) < 0.2
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 5000, 32, 1024, 10**7)
