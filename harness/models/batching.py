"""Several prompts in one `generate` (harness/runner.py): inputs built one by one and collated left-padded, then each
answer split off.

`collate` joins the processors' batch-1 outputs: the per-position tensors (input_ids, attention_mask, the token-type
ids) are left-padded to the longest prompt, the media tensors (pixel values, image grids, audio features and their
masks) concatenated along their first dimension after zero-padding the others (LLaVA-NeXT's tiles, Whisper
frames): the models read how much of each is real from image_sizes / image_grid_thw / feature_attention_mask.
Building each prompt alone keeps every family's processor on the path it was tested on. The cache stores each
sequence without its pads (quant.cache.QuantizedKVCache.set_padding), so a sequence's answer is its batch-1 answer.
"""

from __future__ import annotations

from typing import Any

import torch

# Keys whose dim 1 runs along the prompt: left-padded with PAD_VALUES (input_ids: the tokenizer's pad id).
POSITION_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids", "moe_mm_token_type_ids")


def collate(features: list[Any], pad_token_id: int):
    """Batch-1 processor outputs -> one left-padded batch (a BatchFeature when the inputs are)."""
    width = max(f["input_ids"].shape[1] for f in features)
    out = {}
    for key in features[0].keys():
        values = [f[key] for f in features]
        if not all(isinstance(v, torch.Tensor) for v in values):
            raise ValueError(f"cannot batch the processor output {key!r}: not a tensor in every prompt")
        if key in POSITION_KEYS:
            fill = pad_token_id if key == "input_ids" else 0
            out[key] = torch.cat([torch.nn.functional.pad(v, (width - v.shape[1], 0), value=fill) for v in values])
        else:
            shape = [max(v.shape[d] for v in values) for d in range(values[0].dim())]
            padded = []
            for v in values:
                pad = []
                for d in reversed(range(1, v.dim())):
                    pad += [0, shape[d] - v.shape[d]]
                padded.append(torch.nn.functional.pad(v, pad) if any(pad) else v)
            out[key] = torch.cat(padded)
    return type(features[0])(out) if hasattr(features[0], "convert_to_tensors") else out


def row_tokens(new: torch.Tensor, eos: set[int]) -> list[torch.Tensor]:
    """New tokens [B, T] of a batched greedy generate -> each row's tokens up to and with its first end token (the
    rest is what generate pads a finished row with)."""
    rows = []
    for r in new:
        ends = [i for i, t in enumerate(r.tolist()) if t in eos]
        rows.append(r[: ends[0] + 1] if ends else r)
    return rows
