"""LLaVA-v1.6 with seeded random weights (harness/models/synthetic.py): the tiny preset and a checkpoint's
processor. The tiny preset: a 2-layer Llama text model, a CLIP vision tower of 16 px / patch 4, anyres 32x32."""

from __future__ import annotations

from transformers import (
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessorPil,
    LlavaNextProcessor,
)

from harness.models.synthetic import LLAVA_TEMPLATE, byte_tokenizer, checkpoint_tokenizer
from harness.models.text.synthetic import TINY_TEXT


def config(values: dict) -> LlavaNextConfig:
    return LlavaNextConfig(**values)


def model_class(config) -> type:
    return LlavaNextForConditionalGeneration


def processor(tokens: dict, settings: dict) -> LlavaNextProcessor:
    """The llava-hf processor with a checkpoint's settings (shapes.SHAPES[...]["processor"])."""
    tokenizer = checkpoint_tokenizer(tokens, "eos", "pad", {"image_token": "image"})
    return LlavaNextProcessor(
        LlavaNextImageProcessorPil(**settings["image"]),
        tokenizer,
        chat_template=LLAVA_TEMPLATE,
        **settings["processor"],
    )


def tiny(text_model: str = "llama", eos: str = "</s>", pad: str = "<unk>", extra: tuple[str, ...] = ("<s>",)):
    """(LlavaNextConfig, LlavaNextProcessor) of the tiny preset. LLaVA-NeXT takes any causal LM as its text model:
    `text_model` (a transformers model type at the tiny text sizes) with its tokenizer's `eos`, `pad` and `extra`
    special tokens (a test family puts a Qwen2 there)."""
    tokenizer = byte_tokenizer(eos, pad, {"image_token": "<image>"}, extra)
    cfg = LlavaNextConfig(
        text_config={
            "model_type": text_model,
            **TINY_TEXT,
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
        },
        vision_config={
            "model_type": "clip_vision_model",
            "image_size": 16,
            "patch_size": 4,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "projection_dim": 32,
        },
        image_grid_pinpoints=[[32, 32]],
        vision_feature_select_strategy="default",
        image_token_index=tokenizer.image_token_id,
    )
    image_processor = LlavaNextImageProcessorPil(
        size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}, image_grid_pinpoints=[[32, 32]]
    )
    return cfg, LlavaNextProcessor(
        image_processor,
        tokenizer,
        patch_size=4,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=LLAVA_TEMPLATE,
    )
