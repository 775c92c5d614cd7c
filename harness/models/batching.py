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

from harness.models.base import cache_argument

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


def rope_holder(generator):
    """The module that keeps the prompt's offset of text positions, `rope_deltas`, after its prefill (models with
    multimodal RoPE: Qwen3-VL, the Qwen3-Omni thinker), or None."""
    return next((m for m in (getattr(generator, "model", None), generator) if hasattr(m, "rope_deltas")), None)


def prefill_rows(adapter, cache, features: list[Any], shared=None) -> None:
    """The batch-invariant prefill (quant/invariant.py): each prompt but its last token through the model alone, as a
    batch of one without padding, into its own rows of `cache` (made with one layer per sequence:
    QuantizedKVCache.set_padding(rows=True)). `generate` then takes the padded batch with the cache holding all but
    the last position, so each prompt's last token goes with the batch as its first one-token step.

    Models with multimodal RoPE (Qwen3-VL, the Qwen3-Omni thinker) keep each prompt's offset of text positions,
    `rope_deltas`, on the model after its prefill and add it to the mask's positions at every later step (so it does
    not depend on padding): the batch gets each prompt's own.

    `shared(feature, row_cache, run)`: the run's kept prefills (harness.prefill_store.PromptShare.row), which replay
    the prompt's prefill into its rows or call `run()` (the forward) and keep it; None: every prompt runs."""
    generator = adapter.generator
    holder = rope_holder(generator)
    deltas = []
    for b, feature in enumerate(features):
        row = {}
        for key, value in feature.items():
            value = value[:, :-1] if key in POSITION_KEYS else value
            value = value.to(adapter.device)
            row[key] = value.to(adapter.model.dtype) if value.is_floating_point() else value
        if holder is not None:
            holder.rope_deltas = None  # computed afresh for this prompt
        rows = cache.row(b)

        def run(row=row, rows=rows):
            generator(**row, **cache_argument(rows), use_cache=True, logits_to_keep=1)

        if shared is None:
            run()
        else:
            shared(feature, rows, run)
        if holder is not None:  # none computed: a text-only prompt, whose offset is 0
            deltas.append(torch.zeros(1, 1, dtype=torch.long) if holder.rope_deltas is None else holder.rope_deltas)
    if holder is not None:
        holder.rope_deltas = torch.cat([d.to(adapter.device) for d in deltas])
    width = max(f["input_ids"].shape[1] for f in features)
    for layer in cache.layers:
        layer.seen = width - 1  # the padded length transformers counts (quant/rows.py)
