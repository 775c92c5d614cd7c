"""Shape-real models (harness/models/shapes.py, synthetic.py): the published architectures build on the meta device with
the published parameter counts, and the real processor classes with the checkpoints' settings give the number of
image/audio placeholder tokens that the families' documented rules give, recomputed here independently."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from harness.models import MODELS
from harness.models.llava.adapter import LlavaAdapter
from harness.models.qwen3_omni.adapter import Qwen3OmniAdapter
from harness.models.qwen3_vl.adapter import Qwen3VLAdapter
from harness.models.shapes import SHAPES
from harness.models.synthetic import build_model, build_processor, count_parameters, load_random
from harness.models.text.gguf_parts import PACKAGED
from harness.models.whisper.convert import PACKAGED as PACKAGED_SPEECH
from tasks.contract import Prompt

REAL = [
    "llava-v1.6-7b",
    "llava-v1.6-mistral-7b",
    "qwen3-vl-4b",
    "qwen3-vl-8b",
    "qwen3-omni-30b-a3b",
    "qwen3-8b",
    "llama-3.1-8b",
]
ADAPTERS = {"llava": LlavaAdapter, "qwen3_vl": Qwen3VLAdapter, "qwen3_omni": Qwen3OmniAdapter}


def rounded_like(value: float, published: float) -> bool:
    """`value` rounds to `published` at the precision it was published with (8.77e9: 3 significant digits)."""
    digits = len(f"{published / 10 ** math.floor(math.log10(published)):g}".replace(".", ""))
    scale = 10 ** (math.floor(math.log10(published)) - digits + 1)
    return abs(value - published) <= scale / 2


def test_every_registered_real_model_has_a_shape():
    # the models whose real weights install offline (gguf_parts, Whisper's CTranslate2 parts) load them: no
    # random-weight shape needed
    offline = set(PACKAGED) | set(PACKAGED_SPEECH)
    real = sorted(n for n, s in MODELS.items() if not s.hub_id.startswith("random:") and n not in offline)
    assert real == sorted(REAL) == sorted(SHAPES)
    for name in REAL:
        assert SHAPES[name]["hub_id"] == MODELS[name].hub_id
        assert set(SHAPES[name]["sources"]) >= {"config"}, f"{name}: where its config values were read"


@pytest.mark.parametrize("name", [n for n in REAL if n != "qwen3-omni-30b-a3b"])
def test_meta_build_has_the_published_parameter_count(name):
    model = build_model(name, MODELS[name].family)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    published, source = SHAPES[name]["published_params"]
    assert rounded_like(count_parameters(model), published), (name, count_parameters(model), source)


def test_qwen3_vl_8b_is_8_77b_and_qwen3_8b_has_6_95b_outside_the_embeddings():
    assert round(count_parameters(build_model("qwen3-vl-8b", "qwen3_vl")) / 1e9, 2) == 8.77
    text = build_model("qwen3-8b", "text")
    assert round(count_parameters(text, skip=("embed_tokens", "lm_head")) / 1e9, 2) == 6.95  # model card


def test_qwen3_omni_thinker_matches_the_published_text_backbone():
    model = build_model("qwen3-omni-30b-a3b", "qwen3_omni")
    assert not hasattr(model, "talker")  # enable_audio_output False: the thinker only
    backbone = model.thinker.model.language_model
    published, source = SHAPES["qwen3-omni-30b-a3b"]["published_params"]
    assert rounded_like(count_parameters(backbone, skip=("embed_tokens",)), published), source
    text = backbone.config
    assert (
        text.num_hidden_layers,
        text.num_attention_heads,
        text.num_key_value_heads,
        text.head_dim,
        text.num_experts,
        text.num_experts_per_tok,
    ) == (48, 32, 4, 128, 128, 8)
    # The audio tower (AuT, ~0.6B) and the vision tower come on top: the thinker is ~31.7B.
    assert 31.6e9 < count_parameters(model) < 31.8e9


# ----------------------------------------------------------------------------- placeholder counts
def llava_next_tokens(height: int, width: int, pinpoints, tile: int = 336, patch: int = 14) -> int:
    """LLaVA-NeXT anyres image tokens (haotian-liu/LLaVA: mm_utils.select_best_resolution and llava_arch.unpad_image):
    the base tile's (tile/patch)^2 features, plus the best pinpoint's grid of tiles with the padding rows/columns
    of the original aspect ratio removed and one newline token closing each row."""
    best, best_fit, best_waste = None, -1, None
    for ph, pw in pinpoints:
        scale = min(pw / width, ph / height)
        fit = min(int(width * scale) * int(height * scale), width * height)
        waste = ph * pw - fit
        if fit > best_fit or (fit == best_fit and waste < best_waste):
            best, best_fit, best_waste = (ph, pw), fit, waste
    side = tile // patch
    rows, cols = best[0] // tile * side, best[1] // tile * side
    if width / height > cols / rows:
        rows -= 2 * ((rows - int(height * cols / width)) // 2)
    else:
        cols -= 2 * ((cols - int(width * rows / height)) // 2)
    return side * side + rows * (cols + 1)


def qwen_image_tokens(height: int, width: int, factor: int = 32, min_tokens: int = 4, max_tokens: int = 16384) -> int:
    """Qwen-VL merged image tokens (qwen-vl-utils smart_resize, each 32x32 block one token for patch 16, merge 2):
    sides rounded to multiples of 32, scaled down (floor) above max_tokens blocks or up (ceil) below min_tokens."""
    h, w = round(height / factor), round(width / factor)
    if h * w > max_tokens:
        beta = math.sqrt(height * width / (max_tokens * factor * factor))
        h, w = math.floor(height / beta / factor), math.floor(width / beta / factor)
    elif h * w < min_tokens:
        beta = math.sqrt(min_tokens * factor * factor / (height * width))
        h, w = math.ceil(height * beta / factor), math.ceil(width * beta / factor)
    return h * w


def omni_audio_tokens(seconds: float) -> int:
    """Qwen3-Omni audio tokens: 100 mel frames a second (hop 160 at 16 kHz); each full 100-frame window gives 13
    tokens and the rest r frames ceil(ceil(ceil(r / 2) / 2) / 2), three stride-2 convolutions."""
    frames = int(seconds * 16000) // 160
    windows, rest = divmod(frames, 100)
    tail = math.ceil(math.ceil(math.ceil(rest / 2) / 2) / 2) if rest else 0
    return 13 * windows + tail


def meta_adapter(name: str):
    """The family adapter around `name`'s meta-device model and real-settings processor (inputs only, no compute)."""
    family = MODELS[name].family
    return ADAPTERS[family](MODELS[name], build_model(name, family), build_processor(name, family), device="cpu")


def picture(width: int, height: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8))


def placeholders(adapter, prompt: Prompt, token_id: int) -> int:
    return int((adapter.build_inputs(prompt)["input_ids"] == token_id).sum())


@pytest.mark.parametrize("width,height", [(640, 480), (336, 336), (1024, 899), (200, 1000), (1600, 400)])
def test_llava_images_get_the_anyres_token_count(width, height):
    adapter = meta_adapter("llava-v1.6-7b")
    expected = llava_next_tokens(height, width, SHAPES["llava-v1.6-7b"]["processor"]["image"]["image_grid_pinpoints"])
    assert placeholders(adapter, Prompt("q", images=[picture(width, height)]), 32000) == expected
    assert 576 < expected <= 576 + 48 * 49  # at most the 2x2 grid: the "~2,900 tokens" of a large image


def test_llava_640x480_is_2340_tokens():
    assert llava_next_tokens(480, 640, SHAPES["llava-v1.6-7b"]["processor"]["image"]["image_grid_pinpoints"]) == 2340


@pytest.mark.parametrize("name", ["qwen3-vl-8b", "qwen3-omni-30b-a3b"])
@pytest.mark.parametrize("width,height", [(640, 480), (100, 30), (1280, 720), (3000, 4000)])
def test_qwen_images_get_one_token_per_32_pixel_block(name, width, height):
    adapter = meta_adapter(name)
    expected = qwen_image_tokens(height, width)
    assert placeholders(adapter, Prompt("q", images=[picture(width, height)]), 151655) == expected


def test_qwen_reference_counts():
    assert qwen_image_tokens(480, 640) == 300  # 15 x 20 blocks of 32 px
    assert qwen_image_tokens(30, 100) == 8  # scaled up to at least 4 blocks (2 x 4 after the ceil)


@pytest.mark.parametrize("seconds", [1, 2.5, 10, 30, 400])
def test_qwen3_omni_clips_get_13_tokens_a_second(seconds):
    adapter = meta_adapter("qwen3-omni-30b-a3b")
    clip = np.zeros(int(seconds * 16000), dtype=np.float32)
    assert placeholders(adapter, Prompt("q", audios=[clip]), 151675) == omni_audio_tokens(seconds)
    assert omni_audio_tokens(seconds) == {1: 13, 2.5: 33, 10: 130, 30: 390, 400: 5200}[seconds]


# ----------------------------------------------------------------------------- random weights, end to end (shrunk)
TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 128,
}
QWEN_VISION = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": 64,
    "deepstack_visual_indexes": [0, 1],
}
# Narrow and shallow, but every size the processors and the caches read stays real: patch/merge sizes, the
# 336 px CLIP tiles, 128 mel bins, head_dim 128 (M-RoPE sections), the vocabularies with the real token ids.
SHRINK = {
    "llava": {
        "text_config": {**TEXT, "num_key_value_heads": 4},
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2},
    },
    "qwen3_vl": {"text_config": TEXT, "vision_config": QWEN_VISION},
    "qwen3_omni": {
        "thinker_config": {
            "text_config": {**TEXT, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
            "vision_config": QWEN_VISION,
            "audio_config": {
                "d_model": 32,
                "encoder_layers": 2,
                "encoder_attention_heads": 2,
                "encoder_ffn_dim": 64,
                "output_dim": 64,
                "downsample_hidden_size": 16,
            },
        }
    },
}


@pytest.mark.parametrize(
    "name,prompt,modality,expected",
    [
        ("llava-v1.6-mistral-7b", Prompt("What is written here?", images=[picture(640, 480)]), "image", 2340),
        ("qwen3-vl-4b", Prompt("What is written here?", images=[picture(640, 480)]), "image", 300),
        ("qwen3-omni-30b-a3b", Prompt("What is said?", audios=[np.zeros(3 * 16000, np.float32)]), "audio", 39),
    ],
)
def test_shrunk_random_models_generate_with_the_real_processors(name, prompt, modality, expected):
    """The model checks that the processor's placeholders match the features its towers produce, so this also
    shows processor settings and architecture agree."""
    import quant
    from harness.runner import answer

    spec = MODELS[name]
    adapter = load_random(ADAPTERS[spec.family], spec, device="cpu", dtype="float32", overrides=SHRINK[spec.family])
    assert adapter.weights == "random"
    [generation] = answer(adapter, [prompt], quant.get_method("oscar"), max_new_tokens=3)
    assert generation.modality_tokens[modality] == expected
    assert generation.new_tokens == 3
    cost = generation.cost
    assert cost["decode_steps"] == 2 and cost["prefill_s"] > 0 and cost["decode_s"] > 0
    assert cost["kv_bytes"] == generation.kv_bytes["total"] > 0 and cost["peak_cuda_bytes"] is None


def test_random_weights_are_seeded_and_refuse_a_device_map():
    spec = MODELS["qwen3-8b"]
    from harness.models.text.adapter import TextAdapter

    first, second, other = (
        load_random(TextAdapter, spec, device="cpu", dtype="float32", seed=s, overrides=TEXT) for s in (0, 0, 1)
    )
    w = [a.model.model.layers[0].self_attn.q_proj.weight for a in (first, second, other)]
    assert torch.equal(w[0], w[1]) and not torch.equal(w[0], w[2])
    with pytest.raises(ValueError, match="device-map"):
        load_random(TextAdapter, spec, device="cpu", device_map="auto", overrides=TEXT)


def test_the_registry_loads_random_weights_on_the_meta_device():
    """`oscar-eval eval --weights random` goes through harness.models.load; on the meta device it allocates nothing."""
    from harness import models as M

    adapter = M.load("qwen3-vl-8b", weights="random", device="meta")
    assert adapter.weights == "random" and adapter.model.device.type == "meta"
    assert round(count_parameters(adapter.model) / 1e9, 2) == 8.77
    with pytest.raises(ValueError, match="weights 'fake'"):
        M.load("qwen3-vl-8b", weights="fake")
