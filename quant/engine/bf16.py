"""BF16's fixed-shape decode steps: K/V in preallocated buffers that grow by GROW tokens; each step writes its token
at a device-side length and hands the attention function the whole buffer with the lengths
(quant.kernels.hf_decode.DenseStep, SDPA with a length mask), so a step has the same shapes and addresses every time
and quant.engine.graphs replays it as a CUDA graph. `BF16StepLayer` is the layer a BF16 cache holds
(quant.engine.make_layer): the method's plain storage (quant.methods.bf16.BF16Layer) plus these steps.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from quant.engine.protocol import StacksRows, StepKV
from quant.kernels.hf_decode import DenseStep
from quant.methods.base import addresses
from quant.methods.bf16 import BF16Layer

GROW = 256  # tokens a fixed-shape buffer grows by (one eager step each time)


class BF16StepLayer(BF16Layer, StacksRows):
    """BF16's layer with the fixed-shape decode steps (see the module docstring)."""

    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self._buf: tuple[torch.Tensor, torch.Tensor] | None = None  # the fixed-shape decode's K/V buffers
        self._len: torch.Tensor | None = None  # int32 [B]: valid tokens, on the device

    def update(self, key_states, value_states, *args, **kwargs):
        """Decode steps on a GPU (the cache's fast_decode) of one sequence, or of sequences of one length, write into
        the fixed buffers and hand the attention function a DenseStep; everything else is the plain path."""
        if key_states.shape[-2] == 1 and self.ctx.state.fixed_step(key_states.shape[0]) and self.is_initialized:
            return StepKV(self._fixed_step(key_states, value_states))
        self._buf = None  # the plain path concatenates: a later fixed step copies into new buffers
        return super().update(key_states, value_states, *args, **kwargs)

    def _fixed_step(self, k, v):
        if self._buf is None or self.seen + 1 > self._buf[0].shape[-2]:
            self._open_buffers(self.seen + 1)
        pos = self._len[:1].long()  # every sequence holds as many tokens (CacheState.fixed_step)
        dt = self._store_dtype()
        self._buf[0].index_copy_(2, pos, k.to(dt))
        self._buf[1].index_copy_(2, pos, v.to(dt))
        self._len.add_(1)
        self.advance_host()
        return DenseStep(self._buf[0], self._buf[1], self._len, self._invariant())

    def _open_buffers(self, need: int):
        """Buffers of room for `need` tokens rounded up to GROW, holding what is stored (an eager step)."""
        b, h, n, d = self.keys.shape
        cap = -(-need // GROW) * GROW
        self._buf = tuple(torch.zeros(b, h, cap, d, dtype=x.dtype, device=x.device) for x in (self.keys, self.values))
        self._buf[0][:, :, :n] = self.keys
        self._buf[1][:, :, :n] = self.values
        self._len = torch.full((b,), n, dtype=torch.int32, device=self.keys.device)
        self.keys, self.values = self._buf[0][:, :, :n], self._buf[1][:, :, :n]

    def _invariant(self) -> bool:
        """The run's batch-invariant mode: the step's attention sums each row in splits of its own
        (quant.kernels.triton_dense)."""
        kernels = self.ctx.state.kernels
        return bool(kernels and kernels.batch_invariant)

    @classmethod
    def stack_rows(cls, rows: list["BF16StepLayer"], state) -> "BF16Rows":
        """The rows of a padded batch in one layer for the fixed-shape decode steps (quant/engine/rows.py)."""
        return BF16Rows.from_rows(rows, state)

    def graph_ready(self) -> bool:
        """Whether the next decode step is the same device work as the last: the buffers are open and have room."""
        return self._buf is not None and self.seen + 1 <= self._buf[0].shape[-2]

    def graph_key(self) -> tuple:
        """The addresses and shapes of the buffers a captured step writes and reads (they change when they grow)."""
        return addresses(*self._buf, self._len)

    def advance_host(self):
        """The host's share of a step whose device work (write, length + 1) ran or was replayed."""
        self.seen += 1
        self.keys, self.values = self._buf[0][:, :, : self.seen], self._buf[1][:, :, : self.seen]

    def host_state(self):
        return self.keys, self.values, self.seen

    def set_host_state(self, state):
        self.keys, self.values, self.seen = state

    def reset(self) -> None:
        super().reset()
        self._buf = None


class BF16Rows(BF16StepLayer):
    """The sequences of a padded batch (quant/engine/rows.py) in one pair of buffers [B, H, capacity, D]: row b holds
    its own tokens at the start of its row, `_len[b]` of them (the length mask of DenseStep). A step writes each row's
    token at its own length: the same device work every step, so one CUDA graph serves them."""

    @classmethod
    def from_rows(cls, rows: list[BF16StepLayer], state) -> "BF16Rows":
        first = rows[0]
        self = cls(first.config, replace(first.ctx, state=state, row=None))
        self.dtype, self.device, self.batch, self.is_initialized = first.dtype, first.device, len(rows), True
        self._row_ctx = [row.ctx for row in rows]
        self._lens = [row.seen for row in rows]
        self.seen = max(self._lens)
        _, h, _, d = first.keys.shape
        cap = -(-(self.seen + GROW) // GROW) * GROW
        self._buf = tuple(
            torch.zeros(len(rows), h, cap, d, dtype=x.dtype, device=x.device) for x in (first.keys, first.values)
        )
        for i, row in enumerate(rows):
            self._buf[0][i, :, : row.seen] = row.keys[0]
            self._buf[1][i, :, : row.seen] = row.values[0]
        self._len = torch.tensor(self._lens, dtype=torch.int32, device=self.device)
        return self

    def update(self, key_states, value_states, *args, **kwargs):
        if key_states.shape[-2] != 1:
            raise ValueError(
                "a padded batch on the fixed-shape path takes one new token per sequence at a time; "
                f"got {key_states.shape[-2]}"
            )
        if not self.graph_ready():  # grow: an eager step
            cap = self._buf[0].shape[-2] + GROW
            grown = tuple(x.new_zeros(*x.shape[:2], cap, x.shape[-1]) for x in self._buf)
            for new, old in zip(grown, self._buf):
                new[:, :, : old.shape[-2]] = old
            self._buf = grown
        b, h, _, d = key_states.shape
        at = self._len.long().view(b, 1, 1, 1).expand(b, h, 1, d)
        dt = self._store_dtype()
        self._buf[0].scatter_(2, at, key_states.to(dt))
        self._buf[1].scatter_(2, at, value_states.to(dt))
        self._len.add_(1)
        self.advance_host()
        return StepKV(DenseStep(self._buf[0], self._buf[1], self._len, self._invariant()))

    def graph_ready(self) -> bool:
        return max(self._lens) + 1 <= self._buf[0].shape[-2]

    def advance_host(self):
        self._lens = [n + 1 for n in self._lens]
        self.seen += 1

    def host_state(self):
        return list(self._lens), self.seen

    def set_host_state(self, state):
        lens, self.seen = state
        self._lens = list(lens)

    def row(self, b: int) -> BF16Layer:
        """Sequence b as a batch-1 layer of views into the buffers (memory accounting)."""
        row = BF16Layer(self.config, self._row_ctx[b])
        row.dtype, row.device, row.batch, row.is_initialized = self.dtype, self.device, 1, True
        row.seen = n = self._lens[b]
        row.keys, row.values = self._buf[0][b : b + 1, :, :n], self._buf[1][b : b + 1, :, :n]
        return row

    def _dense(self):
        raise NotImplementedError(
            "a padded batch's stacked layer decodes on the fixed-shape path only (quant/engine/rows.py)"
        )
