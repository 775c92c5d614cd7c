"""The three multimodal adapters on their tiny random-weight replicas (real classes and processors).

Prompts are long enough (> 128 positions) that every quantizing method stores part of the prefill in
packed codes, so decoding attends over quantized keys and values.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

import quant
from harness.models import tiny, traits_of
from harness.models.base import AUDIO, IMAGE, TEXT, cache_argument
from harness.runner import Runner, answer
from tasks.contract import Prompt

QUESTION = "Read every word printed on the sign in this picture and say what colour the sign is. " * 2
FAMILIES = ("llava", "qwen3_vl", "qwen3_omni")


def scene() -> Image.Image:
    """A small photo-like scene: sky gradient, a red sign with text, a tree."""
    img = Image.new("RGB", (96, 72))
    px = img.load()
    for y in range(72):
        for x in range(96):
            px[x, y] = (90 + y, 140 + y, 230 - y) if y < 48 else (60, 120 - (x % 7), 40)
    d = ImageDraw.Draw(img)
    d.rectangle([10, 12, 60, 36], fill=(200, 30, 30))
    d.text((14, 18), "STOP", fill=(255, 255, 255))
    d.ellipse([70, 20, 90, 50], fill=(30, 110, 40))
    return img


def voice(seconds: float = 4.0) -> np.ndarray:
    """Speech-like audio at 16 kHz: a gliding harmonic tone with a 4 Hz syllable envelope."""
    t = np.arange(int(16000 * seconds)) / 16000
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.5 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16000
    wave = sum(np.sin(k * phase) / k for k in range(1, 6)) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)) ** 2
    return (0.2 * wave).astype(np.float32)


@pytest.fixture(scope="module", params=FAMILIES)
def adapter(request):
    return tiny(request.param)


def prompt_for(adapter) -> Prompt:
    if adapter.spec.family == "qwen3_omni":
        return Prompt(QUESTION, audios=[voice()])
    return Prompt(QUESTION, images=[scene()])


def media_code(adapter) -> int:
    return AUDIO if adapter.spec.family == "qwen3_omni" else IMAGE


def first_steps(adapter, inputs, cache):
    """Greedy 2-token generation: (new ids [1, 2], logits of the first decode step [1, V])."""
    with torch.inference_mode():
        out = adapter.generator.generate(
            **inputs,
            **cache_argument(cache),
            max_new_tokens=2,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[:, inputs["input_ids"].shape[1] :], out.logits[1]


def runner(adapter, method):
    """The eval loop's runner for `method` (a preset name) on the tiny model."""
    return Runner(adapter, quant.get_method(method), traits=traits_of(adapter.spec.name))


def new_ids(adapter, inputs, cache, max_new_tokens: int):
    """Greedy new token ids [1, new] with `cache` (None: the model's own DynamicCache)."""
    with torch.inference_mode():
        out = adapter.generator.generate(
            **inputs, **cache_argument(cache), max_new_tokens=max_new_tokens, do_sample=False
        )
    return out[:, inputs["input_ids"].shape[1] :]


@pytest.mark.parametrize("method", quant.list_methods())
def test_generate_every_method(adapter, method):
    prompt = prompt_for(adapter)
    [gen] = answer(adapter, [prompt], method, max_new_tokens=6)
    assert gen.input_tokens > 128, "the prompt must be long enough to quantize part of the prefill"
    assert gen.new_tokens == 6 and isinstance(gen.text, str)
    media = "audio" if media_code(adapter) == AUDIO else "image"
    assert gen.modality_tokens[media] > 0 and gen.modality_tokens["text"] > 0
    assert sum(gen.modality_tokens.values()) == gen.input_tokens
    assert gen.kv_bytes["total"] > 0
    if method != "bf16":
        assert gen.kv_bytes["quantized"] > 0, f"{method} stored nothing in packed form"


def test_bf16_matches_default_cache_tokens(adapter):
    prompt = prompt_for(adapter)
    inputs = adapter.build_inputs(prompt)
    reference = new_ids(adapter, inputs, None, 12)
    with runner(adapter, "bf16") as bf16:
        ours = new_ids(adapter, inputs, bf16.make_cache(inputs), 12)
    assert torch.equal(reference, ours)


def test_first_decode_step_after_quantized_prefill(adapter):
    """bf16: the first decode step's logits equal the default cache's (positions, masks and M-RoPE
    deltas are derived from the cache's logical length). OScaR: the prefill is packed, the cache still
    reports the full logical length, and decoding stays close to the reference."""
    inputs = adapter.build_inputs(prompt_for(adapter))
    length = inputs["input_ids"].shape[1]
    ref_ids, ref_logits = first_steps(adapter, inputs, None)
    with runner(adapter, "bf16") as bf16:
        bf16_ids, bf16_logits = first_steps(adapter, inputs, bf16.make_cache(inputs))
    assert torch.equal(ref_ids, bf16_ids)
    torch.testing.assert_close(bf16_logits, ref_logits, rtol=0, atol=1e-5)

    with runner(adapter, "oscar") as oscar:
        cache = oscar.make_cache(inputs)
        ids, logits = first_steps(adapter, inputs, cache)
    assert cache.get_seq_length() == length + 1  # prompt + first generated token (the second is not fed)
    assert cache.layers[0].k_q.num_tokens == (length // 128) * 128
    cos = torch.nn.functional.cosine_similarity(logits.float(), ref_logits.float(), dim=-1).item()
    assert cos > 0.9, f"first decode step after a quantized prefill drifted: cosine {cos:.3f}"


def test_modality_tags_match_placeholders(adapter):
    inputs = adapter.build_inputs(prompt_for(adapter))
    ids = inputs["input_ids"]
    tags = adapter.tags(inputs)
    code = media_code(adapter)
    placeholder = {v: k for k, v in adapter.token_modality().items()}[code]
    assert torch.equal(tags == code, ids == placeholder)
    assert torch.equal(tags == TEXT, ids != placeholder)
    with runner(adapter, "oscar") as oscar:
        assert torch.equal(oscar.make_cache(inputs).modalities, tags)


def test_placeholder_count_follows_the_processor(adapter):
    """The number of media positions is what the vision/audio encoder produces for this input."""
    inputs = adapter.build_inputs(prompt_for(adapter))
    n = int((adapter.tags(inputs) == media_code(adapter)).sum())
    family = adapter.spec.family
    if family == "qwen3_vl":
        assert n == int(inputs["image_grid_thw"].prod()) // 4  # 2x2 spatial merge
    elif family == "qwen3_omni":
        from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

        assert n == int(_get_feat_extract_output_lengths(inputs["feature_attention_mask"].sum(-1)))
        assert 12 * 4 <= n <= 14 * 4  # ~13 audio tokens per second of 16 kHz audio
    else:
        with torch.inference_mode():
            feats = adapter.model.model.get_image_features(inputs["pixel_values"], inputs["image_sizes"])
        feats = feats.pooler_output if hasattr(feats, "pooler_output") else feats
        assert n == sum(f.shape[0] for f in feats)


def test_wrong_modality_is_a_clear_error():
    llava = tiny("llava")
    with pytest.raises(ValueError, match="audio"):
        llava.build_inputs(Prompt("hi", audios=[voice(1.0)]))


def save_like_a_checkpoint(adapter, path):
    """Weights, tokenizer, one merged preprocessor_config.json and chat_template.jinja, as hub repos ship."""
    import json

    adapter.model.save_pretrained(path)
    if not hasattr(adapter.processor, "video_processor"):  # LLaVA: processor_config.json carries patch_size etc.
        adapter.processor.save_pretrained(path)
        return
    adapter.tokenizer.save_pretrained(path)
    merged = {}
    for part in ("feature_extractor", "image_processor"):
        if getattr(adapter.processor, part, None) is not None:
            merged.update(getattr(adapter.processor, part).to_dict())
    (path / "preprocessor_config.json").write_text(json.dumps(merged))
    (path / "chat_template.jinja").write_text(adapter.processor.chat_template)


@pytest.mark.parametrize(
    "family, name", [("llava", "llava-v1.6-7b"), ("qwen3_vl", "qwen3-vl-4b"), ("qwen3_omni", "qwen3-omni-30b-a3b")]
)
def test_registry_load_from_model_path(tmp_path, family, name):
    """The real loading path (registry -> Adapter.load -> processor without torchvision) on a saved
    replica gives the same inputs and tokens as the replica itself."""
    from harness.models import load

    replica = tiny(family)
    save_like_a_checkpoint(replica, tmp_path)
    loaded = load(name, model_path=str(tmp_path), dtype="float32")
    loaded.max_image_tokens = getattr(replica, "max_image_tokens", None)  # the replica's small image budget
    prompt = prompt_for(replica)
    a, b = replica.build_inputs(prompt), loaded.build_inputs(prompt)
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert torch.equal(new_ids(replica, a, None, 4), new_ids(loaded, b, None, 4))


def test_missing_weights_name_the_hub_id_and_the_fix(tmp_path, monkeypatch):
    from harness.models import load
    from harness.models.base import ModelLoadError

    monkeypatch.delenv("MODEL_PATH", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match=r"Qwen/Qwen3-VL-8B-Instruct.*MODEL_PATH"):
        load("qwen3-vl-8b")
    monkeypatch.setenv("MODEL_PATH", str(tmp_path))
    with pytest.raises(ModelLoadError, match="config.json"):
        load("llava-v1.6-7b")
