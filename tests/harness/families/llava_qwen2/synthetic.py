"""The family's sizes (harness/models/synthetic.py): a tiny preset only (no published checkpoint)."""

from transformers import (
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessorPil,
    LlavaNextProcessor,
)

from harness.models.synthetic import LLAVA_TEMPLATE, byte_tokenizer
from harness.models.text.synthetic import TINY_TEXT


def config(values: dict) -> LlavaNextConfig:
    return LlavaNextConfig(**values)


def model_class(config) -> type:
    return LlavaNextForConditionalGeneration


def processor(tokens: dict, settings: dict):
    raise KeyError("llava_qwen2 has no published checkpoint: only its tiny preset")


def tiny():
    """(LlavaNextConfig with a 2-layer Qwen2 text model, LlavaNextProcessor)."""
    tokenizer = byte_tokenizer("<|im_end|>", "<|endoftext|>", {"image_token": "<image>"}, ("<|im_start|>",))
    cfg = LlavaNextConfig(
        text_config={
            "model_type": "qwen2",
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
