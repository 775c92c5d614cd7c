"""Qwen3-Omni with seeded random weights (harness/models/synthetic.py): the tiny preset and a checkpoint's
processor. The tiny preset: no talker; Whisper features (128 mel bins, 16 kHz) into a 2-layer audio encoder; a
2-layer text model of 4 experts, 2 per token; the Qwen3-VL tiny vision tower."""

from __future__ import annotations

from transformers import (
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeForConditionalGeneration,
    Qwen3OmniMoeProcessor,
    WhisperFeatureExtractor,
)

from harness.models.common import without_video
from harness.models.qwen3_vl.synthetic import (
    NAMED,
    TINY_ADAPTER,
    TINY_MROPE,
    TINY_VISION,
    TOKENS,
    image_processor,
    tiny_image_processor,
    tiny_tokenizer,
)
from harness.models.synthetic import QWEN_TEMPLATE, checkpoint_tokenizer
from harness.models.text.synthetic import TINY_TEXT

OMNI_NAMED = {**NAMED, "audio_token": "audio", "audio_bos_token": "audio_start", "audio_eos_token": "audio_end"}
__all__ = ["TINY_ADAPTER", "config", "model_class", "processor", "tiny"]


def config(values: dict) -> Qwen3OmniMoeConfig:
    return Qwen3OmniMoeConfig(**values)


def model_class(config) -> type:
    return Qwen3OmniMoeForConditionalGeneration


def processor(tokens: dict, settings: dict):
    tokenizer = checkpoint_tokenizer(tokens, "im_end", "endoftext", OMNI_NAMED)
    return without_video(Qwen3OmniMoeProcessor)(
        image_processor=image_processor(settings),
        video_processor=None,
        feature_extractor=WhisperFeatureExtractor(**settings["audio"]),
        tokenizer=tokenizer,
        chat_template=QWEN_TEMPLATE,
    )


def tiny():
    """(Qwen3OmniMoeConfig without talker, Qwen3OmniMoeProcessor without video) of the tiny preset."""
    tokenizer = tiny_tokenizer()
    ids = {k: tokenizer.convert_tokens_to_ids(v) for k, v in TOKENS.items()}
    thinker = {
        "text_config": {
            **TINY_TEXT,
            "rope_parameters": TINY_MROPE,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
        },
        "vision_config": TINY_VISION,
        "audio_config": {
            "d_model": 32,
            "encoder_layers": 2,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "num_mel_bins": 128,
            "output_dim": 64,
            "downsample_hidden_size": 16,
        },
        "image_token_id": ids["image_token"],
        "video_token_id": ids["video_token"],
        "audio_token_id": ids["audio_token"],
        "audio_start_token_id": ids["audio_bos_token"],
        "vision_start_token_id": ids["vision_bos_token"],
        "audio_end_token_id": ids["audio_eos_token"],
    }
    cfg = Qwen3OmniMoeConfig(thinker_config=thinker, enable_audio_output=False)
    proc = without_video(Qwen3OmniMoeProcessor)(
        image_processor=tiny_image_processor(),
        video_processor=None,
        feature_extractor=WhisperFeatureExtractor(feature_size=128),
        tokenizer=tokenizer,
        chat_template=QWEN_TEMPLATE,
    )
    return cfg, proc
