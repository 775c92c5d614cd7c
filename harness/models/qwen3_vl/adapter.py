"""Qwen3-VL adapter: `Qwen3VLForConditionalGeneration` with the Qwen processor.

Images are resized the way qwen-vl-utils does it (the model card's pipeline) and then handed to the
processor with `do_resize=False`. qwen-vl-utils imports torchvision at module level, which cannot be
installed on our CPU machines; when it is missing, `smart_resize` below applies the same rule.

M-RoPE needs the processor's `mm_token_type_ids`: `generate` without it silently falls back to 1-D
positions and gives different tokens, so it always travels with the inputs. The same tensor gives each
position's modality (0 text, 1 image, 2 video: the codes of harness.models.base).
"""

from __future__ import annotations

import math

import torch
from transformers import Qwen2VLImageProcessorPil, Qwen3VLForConditionalGeneration, Qwen3VLProcessor

from harness.models.base import IMAGE, VIDEO
from harness.models.common import MultimodalAdapter
from tasks.contract import Prompt

# qwen-vl-utils' image bounds, in merged visual tokens per image.
MIN_IMAGE_TOKENS, MAX_IMAGE_TOKENS, MAX_ASPECT = 4, 16384, 200


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(h, w) multiples of `factor` with min_pixels <= h*w <= max_pixels, aspect ratio kept.

    Round each side to the nearest multiple; if the area is too large scale both sides by
    sqrt(h*w / max_pixels) and floor, if too small by sqrt(min_pixels / (h*w)) and ceil.
    """
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(
            f"image aspect ratio {max(height, width) / min(height, width):.0f} exceeds {MAX_ASPECT}; crop it"
        )
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = (max(factor, math.floor(side / beta / factor) * factor) for side in (height, width))
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = (math.ceil(side * beta / factor) * factor for side in (height, width))
    return h, w


def resize_images(images, patch_size: int, merge_size: int, max_tokens: int = MAX_IMAGE_TOKENS) -> list:
    """RGB PIL images resized to the qwen-vl-utils grid (factor = patch_size * merge_size)."""
    factor = patch_size * merge_size
    bounds = {"min_pixels": MIN_IMAGE_TOKENS * factor**2, "max_pixels": max_tokens * factor**2}
    try:
        from qwen_vl_utils import fetch_image

        return [fetch_image({"image": image, **bounds}, image_patch_size=patch_size) for image in images]
    except ImportError:  # qwen-vl-utils absent, or present without torchvision
        out = []
        for image in images:
            image = image.convert("RGB")
            h, w = smart_resize(image.height, image.width, factor, **bounds)
            out.append(image.resize((w, h)))
        return out


class Qwen3VLAdapter(MultimodalAdapter):
    model_class = Qwen3VLForConditionalGeneration
    processor_class = Qwen3VLProcessor
    processor_parts = {"image_processor": Qwen2VLImageProcessorPil}
    max_image_tokens = MAX_IMAGE_TOKENS  # tiny replicas lower it to keep tests small

    def build_inputs(self, prompt: Prompt):
        """input_ids [1, S], attention_mask, mm_token_type_ids [1, S], pixel_values [patches, C*T*P*P],
        image_grid_thw [n_img, 3]."""
        if prompt.audios:
            raise ValueError(
                f"{self.spec.name} takes images and text; this prompt has {len(prompt.audios)} audio clip(s)"
            )
        ip = self.processor.image_processor
        images = resize_images(prompt.images, ip.patch_size, ip.merge_size, self.max_image_tokens)
        kwargs = {"images": images, "do_resize": False} if images else {}
        inputs = self.processor(text=self.chat_text(prompt), return_tensors="pt", **kwargs)
        if "mm_token_type_ids" not in inputs:
            raise RuntimeError("the Qwen3-VL processor returned no mm_token_type_ids; M-RoPE positions would be wrong")
        return inputs

    def token_modality(self) -> dict[int, int]:
        return {self.model.config.image_token_id: IMAGE, self.model.config.video_token_id: VIDEO}

    def tags(self, inputs) -> torch.Tensor:
        # The processor's own per-position type ids use our codes (0 text, 1 image, 2 video).
        return inputs["mm_token_type_ids"].long()
