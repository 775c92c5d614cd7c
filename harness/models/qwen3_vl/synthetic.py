"""Qwen3-VL with seeded random weights (harness/models/synthetic.py): the tiny preset and a checkpoint's processor.
The tiny preset: a 2-layer text model with M-RoPE, a 2-layer vision tower of patch 4 with deepstack."""

from __future__ import annotations

from transformers import Qwen2VLImageProcessorPil, Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor

from harness.models.common import without_video
from harness.models.synthetic import QWEN_TEMPLATE, byte_tokenizer, checkpoint_tokenizer
from harness.models.text.synthetic import TINY_TEXT

TINY_MROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [16, 8, 8], "mrope_interleaved": True}
TINY_VISION = dict(
    depth=2,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    patch_size=4,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=64,
    num_position_embeddings=64,
    deepstack_visual_indexes=[1],
)
TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_token": "<|audio_pad|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}
# The tokenizer attributes of the processors and the checkpoints' token keys (shapes.SHAPES[...]["tokens"]).
NAMED = {
    "image_token": "image",
    "video_token": "video",
    "vision_bos_token": "vision_start",
    "vision_eos_token": "vision_end",
}
TINY_ADAPTER = {"max_image_tokens": 64}  # a 640x480 photo -> 8x6 merged tokens instead of ~4800


def config(values: dict) -> Qwen3VLConfig:
    return Qwen3VLConfig(**values)


def model_class(config) -> type:
    return Qwen3VLForConditionalGeneration


def image_processor(settings: dict) -> Qwen2VLImageProcessorPil:
    """The Qwen image processor of a checkpoint's settings (patch and merge sizes, pixel bounds, mean and std)."""
    s = settings["image"]
    return Qwen2VLImageProcessorPil(
        patch_size=s["patch_size"],
        merge_size=s["merge_size"],
        temporal_patch_size=s["temporal_patch_size"],
        image_mean=s["image_mean"],
        image_std=s["image_std"],
        size={"shortest_edge": s["min_pixels"], "longest_edge": s["max_pixels"]},
    )


def tiny_image_processor() -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(
        patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=4 * 8 * 8, max_pixels=64 * 8 * 8
    )


def tiny_tokenizer():
    return byte_tokenizer("<|im_end|>", "<|endoftext|>", TOKENS, ("<|im_start|>",))


def processor(tokens: dict, settings: dict):
    tokenizer = checkpoint_tokenizer(tokens, "im_end", "endoftext", NAMED)
    return without_video(Qwen3VLProcessor)(
        image_processor(settings), tokenizer, video_processor=None, chat_template=QWEN_TEMPLATE
    )


def tiny():
    """(Qwen3VLConfig, Qwen3VLProcessor without a video processor) of the tiny preset."""
    tokenizer = tiny_tokenizer()
    ids = {k: tokenizer.convert_tokens_to_ids(v) for k, v in TOKENS.items()}
    cfg = Qwen3VLConfig(
        text_config={
            **TINY_TEXT,
            "rope_parameters": TINY_MROPE,
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
        },
        vision_config=TINY_VISION,
        image_token_id=ids["image_token"],
        video_token_id=ids["video_token"],
        vision_start_token_id=ids["vision_bos_token"],
        vision_end_token_id=ids["vision_eos_token"],
    )
    proc = without_video(Qwen3VLProcessor)(
        tiny_image_processor(), tokenizer, video_processor=None, chat_template=QWEN_TEMPLATE
    )
    return cfg, proc
