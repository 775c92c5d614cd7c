"""OScaR's fixed-shape decode steps (the kernel path): a fixed window, its CUDA-graph protocol, and a padded batch's
rows stacked into one layer.

`OScaRStepLayer` is the layer a cache of an OScaR config with kernel decode holds (quant.engine.make_layer): the
method's storage and reference path (quant.methods.oscar.OScaRLayer) plus the decode engine's fixed step. On the fixed
path (the cache's CacheState.fixed_step) a one-token step writes its token into a window of R tokens preallocated on
the device and hands the attention function a quant.kernels.hf_decode.PackedStep (the packed buffers at capacity,
the valid lengths on the device); every other update is the method's own.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from quant.engine.protocol import StacksRows, StepKV
from quant.kernels.hf_decode import PackedStep
from quant.methods.base import addresses
from quant.methods.oscar import HEADROOM, OScaRLayer, buffer_like, head_of, write_block
from quant.packed import TL_BLOCK, PackedKV


class OScaRStepLayer(OScaRLayer, StacksRows):
    """OScaR's layer with the kernel path's fixed decode steps (see the module docstring)."""

    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self._win: tuple[torch.Tensor, torch.Tensor] | None = None  # the fixed window (see _fast_step)
        self._win_len: torch.Tensor | None = None
        self._kv_lens: torch.Tensor | None = None  # int32 [B] on the device: the packed tokens, for the kernels

    @classmethod
    def stack_rows(cls, rows: list["OScaRStepLayer"], state) -> "OScaRRows":
        """The rows of a padded batch in one layer for the kernel path's decode steps (quant/engine/rows.py)."""
        return OScaRRows.from_rows(rows, state)

    def _view(self, tokens: int) -> None:
        super()._view(tokens)
        if self._kv_lens is not None:
            self._kv_lens.fill_(tokens)
        elif self._win is not None:  # the first flush on the kernel path (an eager step): the kernels need the length
            self._kv_lens = torch.full(
                (self._kbuf.codes.shape[0],), tokens, dtype=torch.int32, device=self._kbuf.codes.device
            )

    def copy_from(self, other: "OScaRLayer") -> None:
        super().copy_from(other)
        self._win = None

    def update(self, key_states, value_states, *args, **kwargs):
        """Decode steps on the fast path hand the attention function the packed state itself
        (quant.kernels.hf_decode.packed_attention); everything else goes through the dense reference.
        Only single sequences take it: the kernels ignore the attention mask, so a left-padded batch
        would attend to its padding."""
        fast = self.ctx.state.fixed_step(key_states.shape[0])
        if key_states.shape[-2] == 1 and fast and self.is_initialized:
            return StepKV(self._fast_step(key_states, value_states))
        self._win = None  # the dense path re-forms k_res; a later fast step copies it into new buffers
        return super().update(key_states, value_states, *args, **kwargs)

    # -- the kernels' decode step ------------------------------------------------------------
    # The window lives in fixed buffers of R tokens (`_win`) whose valid length is counted on the device
    # (`_win_len`, the kernels' res_lens), and k_res / v_res are views of their first tokens. A step's device
    # work then has the same shapes and addresses every time, so a CUDA graph can replay it
    # (quant.engine.graphs); the host's share is `advance_host`. The token that fills the window
    # flushes it like `_append` (never inside a graph: see `graph_ready`). nbytes() counts the valid window
    # tokens, as the reference path stores them; the buffers hold up to R - 1 more.

    def _fast_step(self, k, v):
        if self._win is None:
            self._open_window()
        if self.k_res.shape[-2] + 1 == self.config.residual_length:
            self._append(k, v)  # the window and this token: R tokens packed, nothing left over
            self._win_len.zero_()
            self.k_res, self.v_res = self._win[0][..., :0, :], self._win[1][..., :0, :]
            self.seen += 1
        else:
            pos = self._win_len[:1].long()  # every sequence's window holds as many tokens (CacheState.fixed_step)
            self._win[0].index_copy_(2, pos, k)
            self._win[1].index_copy_(2, pos, v)
            self._win_len.add_(1)
            self.advance_host()
        if self._kbuf is None:  # nothing packed yet
            kv, lens = PackedKV(None, None, None, self._win[0], self._win[1], self._rot, self._values_rotated), None
        else:  # the whole buffers, the valid length on the device: the same shapes until the buffers grow
            kv = PackedKV(
                self._kbuf, self._vbuf, self._nbuf, self._win[0], self._win[1], self._rot, self._values_rotated
            )
            lens = self._kv_lens
        kernels = self.ctx.state.kernels
        return _step(kv, lens, self._win_len, kernels)

    def _open_window(self):
        b, h, n, d = self.k_res.shape
        if self.k_q is not None and self._kbuf is None:  # packed state made elsewhere (a copy, a reorder): buffered
            k_q, v_q, norms = self.k_q, self.v_q, self.norms
            self.k_q = self.v_q = self.norms = None
            self._store(k_q, v_q, norms)
        if self._kbuf is not None:
            self._kv_lens = torch.full((b,), self.k_q.num_tokens, dtype=torch.int32, device=self.k_res.device)
        self._win = tuple(
            torch.zeros(b, h, self.config.residual_length, d, dtype=x.dtype, device=x.device)
            for x in (self.k_res, self.v_res)
        )
        self._win[0][..., :n, :] = self.k_res
        self._win[1][..., :n, :] = self.v_res
        self._win_len = self.ctx.state.window_length(self.ctx.layer_idx, self.ctx.num_layers, b, self.k_res.device)
        self._win_len.fill_(n)
        self.k_res, self.v_res = self._win[0][..., :n, :], self._win[1][..., :n, :]

    # -- the fixed-step protocol (quant.engine.protocol) ---------------------------------------
    def graph_ready(self) -> bool:
        """Whether the next decode step is the same device work as the last one: the window is open and the
        step's token does not fill it."""
        return self._win is not None and self.k_res.shape[-2] + 1 < self.config.residual_length

    def graph_key(self) -> tuple:
        """What a captured step's device work is bound to besides its inputs: the addresses and shapes of the buffers
        it reads and writes. A flush writes its block into the packed buffers in place and leaves this unchanged (a
        graph captured before it replays after it); a growth or the first packed block changes it."""
        bufs = [self._win[0], self._win[1], self._win_len, self._kv_lens, self._nbuf]
        for q in (self._kbuf, self._vbuf):
            bufs += [None] if q is None else [q.codes, q.scale, q.zero]
        return addresses(*bufs)

    def advance_host(self):
        """The host's share of a decode step whose device work (window write, length + 1) ran or was replayed."""
        n = self.k_res.shape[-2] + 1
        self.k_res, self.v_res = self._win[0][..., :n, :], self._win[1][..., :n, :]
        self.seen += 1

    def host_state(self):
        return self.k_res, self.v_res, self.seen

    def set_host_state(self, state):
        self.k_res, self.v_res, self.seen = state

    def reset(self) -> None:
        super().reset()
        self._win = self._kv_lens = None

    def _map_state(self, fn) -> None:
        super()._map_state(fn)
        self._win = self._kv_lens = None


class OScaRRows(OScaRStepLayer):
    """The sequences of a padded batch (quant/engine/rows.py) in one layer of batch B on the kernel path, so that a
    decode step is one kernel launch per layer for the whole batch. Row b holds its own n_b packed tokens at the start
    of the packed buffers and w_b tokens at the start of the window: the kernels' per-sequence kv_lens and res_lens.

    Each row flushes when its own window fills, as it would alone, so each row stores what it would store alone. A
    step writes each row's token at its window length. A step where some row's window fills (the host keeps the
    lengths as lists and knows which) also packs every row's window and writes each packed block at its row's packed
    length: a row whose window is full takes the block there (its packed length moves on by R, its window empties);
    the others leave it past their packed length, where no kernel reads it, and their own flush overwrites it later.
    Which rows flush is decided on the device, so two CUDA graphs serve every step (`graph_variant`: with or without
    the pack), whichever rows flush."""

    @classmethod
    def from_rows(cls, rows: list[OScaRLayer], state) -> "OScaRRows":
        """One layer holding `rows` (batch-1 layers of the same method after their prompts; `state`: the batch's cache
        state). The rows' own buffers are left to the caller to free."""
        first = rows[0]
        self = cls(first.config, replace(first.ctx, state=state, row=None))
        self.dtype, self.device, self.batch, self.is_initialized = first.dtype, first.device, len(rows), True
        self._rot, self._values_rotated = first._rot, first._values_rotated
        self._row_ctx = [row.ctx for row in rows]
        self._n = [0 if row.k_q is None else row.k_q.num_tokens for row in rows]
        self._w = [row.k_res.shape[-2] for row in rows]
        self._seen = [row.seen for row in rows]
        self.seen = max(self._seen)
        self._flush_next = self._flushes()
        r, h, d = self.config.residual_length, self.ctx.num_kv_heads, self.ctx.head_dim
        self._win = tuple(
            torch.zeros(len(rows), h, r, d, dtype=x.dtype, device=self.device) for x in (first.k_res, first.v_res)
        )
        for b, row in enumerate(rows):
            self._win[0][b, :, : self._w[b]] = row.k_res[0]
            self._win[1][b, :, : self._w[b]] = row.v_res[0]
        self._win_len = torch.tensor(self._w, dtype=torch.int32, device=self.device)
        self._kv_lens = torch.tensor(self._n, dtype=torch.int32, device=self.device)
        self._ranges: dict[int, torch.Tensor] = {}
        k_like, v_like, n_like = self._pack(*self._win, self._backend())  # the packed layout of a block of B rows
        self._kbuf, self._vbuf = buffer_like(k_like, self._capacity()), buffer_like(v_like, self._capacity())
        self._nbuf = None if n_like is None else n_like.new_ones(len(rows), self._kbuf.num_tokens)
        for b, row in enumerate(rows):
            if self._n[b]:
                write_block(self._kbuf.map(lambda t, b=b: t[b : b + 1]), row.k_q.to_order(k_like.order), 0)
                write_block(self._vbuf.map(lambda t, b=b: t[b : b + 1]), row.v_q.to_order(v_like.order), 0)
                if self._nbuf is not None:
                    self._nbuf[b, : self._n[b]] = row.norms[0]
        return self

    def _capacity(self) -> int:
        """Packed tokens the buffers hold: room for the longest row's next flush and HEADROOM more, whole blocks."""
        return -(-(max(self._n) + self.config.residual_length + HEADROOM) // TL_BLOCK) * TL_BLOCK

    def _flushes(self) -> bool:
        """Whether the next step's token fills some row's window."""
        return any(w + 1 == self.config.residual_length for w in self._w)

    def _range(self, n: int) -> torch.Tensor:
        if n not in self._ranges:
            self._ranges[n] = torch.arange(n, device=self.device)
        return self._ranges[n]

    def update(self, key_states, value_states, *args, **kwargs):
        if key_states.shape[-2] != 1:
            raise ValueError(
                "a padded batch on the kernel path takes one new token per sequence at a time; "
                f"got {key_states.shape[-2]}"
            )
        return StepKV(self._rows_step(key_states, value_states))

    def _rows_step(self, k, v):
        r = self.config.residual_length
        if not self.graph_ready():  # grow: an eager step
            cap = self._capacity()
            self._kbuf, self._vbuf = buffer_like(self._kbuf, cap, self._kbuf), buffer_like(self._vbuf, cap, self._vbuf)
            if self._nbuf is not None:
                grown = self._nbuf.new_ones(self._nbuf.shape[0], self._kbuf.num_tokens)
                grown[:, : self._nbuf.shape[1]] = self._nbuf
                self._nbuf = grown
        b, h, _, d = k.shape
        at = self._win_len.long().view(b, 1, 1, 1).expand(b, h, 1, d)
        self._win[0].scatter_(2, at, k.to(self._win[0].dtype))
        self._win[1].scatter_(2, at, v.to(self._win[1].dtype))
        self._win_len.add_(1)
        backend = self._backend()
        if self._flush_next:
            k_q, v_q, norms = self._pack(*self._win, backend)
            blocks = self._kv_lens.long() // r  # each row's packed blocks: its block goes right after them
            for buf, block in ((self._kbuf, k_q), (self._vbuf, v_q)):
                for name in ("codes", "scale", "zero"):
                    x = getattr(block, name)
                    n = x.shape[2]
                    rows = (blocks[:, None] * n + self._range(n)).view(b, 1, n, *[1] * (x.dim() - 3))
                    getattr(buf, name).scatter_(2, rows.expand(x.shape), x)
            if norms is not None:
                self._nbuf.scatter_(1, blocks[:, None] * r + self._range(r), norms)
            full = self._win_len == r
            self._kv_lens.add_(full.to(torch.int32) * r)
            self._win_len.masked_fill_(full, 0)
        self.advance_host()
        kv = PackedKV(self._kbuf, self._vbuf, self._nbuf, self._win[0], self._win[1], self._rot, self._values_rotated)
        return _step(kv, self._kv_lens, self._win_len, self.ctx.state.kernels)

    def graph_ready(self) -> bool:
        return max(self._n) + self.config.residual_length <= self._kbuf.num_tokens

    def graph_variant(self) -> bool:
        """Which of the two device works the next step is (quant.engine.graphs keeps a graph of each): with the
        flush's pack or without."""
        return self._flush_next

    def advance_host(self):
        r = self.config.residual_length
        for b in range(self.batch):
            self._w[b] += 1
            self._seen[b] += 1
            if self._w[b] == r:
                self._n[b], self._w[b] = self._n[b] + r, 0
        self.seen += 1
        self._flush_next = self._flushes()

    def host_state(self):
        return list(self._n), list(self._w), list(self._seen), self.seen

    def set_host_state(self, state):
        n, w, seen, self.seen = state
        self._n, self._w, self._seen = list(n), list(w), list(seen)
        self._flush_next = self._flushes()

    def row(self, b: int) -> OScaRLayer:
        """Sequence b as a batch-1 layer of views into the buffers: what it stores, as it would store it alone
        (memory accounting, the reference attention)."""
        row = OScaRLayer(self.config, self._row_ctx[b])
        row.dtype, row.device, row.batch, row.is_initialized = self.dtype, self.device, 1, True
        row.seen, row._rot, row._values_rotated = self._seen[b], self._rot, self._values_rotated
        n, w = self._n[b], self._w[b]
        if n:
            row.k_q = head_of(self._kbuf.map(lambda t, b=b: t[b : b + 1]), n)
            row.v_q = head_of(self._vbuf.map(lambda t, b=b: t[b : b + 1]), n)
            row.norms = None if self._nbuf is None else self._nbuf[b : b + 1, :n]
        row.k_res, row.v_res = self._win[0][b : b + 1, :, :w], self._win[1][b : b + 1, :, :w]
        return row

    def _dense(self):
        raise NotImplementedError("a padded batch's stacked layer decodes on the kernels only (quant/engine/rows.py)")


def _step(kv, kv_lens, res_lens, kernels) -> PackedStep:
    """The packed step handed to the attention function, with the run's kernel choices (None: the defaults)."""
    if kernels is None:
        return PackedStep(kv, kv_lens, res_lens)
    return PackedStep(kv, kv_lens, res_lens, kernels.backend, kernels.wide_decode, kernels.batch_invariant)
