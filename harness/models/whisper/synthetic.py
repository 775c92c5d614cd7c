"""Whisper with seeded random weights (harness/models/synthetic.py): the tiny preset the tests run.

The tiny preset keeps Whisper's real input sizes (80 mel bins, 3000 feature frames, 1500 encoder frames: the
cross-attention cache holds as many positions as the real model's) and shrinks the rest: d_model 128, 2 heads of 64
(the real models' head size), 2 encoder and 2 decoder layers, a byte-level tokenizer with Whisper's special tokens.
"""

from __future__ import annotations

from transformers import WhisperConfig, WhisperFeatureExtractor

from harness.models.synthetic import TINY_VOCAB, byte_tokenizer
from harness.models.whisper.adapter import EN, EOT, NO_TIMESTAMPS, SOT, TRANSCRIBE, WhisperProcessor, WhisperTranscriber

# The adapter's settings for the tiny preset: the multilingual prompt (<|en|> <|transcribe|>) whatever the vocabulary.
TINY_ADAPTER = {"multilingual": True}


def config(values: dict) -> WhisperConfig:
    return WhisperConfig(**values)


def model_class(config) -> type:
    return WhisperTranscriber


def tiny():
    """(WhisperConfig, WhisperProcessor) of the tiny preset."""
    tokenizer = byte_tokenizer(EOT, EOT, {}, others=(SOT, EN, TRANSCRIBE, NO_TIMESTAMPS))
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (SOT, EOT)}
    cfg = WhisperConfig(
        vocab_size=TINY_VOCAB,
        num_mel_bins=80,
        d_model=128,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=256,
        decoder_ffn_dim=256,
        max_source_positions=1500,
        max_target_positions=448,
        decoder_start_token_id=ids[SOT],
        bos_token_id=ids[EOT],
        eos_token_id=ids[EOT],
        pad_token_id=ids[EOT],
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )
    return cfg, WhisperProcessor(WhisperFeatureExtractor(feature_size=80), tokenizer)
