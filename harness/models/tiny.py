"""Tiny random-weight replicas of the three multimodal families, built offline.

Real model and processor classes with shrunken configs (text hidden 64, 2 layers, 4 query / 2 KV
heads, head_dim 64 so value groups of 32 channels fit; 2-layer vision and audio encoders), a byte-level tokenizer built
with the `tokenizers` library (256 byte tokens plus each family's special tokens) and chat templates in each
family's format. Weights are random with a fixed seed: outputs are meaningless but deterministic, and
every code path of the real models runs (anyres tiling, M-RoPE, deepstack, the MoE thinker, the audio
encoder).

    build("qwen3_vl") -> Qwen3VLAdapter          load("tiny-qwen3-vl") through the registry
"""
from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessorPil,
    LlavaNextProcessor,
    PreTrainedTokenizerFast,
    Qwen2VLImageProcessorPil,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeForConditionalGeneration,
    Qwen3OmniMoeProcessor,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    WhisperFeatureExtractor,
)

from harness.models.base import ModelSpec
from harness.models.common import parse_dtype, without_video
from harness.models.llava import LlavaAdapter
from harness.models.qwen3_omni import Qwen3OmniAdapter
from harness.models.qwen3_vl import Qwen3VLAdapter

VOCAB = 320  # 256 byte tokens + specials, rounded up
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, vocab_size=VOCAB, max_position_embeddings=4096)
MROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [16, 8, 8], "mrope_interleaved": True}
QWEN_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, spatial_merge_size=2,
                   temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=64, deepstack_visual_indexes=[1])
QWEN_TOKENS = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "vision_bos_token": "<|vision_start|>",
               "vision_eos_token": "<|vision_end|>", "audio_token": "<|audio_pad|>",
               "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>"}

# ChatML with Qwen's media markers; the real checkpoints ship longer templates with the same output.
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'audio' %}<|audio_start|><|audio_pad|><|audio_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Vicuna format of llava-hf/llava-v1.6-vicuna-7b-hf: images first, then the question.
LLAVA_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'][0]['text'] }} "
    "{% elif m['role'] == 'user' %}USER: {% for c in m['content'] %}{% if c['type'] == 'image' %}<image>\n"
    "{% endif %}{% endfor %}{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %} {% else %}ASSISTANT: {{ m['content'][0]['text'] }}</s>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def byte_tokenizer(eos: str, pad: str, named: dict[str, str], others: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """Byte-level BPE without merges: ids 0-255 are bytes, specials follow in the order given.

    named: attribute -> token string (e.g. image_token), exposed as tokenizer.image_token(_id).
    """
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = list(dict.fromkeys([eos, pad, *others, *named.values()]))
    tok.add_special_tokens(specials)
    if len(alphabet) + len(specials) > VOCAB:
        raise ValueError(f"{len(alphabet) + len(specials)} tokens do not fit the tiny vocabulary of {VOCAB}")
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=pad, extra_special_tokens=named)


def _seeded(model_cls, config, seed: int):
    """The model with seeded random weights. Normalization gains are drawn from U(0.5, 1.5) instead of
    their init value 1: with all-ones gains Qwen3's k_norm makes every key norm exactly sqrt(H * D),
    which would hide any token-norm structure from the diagnostics."""
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight") and param.dim() == 1:
                param.uniform_(0.5, 1.5)
    return model


def build_llava(seed: int = 0):
    """(LlavaNextForConditionalGeneration, LlavaNextProcessor): CLIP 16 px / patch 4, anyres 32x32."""
    tokenizer = byte_tokenizer("</s>", "<unk>", {"image_token": "<image>"}, ("<s>",))
    config = LlavaNextConfig(
        text_config={"model_type": "llama", **TEXT, "pad_token_id": tokenizer.pad_token_id,
                     "eos_token_id": tokenizer.eos_token_id},
        vision_config={"model_type": "clip_vision_model", "image_size": 16, "patch_size": 4, "hidden_size": 32,
                       "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "projection_dim": 32},
        image_grid_pinpoints=[[32, 32]], vision_feature_select_strategy="default",
        image_token_index=tokenizer.image_token_id,
    )
    image_processor = LlavaNextImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16},
                                                 image_grid_pinpoints=[[32, 32]])
    processor = LlavaNextProcessor(image_processor, tokenizer, patch_size=4, vision_feature_select_strategy="default",
                                   num_additional_image_tokens=1, chat_template=LLAVA_TEMPLATE)
    return _seeded(LlavaNextForConditionalGeneration, config, seed), processor


def _qwen_image_processor():
    return Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2,
                                    min_pixels=4 * 8 * 8, max_pixels=64 * 8 * 8)


def build_qwen3_vl(seed: int = 0):
    """(Qwen3VLForConditionalGeneration, Qwen3VLProcessor without a video processor)."""
    tokenizer = byte_tokenizer("<|im_end|>", "<|endoftext|>", QWEN_TOKENS, ("<|im_start|>",))
    ids = {k: tokenizer.convert_tokens_to_ids(v) for k, v in QWEN_TOKENS.items()}
    config = Qwen3VLConfig(
        text_config={**TEXT, "rope_parameters": MROPE, "pad_token_id": tokenizer.pad_token_id,
                     "eos_token_id": tokenizer.eos_token_id},
        vision_config=QWEN_VISION, image_token_id=ids["image_token"], video_token_id=ids["video_token"],
        vision_start_token_id=ids["vision_bos_token"], vision_end_token_id=ids["vision_eos_token"],
    )
    processor = without_video(Qwen3VLProcessor)(_qwen_image_processor(), tokenizer, video_processor=None,
                                                chat_template=QWEN_TEMPLATE)
    return _seeded(Qwen3VLForConditionalGeneration, config, seed), processor


def build_qwen3_omni(seed: int = 0):
    """(Qwen3OmniMoeForConditionalGeneration without talker, Qwen3OmniMoeProcessor without video).
    Audio: Whisper features (128 mel bins, 16 kHz) into a 2-layer encoder; text: 4-expert MoE, 2 per token."""
    tokenizer = byte_tokenizer("<|im_end|>", "<|endoftext|>", QWEN_TOKENS, ("<|im_start|>",))
    ids = {k: tokenizer.convert_tokens_to_ids(v) for k, v in QWEN_TOKENS.items()}
    thinker = {
        "text_config": {**TEXT, "rope_parameters": MROPE, "num_experts": 4, "num_experts_per_tok": 2,
                        "moe_intermediate_size": 32, "pad_token_id": tokenizer.pad_token_id,
                        "eos_token_id": tokenizer.eos_token_id},
        "vision_config": QWEN_VISION,
        "audio_config": {"d_model": 32, "encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 64,
                         "num_mel_bins": 128, "output_dim": 64, "downsample_hidden_size": 16},
        "image_token_id": ids["image_token"], "video_token_id": ids["video_token"],
        "audio_token_id": ids["audio_token"], "audio_start_token_id": ids["audio_bos_token"],
        "vision_start_token_id": ids["vision_bos_token"], "audio_end_token_id": ids["audio_eos_token"],
    }
    config = Qwen3OmniMoeConfig(thinker_config=thinker, enable_audio_output=False)
    processor = without_video(Qwen3OmniMoeProcessor)(
        image_processor=_qwen_image_processor(), video_processor=None,
        feature_extractor=WhisperFeatureExtractor(feature_size=128),
        tokenizer=tokenizer, chat_template=QWEN_TEMPLATE)
    return _seeded(Qwen3OmniMoeForConditionalGeneration, config, seed), processor


class _TinyLoad:
    """Replica loading: the registry's `load` signature, random weights from `builder` (seed 0)."""

    builder = None

    @classmethod
    def load(cls, spec, model_path=None, device=None, dtype=None, device_map=None, weights="random", seed=0):
        """model_path, device_map and weights are accepted for the registry's sake: a replica has no files and
        its weights are always random (seed 0)."""
        model, processor = cls.builder()
        if dtype is not None:
            model = model.to(parse_dtype(dtype))
        device = device or "cpu"
        adapter = cls(spec, model.to(device), processor, device=device)
        adapter.weights = "random"
        return adapter


class TinyLlavaAdapter(_TinyLoad, LlavaAdapter):
    builder = staticmethod(build_llava)


class TinyQwen3VLAdapter(_TinyLoad, Qwen3VLAdapter):
    builder = staticmethod(build_qwen3_vl)
    max_image_tokens = 64  # a 640x480 photo -> 8x6 merged tokens instead of ~4800


class TinyQwen3OmniAdapter(_TinyLoad, Qwen3OmniAdapter):
    builder = staticmethod(build_qwen3_omni)
    max_image_tokens = 64


TINY_MODELS: dict[str, ModelSpec] = {
    "tiny-llava": ModelSpec("tiny-llava", "random:tiny-llava-next", "llava", "harness.models.tiny:TinyLlavaAdapter",
                            "ocrbench"),
    "tiny-qwen3-vl": ModelSpec("tiny-qwen3-vl", "random:tiny-qwen3-vl", "qwen3_vl",
                               "harness.models.tiny:TinyQwen3VLAdapter", "ocrbench"),
    "tiny-qwen3-omni": ModelSpec("tiny-qwen3-omni", "random:tiny-qwen3-omni", "qwen3_omni",
                                 "harness.models.tiny:TinyQwen3OmniAdapter", "mmau-pro"),
}
FAMILIES = {spec.family: name for name, spec in TINY_MODELS.items()}


def build(family: str, device=None, dtype=None):
    """A tiny replica adapter by family ("llava", "qwen3_vl", "qwen3_omni") or registry name."""
    name = FAMILIES.get(family, family)
    if name not in TINY_MODELS:
        raise KeyError(f"no tiny replica {family!r}; "
                       f"choose a family ({', '.join(FAMILIES)}) or {', '.join(TINY_MODELS)}")
    spec = TINY_MODELS[name]
    module_name, class_name = spec.adapter.split(":")
    return globals()[class_name].load(spec, device=device, dtype=dtype)
