"""Qwen3-Omni adapter: `Qwen3OmniMoeForConditionalGeneration`, generating with its thinker.

The wrapper's `generate` ignores `max_new_tokens` (the thinker reads `thinker_max_new_tokens`,
default 1024) and drives the talker, so we call `model.thinker.generate` directly with our cache; the
talker is not built at load (no speech output, and its weights stay off the GPU). Audio goes through
the Whisper feature extractor at 16 kHz (~13 audio tokens per second); images are resized by the
qwen-vl-utils rule, as in Qwen3-VL. Token ids come from `config.thinker_config`: the checkpoint's
audio token id (151675) differs from the class default (151646).
"""

from __future__ import annotations

import inspect

from transformers import (
    Qwen2VLImageProcessorPil,
    Qwen3OmniMoeForConditionalGeneration,
    Qwen3OmniMoeProcessor,
    WhisperFeatureExtractor,
)

from harness.models.base import AUDIO, IMAGE, VIDEO
from harness.models.common import AUDIO_SAMPLE_RATE, MultimodalAdapter, load_audio
from harness.models.qwen3_vl.adapter import MAX_IMAGE_TOKENS, resize_images
from tasks.contract import Prompt


class Qwen3OmniAdapter(MultimodalAdapter):
    model_class = Qwen3OmniMoeForConditionalGeneration
    processor_class = Qwen3OmniMoeProcessor
    processor_parts = {"image_processor": Qwen2VLImageProcessorPil, "feature_extractor": WhisperFeatureExtractor}
    max_image_tokens = MAX_IMAGE_TOKENS
    # Build no talker/code2wav: their checkpoint weights are skipped instead of loaded and dropped.
    load_options = {"enable_audio_output": False}

    @property
    def generator(self):
        return self.model.thinker

    def build_inputs(self, prompt: Prompt):
        """input_ids [1, S], attention_mask, input_features [n_audio, 128, frames],
        feature_attention_mask [n_audio, frames], and pixel_values/image_grid_thw for images."""
        kwargs = {}
        if prompt.audios:
            # The keyword is `audio` in transformers 5.23 and `audios` in some earlier releases.
            name = "audio" if "audio" in inspect.signature(self.processor.__call__).parameters else "audios"
            kwargs[name] = [load_audio(a) for a in prompt.audios]
            kwargs["sampling_rate"] = AUDIO_SAMPLE_RATE
        if prompt.images:
            ip = self.processor.image_processor
            kwargs["images"] = resize_images(prompt.images, ip.patch_size, ip.merge_size, self.max_image_tokens)
            kwargs["do_resize"] = False
        return self.processor(text=self.chat_text(prompt), return_tensors="pt", **kwargs)

    def token_modality(self) -> dict[int, int]:
        cfg = self.model.config.thinker_config
        return {cfg.image_token_id: IMAGE, cfg.video_token_id: VIDEO, cfg.audio_token_id: AUDIO}
