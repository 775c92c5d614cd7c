"""Batches of prompts of different lengths: each sequence stored by its own layer, as it would be alone.

A left-padded batch hands every cache layer K/V [B, H, S, D] whose first pad_b positions of row b are padding.
A quantizer must not see them (they would widen a group's min and max, enter a token norm or an outlier pool), so
`QuantizedKVCache.set_padding` replaces each layer by a `RowsLayer` of B layers of the method, one per sequence,
each fed only its own tokens: a sequence's stored codes are exactly those of the same prompt run alone, whatever
the method. The model's own bookkeeping keeps the padded length: `get_seq_length` counts pads too, as transformers
expects under left padding.

At a decode step the rows answer as they would alone:
- on the reference path, dense K/V [1, H, n_b, D]: they are stacked right-aligned (zeros where row b has pads,
  which the model's attention mask hides), so each row's attention is its batch-1 attention;
- on the fixed-shape path (OScaR's kernels, BF16's buffers), the decode engine's `FixedStepRows`
  (quant/engine/rows.py), which the cache takes when its method's layers stack rows, moves the rows into one layer
  of batch B at the first decode step.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import CacheLayerMixin

from quant.methods.base import FP_PARTS, QUANTIZED_PARTS


def left_pads(attention_mask: torch.Tensor) -> list[int]:
    """Leading padding of each row of a [B, S] mask of ones and zeros; refuses right or inner padding."""
    mask = attention_mask.bool()
    pads = (~mask).sum(1)
    first = torch.arange(mask.shape[1], device=mask.device)[None, :] >= pads[:, None]
    if not torch.equal(first, mask):
        raise ValueError(
            "a batch for the quantized cache must be left-padded (zeros only before each prompt): "
            "set the tokenizer's or processor's padding_side='left'"
        )
    return [int(p) for p in pads.tolist()]


class RowsLayer(CacheLayerMixin):
    """One cache layer of a padded batch: `rows[b]` (a layer of the method, batch 1) stores sequence b without
    its `pads[b]` leading pad positions. See the module docstring."""

    is_compileable = False
    is_sliding = False
    is_croppable = False

    def __init__(self, rows: list, pads: list[int], state=None):
        super().__init__()
        self.rows, self.pads = rows, pads
        self.state = state  # the batch's cache state (quant.methods.base.CacheState): whether steps take the kernels
        self.stacked = None  # the rows in one layer of batch B, from the first fixed-shape decode step on (engine)
        self.seen = 0  # the padded length transformers counts
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        first = self.seen == 0
        if self.stacked is None and not first and self._stacks(key_states):
            self.stacked = self._stack_rows()
            for row in self.rows:
                row.reset()  # their tokens live in the stacked layer now; row(b) gives views of them
        if self.stacked is not None:
            out = self.stacked.update(key_states, value_states)
            self.seen += key_states.shape[-2]
            return out
        outs = []
        for b, row in enumerate(self.rows):
            cut = self.pads[b] if first else 0
            outs.append(row.update(key_states[b : b + 1, :, cut:], value_states[b : b + 1, :, cut:]))
        self.seen += key_states.shape[-2]
        if first:  # the prompt attends with its exact K/V under the model's padding mask
            return key_states, value_states
        if not isinstance(outs[0][0], torch.Tensor):
            raise TypeError(
                f"{type(self.rows[0]).__name__} took a fixed-shape decode step without stack_rows: a "
                "method with fixed-shape steps must stack a padded batch's rows "
                "(quant.engine.protocol.StacksRows)"
            )
        return self._stack([out[0] for out in outs]), self._stack([out[1] for out in outs])

    def _stacks(self, key_states: torch.Tensor) -> bool:
        """Whether this step moves the rows into one stacked layer: never on the reference path (the decode engine's
        FixedStepRows says when)."""
        return False

    def _stack_rows(self):
        raise NotImplementedError

    def row(self, b: int):
        """Sequence b's layer as it would be alone (views into the stacked layer once there is one)."""
        return self.rows[b] if self.stacked is None else self.stacked.row(b)

    def _stack(self, rows: list[torch.Tensor]) -> torch.Tensor:
        """Per-row [1, H, n_b, D] -> [B, H, seen, D], each row right-aligned (its pads as zeros)."""
        _, h, _, d = rows[0].shape
        out = rows[0].new_zeros(len(rows), h, self.seen, d)
        for b, row in enumerate(rows):
            out[b, :, self.seen - row.shape[-2] :] = row[0]
        return out

    # -- transformers' layer API -----------------------------------------------------------------------------
    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        for row in self.rows:
            row.reset()
        self.stacked = None
        self.seen = 0

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a quantized cache cannot crop: assisted decoding is not supported")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError(
            "beam search over a padded batch of quantized caches is not supported: use greedy "
            "decoding or one prompt at a time"
        )

    # -- accounting ------------------------------------------------------------------------------------------
    def nbytes(self) -> dict[str, int]:
        out = dict.fromkeys(QUANTIZED_PARTS + FP_PARTS, 0)
        for b in range(len(self.rows)):
            for k, v in self.row(b).nbytes().items():
                out[k] += v
        return out

    def elements(self) -> int:
        """K and V elements the rows represent (their own tokens, no pads)."""
        rows = [self.row(b) for b in range(len(self.rows))]
        return sum(2 * row.ctx.num_kv_heads * row.seen * row.ctx.head_dim for row in rows if row.is_initialized)
