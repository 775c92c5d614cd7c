"""LLaVA-v1.6 (LLaVA-NeXT) adapter: llava-hf checkpoints, `LlavaNextForConditionalGeneration`.

The vision tower and projector run untouched; only the Llama/Mistral text backbone sees the quantized
cache. Positions are 1-D, and every image placeholder (token 32000 in the llava-hf checkpoints; read
from the config) is one image position after anyres tiling has expanded it (~2-3K per image).
"""

from __future__ import annotations

from transformers import LlavaNextForConditionalGeneration, LlavaNextImageProcessorPil, LlavaNextProcessor

from harness.models.base import IMAGE
from harness.models.common import MultimodalAdapter
from tasks.contract import Prompt


class LlavaAdapter(MultimodalAdapter):
    model_class = LlavaNextForConditionalGeneration
    processor_class = LlavaNextProcessor
    processor_parts = {"image_processor": LlavaNextImageProcessorPil}

    def build_inputs(self, prompt: Prompt):
        """input_ids [1, S], attention_mask, pixel_values [n_img, tiles, 3, H, W], image_sizes [n_img, 2]."""
        if prompt.audios:
            raise ValueError(
                f"{self.spec.name} takes images and text; this prompt has {len(prompt.audios)} audio clip(s)"
            )
        images = [image.convert("RGB") for image in prompt.images]
        return self.processor(text=self.chat_text(prompt), images=images or None, return_tensors="pt")

    def token_modality(self) -> dict[int, int]:
        return {self.model.config.image_token_id: IMAGE}
