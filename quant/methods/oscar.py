"""OScaR (arXiv 2605.19660): Canalized Rotation + Omni-Token Scaling, then KIVI-style INT2.

Keys: rotate every head with the normalized Sylvester Hadamard H_d (natural order, no signs), divide
each token by its norm n_t over ALL KV heads and channels (one fp32 per token per layer), quantize per
channel in groups of G tokens. Values: rotate with the same H_d, quantize per token in groups of G
channels (not norm-scaled). New tokens wait in a full-precision window; every R tokens the block is
quantized (block flush for K and V); the prompt quantizes floor(L / R) * R tokens.
Dequantized: K = (K_unit_hat * n) @ H_d, V = V_hat @ H_d (H_d is symmetric and its own inverse).

The values' rotation is "offline" by default, as in the official code: make_cache(method, model) folds H_d
into the model's v_proj rows and o_proj columns (quant/fold.py), so the values arrive rotated, are quantized
as they come, and the attention output goes to o_proj in that basis. "online" rotates them in the cache and
back after attention (the same function; the folded weights differ from the originals by their rounding).
A cache made from a config alone (no model to fold) rotates online.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from quant.methods.base import (MethodConfig, QuantLayer, addresses, block_flush_chunk, cat_tokens, check,
                                check_pow2_group, check_zero_point, own)
from quant.packed import TL_BLOCK, PackedKV, QTensor, cat_optional, quantize, quantize_segments
from quant.primitives import hadamard


@dataclass(frozen=True)
class OScaRConfig(MethodConfig):
    method = "oscar"
    bits: int = 2
    group_size: int = 32
    residual_length: int = 128
    rotation: str = "hadamard"  # "hadamard" | "none"
    # Where the values' H_d lives: "offline" folded into v_proj / o_proj by make_cache(method, model) (the
    # official code's choice; the kernels then skip V's rotation in the pack and after attention), "online"
    # in the cache.
    value_rotation: str = "offline"
    token_norm: bool = True
    # [ours] key groups also end at modality boundaries (needs cache.set_modalities). Off by default:
    # measured ~1% lower key error on mixed sequences for +1.5% scale storage (see harness tni / notes).
    align_modality_groups: bool = False
    # "integer" z = round(-min / s), as the official framework and CUDA pack round it; "float": the minimum itself
    # (KIVI's convention). Both store the offset zero = -s * z or min; the fused packs here write either.
    zero_point: str = "float"

    def validate(self):
        check(self.bits in (2, 3, 4), f"oscar.bits must be 2, 3 or 4, got {self.bits}")
        check_pow2_group("oscar.group_size", self.group_size)
        check(self.rotation in ("hadamard", "none"),
              f"oscar.rotation must be 'hadamard' or 'none', got {self.rotation!r}")
        check(self.value_rotation in ("offline", "online"),
              "oscar.value_rotation must be 'offline' (folded into v_proj/o_proj) or 'online', "
              f"got {self.value_rotation!r}")
        check(isinstance(self.align_modality_groups, bool), "oscar.align_modality_groups must be true or false")
        check_zero_point("oscar", self.zero_point)
        check(self.residual_length > 0 and self.residual_length % self.group_size == 0,
              f"oscar.residual_length ({self.residual_length}) must be a positive multiple of group_size "
              f"({self.group_size})")

    @property
    def folds_values(self) -> bool:
        return self.rotation == "hadamard" and self.value_rotation == "offline"

    @property
    def kernel_decode(self) -> bool:
        # The kernels implement INT2 in 32-token key groups; modality-aligned groups have variable lengths.
        return self.bits == 2 and self.group_size == 32 and not self.align_modality_groups

    def exact_chunk(self, position):
        return block_flush_chunk(position, self.residual_length)

    def make_layer(self, ctx):
        return OScaRLayer(self, ctx)


# The code order each kernel backend's decode reads (quant/packed.py).
DECODE_ORDER = {"cuda": "frag", "triton": "tl"}


def token_norms(k_rot: torch.Tensor) -> torch.Tensor:
    """n_t = ||K_rot[b, :, t, :]||_2 over all KV heads and channels, float32 [B, T]; n <= 0 -> 1."""
    n = k_rot.float().pow(2).sum(dim=(1, 3)).sqrt()
    return torch.where(n > 0, n, torch.ones_like(n))


def aligned_starts(tags: torch.Tensor | None, start: int, length: int, group: int) -> torch.Tensor:
    """Group starts for a block of `length` tokens at cache position `start`: every `group` tokens and
    at every modality change in any batch row (tags [B, S] of the prompt; later positions are text)."""
    cuts = set(range(0, length, group))
    if tags is not None:
        pos = torch.arange(start, start + length)
        block = torch.where(pos < tags.shape[1], tags[:, pos.clamp(max=tags.shape[1] - 1)].cpu(), 0)
        change = (block[:, 1:] != block[:, :-1]).any(0).nonzero().flatten() + 1
        cuts.update(change.tolist())
    return torch.tensor(sorted(cuts), dtype=torch.long)


def pack_block(k: torch.Tensor, v: torch.Tensor, config: OScaRConfig, rot: torch.Tensor | None,
               starts: torch.Tensor | None = None, rotate_values: bool = True, backend: str | None = None):
    """The reference packer for a block of T tokens (T a multiple of the group size).

    k, v: [B, H, T, D]. Returns (k_q: QTensor axis -2 of K_unit, v_q: QTensor axis -1 of V_rot,
    norms: float32 [B, T] or None when token scaling is off). `starts`: variable key groups.
    rotate_values=False: V is quantized as it comes (the model's weights carry its rotation).
    backend: the fused packer's (None: the device's default); "torch" packs here.
    """
    if k.is_cuda and config.bits == 2 and config.group_size == 32 and starts is None:
        from quant.kernels import pack_kv
        from quant.kernels.options import default_backend

        backend = backend or default_backend(k.device)
        if backend != "torch":  # the fused CUDA/Triton packer writes the same layout
            return pack_kv(k, v, rotate=rot is not None, token_norm=config.token_norm, backend=backend,
                           rotate_values=rot is not None and rotate_values, zero_point=config.zero_point)
    k_rot = k.float() @ rot if rot is not None else k.float()
    v_rot = v.float() @ rot if rot is not None and rotate_values else v.float()
    norms = token_norms(k_rot) if config.token_norm else None
    k_unit = k_rot / norms[:, None, :, None] if norms is not None else k_rot
    return (
        quantize(k_unit, config.bits, config.group_size, axis=-2, zero_point=config.zero_point) if starts is None
        else quantize_segments(k_unit, config.bits, starts.to(k.device), config.zero_point),
        quantize(v_rot, config.bits, config.group_size, axis=-1, zero_point=config.zero_point),
        norms,
    )


HEADROOM = 256  # tokens of packed room a flush leaves beyond what it stores (growing copies the packed part)
# Tokens packed in one pass: the reference pack's float32 temporaries of a long prompt stay this size (every group,
# 32 tokens of keys or one token of values, lies inside a chunk, so chunking changes no code).
PACK_CHUNK = 2048


def _rows(q: QTensor, name: str, tokens: int) -> int:
    """Rows along dim 2 of q's `name` tensor (codes, scale or zero) that `tokens` tokens take."""
    if q.axis == -1:
        return tokens
    return tokens // (32 // q.bits) if name == "codes" else tokens // q.group


def _buffer(like: QTensor, tokens: int, old: QTensor | None = None) -> QTensor:
    """Zeroed buffers for `tokens` tokens laid out as `like`, holding `old`'s tokens at the start."""
    parts = {}
    for name in ("codes", "scale", "zero"):
        t = getattr(like, name)
        parts[name] = t.new_zeros(*t.shape[:2], _rows(like, name, tokens), *t.shape[3:])
        if old is not None:
            parts[name][:, :, :getattr(old, name).shape[2]] = getattr(old, name)
    return replace(like, **parts)


def _write(buf: QTensor, block: QTensor, at: int) -> None:
    for name in ("codes", "scale", "zero"):
        r = _rows(buf, name, at)
        getattr(buf, name)[:, :, r:r + getattr(block, name).shape[2]] = getattr(block, name)


def _head(buf: QTensor, tokens: int) -> QTensor:
    """The first `tokens` tokens of a buffer (views)."""
    return replace(buf, **{n: getattr(buf, n)[:, :, :_rows(buf, n, tokens)] for n in ("codes", "scale", "zero")})


class OScaRLayer(QuantLayer):
    """Packed tokens live in buffers with room to spare (`_kbuf`, `_vbuf`, `_nbuf`: HEADROOM tokens more than stored
    after each growth), so a flush writes its block in place and the kernel path reads the buffers with the valid
    length on the device (`_kv_lens`): no per-flush copy of the cache, no transient second copy. `k_q`, `v_q` and
    `norms` are views of the stored tokens (what the reference path reads and nbytes() counts)."""

    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self.k_q: QTensor | None = None
        self.v_q: QTensor | None = None
        self.norms: torch.Tensor | None = None
        self.k_res: torch.Tensor | None = None
        self.v_res: torch.Tensor | None = None
        self._rot: torch.Tensor | None = None
        self._win: tuple[torch.Tensor, torch.Tensor] | None = None  # the fast path's fixed window (see _fast_step)
        self._win_len: torch.Tensor | None = None
        self._values_rotated = True  # the cache rotates V (and the output back); see lazy_initialization
        self._kbuf: QTensor | None = None  # packed buffers (see the class docstring); None: k_q/v_q/norms are all
        self._vbuf: QTensor | None = None
        self._nbuf: torch.Tensor | None = None
        self._kv_lens: torch.Tensor | None = None  # int32 [B] on the device: the packed tokens, for the kernels
        self._reserve = 0  # tokens to make room for at the next growth (fill_random knows the length ahead)

    @staticmethod
    def stack_rows(rows: list["OScaRLayer"], state) -> "OScaRRows":
        """The rows of a padded batch in one layer for the kernel path's decode steps (quant/rows.py)."""
        return OScaRRows.from_rows(rows, state)

    def lazy_initialization(self, key_states, value_states):
        super().lazy_initialization(key_states, value_states)
        # The values arrive rotated when make_cache folded H_d into the model's weights (quant/fold.py).
        self._values_rotated = not self.ctx.state.values_folded
        if self.config.rotation == "hadamard":
            self._rot = hadamard(self.ctx.head_dim, device=self.device)

    def _append(self, k, v):
        c = self.config
        self.k_res = cat_tokens(self.k_res, k)
        self.v_res = cat_tokens(self.v_res, v)
        full = (self.k_res.shape[-2] // c.residual_length) * c.residual_length
        if full:
            start = 0 if self.k_q is None else self.k_q.num_tokens
            starts = (aligned_starts(self.ctx.state.modalities, start, full, c.group_size)
                      if c.align_modality_groups else None)
            backend = self._backend()
            if starts is not None:  # variable groups: one block, appended as it comes
                k_q, v_q, norms = pack_block(self.k_res[..., :full, :], self.v_res[..., :full, :], c, self._rot, starts,
                                             self._values_rotated, backend)
                self.k_q, self.v_q = cat_optional(self.k_q, k_q), cat_optional(self.v_q, v_q)
                if norms is not None:
                    self.norms = norms if self.norms is None else torch.cat([self.norms, norms], -1)
            else:
                if full > PACK_CHUNK:  # a long prompt: one allocation for all its chunks
                    self._reserve = max(self._reserve, start + full + HEADROOM)
                for t0 in range(0, full, PACK_CHUNK):  # groups never cross a chunk: the codes of one pass
                    self._pack_store(self.k_res[..., t0:min(full, t0 + PACK_CHUNK), :],
                                     self.v_res[..., t0:min(full, t0 + PACK_CHUNK), :], backend)
            self.k_res, self.v_res = own(self.k_res[..., full:, :]), own(self.v_res[..., full:, :])

    def _pack_store(self, k: torch.Tensor, v: torch.Tensor, backend: str | None) -> None:
        """Pack a block of whole groups (the run's pack) and store it in the decode backend's code order."""
        self._store(*self._pack(k, v, backend))

    def _pack(self, k: torch.Tensor, v: torch.Tensor, backend: str | None):
        """(k_q, v_q, norms) of a block of whole groups, packed by the run's pack in the decode backend's code order."""
        k_q, v_q, norms = pack_block(k, v, self.config, self._rot, None, self._values_rotated, backend)
        order = DECODE_ORDER.get(backend) if self.ctx.state.fast_decode else None
        if (order is not None and k_q.order != order and k.shape[-2] % TL_BLOCK == 0
                and self.ctx.head_dim in (64, 128)):
            # the order the backend's decode reads (the CUDA pack writes it; the Triton and reference packs the
            # natural one): converted once per flushed block
            k_q, v_q = k_q.to_order(order), v_q.to_order(order)
        return k_q, v_q, norms

    def _store(self, k_q: QTensor, v_q: QTensor, norms: torch.Tensor | None) -> None:
        """Write a packed block after the stored tokens, growing the buffers when it does not fit."""
        n = 0 if self.k_q is None else self.k_q.num_tokens
        if self.k_q is not None and k_q.order != self.k_q.order:
            k_q, v_q = k_q.to_order(self.k_q.order), v_q.to_order(self.k_q.order)
        full = k_q.num_tokens
        if self._kbuf is None or n + full > self._kbuf.num_tokens:
            self._grow(k_q, v_q, norms, max(n + full + HEADROOM, self._reserve))
        _write(self._kbuf, k_q, n)
        _write(self._vbuf, v_q, n)
        if norms is not None:
            self._nbuf[:, n:n + full] = norms
        self._view(n + full)

    def _grow(self, k_like: QTensor, v_like: QTensor, norms_like, tokens: int) -> None:
        tokens = -(-tokens // TL_BLOCK) * TL_BLOCK
        self._kbuf, self._vbuf = _buffer(k_like, tokens, self.k_q), _buffer(v_like, tokens, self.v_q)
        self._nbuf = None
        if norms_like is not None:
            self._nbuf = norms_like.new_ones(norms_like.shape[0], tokens)
            if self.norms is not None:
                self._nbuf[:, :self.norms.shape[-1]] = self.norms

    def _view(self, tokens: int) -> None:
        self.k_q, self.v_q = _head(self._kbuf, tokens), _head(self._vbuf, tokens)
        self.norms = self._nbuf[:, :tokens] if self._nbuf is not None else None
        if self._kv_lens is not None:
            self._kv_lens.fill_(tokens)
        elif self._win is not None:  # the first flush on the kernel path (an eager step): the kernels need the length
            self._kv_lens = torch.full((self._kbuf.codes.shape[0],), tokens, dtype=torch.int32,
                                       device=self._kbuf.codes.device)

    def _backend(self) -> str | None:
        """The run's kernel backend on this layer's device (None before the first tokens arrive: pack_block's
        default)."""
        kernels = self.ctx.state.kernels
        if kernels is None or not self.is_initialized:
            return None
        return kernels.backend_for(self.device)

    def update(self, key_states, value_states, *args, **kwargs):
        """Decode steps on the fast path hand the attention function the packed state itself
        (quant.kernels.hf_decode.packed_attention); everything else goes through the dense reference.
        Only single sequences take it: the kernels ignore the attention mask, so a left-padded batch
        would attend to its padding."""
        fast = self.ctx.state.fixed_step(key_states.shape[0])
        if key_states.shape[-2] == 1 and fast and self.is_initialized:
            return self._fast_step(key_states, value_states), None
        self._win = None  # the dense path re-forms k_res; a later fast step copies it into new buffers
        return super().update(key_states, value_states, *args, **kwargs)

    # -- the kernels' decode step ------------------------------------------------------------
    # The window lives in fixed buffers of R tokens (`_win`) whose valid length is counted on the device
    # (`_win_len`, the kernels' res_lens), and k_res / v_res are views of their first tokens. A step's device
    # work then has the same shapes and addresses every time, so a CUDA graph can replay it
    # (quant.kernels.graph_decode); the host's share is `advance_host`. The token that fills the window
    # flushes it like `_append` (never inside a graph: see `graph_ready`). nbytes() counts the valid window
    # tokens, as the reference path stores them; the buffers hold up to R - 1 more.

    def _fast_step(self, k, v):
        from quant.kernels.hf_decode import PackedStep

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
            kv = PackedKV(self._kbuf, self._vbuf, self._nbuf, self._win[0], self._win[1], self._rot,
                          self._values_rotated)
            lens = self._kv_lens
        kernels = self.ctx.state.kernels
        return PackedStep(kv, lens, self._win_len, kernels.backend if kernels else None,
                          kernels.wide_decode if kernels else True)

    def _open_window(self):
        b, h, n, d = self.k_res.shape
        if self.k_q is not None and self._kbuf is None:  # packed state made elsewhere (a copy, a reorder): buffered
            k_q, v_q, norms = self.k_q, self.v_q, self.norms
            self.k_q = self.v_q = self.norms = None
            self._store(k_q, v_q, norms)
        if self._kbuf is not None:
            self._kv_lens = torch.full((b,), self.k_q.num_tokens, dtype=torch.int32, device=self.k_res.device)
        self._win = tuple(torch.zeros(b, h, self.config.residual_length, d, dtype=x.dtype, device=x.device)
                          for x in (self.k_res, self.v_res))
        self._win[0][..., :n, :] = self.k_res
        self._win[1][..., :n, :] = self.v_res
        self._win_len = self.ctx.state.window_length(self.ctx.layer_idx, self.ctx.num_layers, b, self.k_res.device)
        self._win_len.fill_(n)
        self.k_res, self.v_res = self._win[0][..., :n, :], self._win[1][..., :n, :]

    # -- filled directly (benchmarks: speed does not depend on the values) --------------------------
    def fill_random(self, batch: int, length: int, device, dtype=torch.bfloat16, seed: int = 0, chunk: int = 16384):
        """Store `length` random N(0, 1) tokens as a prompt would be stored: floor(length / R) * R packed (in chunks,
        through the run's pack), the rest in the window."""
        g = torch.Generator(device=device).manual_seed(seed)
        shape = (batch, self.ctx.num_kv_heads, 0, self.ctx.head_dim)
        empty = torch.empty(shape, dtype=dtype, device=device)
        self.lazy_initialization(empty, empty)
        r = self.config.residual_length
        chunk = max(r, chunk // r * r)
        self._reserve = length // r * r + HEADROOM  # one allocation for the whole fill
        for t0 in range(0, length, chunk):
            n = min(chunk, length - t0)
            k, v = (torch.randn(batch, shape[1], n, shape[3], device=device, generator=g).to(dtype) for _ in range(2))
            self._append(k, v)
            self.seen += n

    def copy_from(self, other: "OScaRLayer") -> None:
        """Take a copy of another layer's stored state (benchmarks fill one layer and copy it to the others)."""
        self.dtype, self.device, self.batch = other.dtype, other.device, other.batch
        self.is_initialized, self.seen, self._rot = True, other.seen, other._rot
        self._values_rotated = other._values_rotated
        for name in other._state_names():
            value = getattr(other, name)
            setattr(self, name, value.map(torch.clone) if isinstance(value, QTensor) else value.clone())
        self._win = self._kbuf = self._vbuf = self._nbuf = None

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
        self._win = self._kbuf = self._vbuf = self._nbuf = self._kv_lens = None

    def _map_state(self, fn) -> None:
        super()._map_state(fn)  # the views are new tensors now: the buffers are rebuilt from them when needed
        self._win = self._kbuf = self._vbuf = self._nbuf = self._kv_lens = None

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The quantized part back in the model's basis, float32 [B, H, Tq, D] (None if empty)."""
        if self.k_q is None:
            return None
        k = self.k_q.dequantize()
        if self.norms is not None:
            k = k * self.norms[:, None, :, None]
        v = self.v_q.dequantize()
        if self._rot is not None:
            k = k @ self._rot
            v = v @ self._rot if self._values_rotated else v
        return k, v

    def _dense(self):
        deq = self.dequantized()
        if deq is None:
            return self.k_res, self.v_res
        return torch.cat([self.out_dtype(deq[0]), self.k_res], -2), torch.cat([self.out_dtype(deq[1]), self.v_res], -2)

    def packed_view(self) -> PackedKV:
        """The stored state as the handle fast attention kernels read (see quant.packed.PackedKV)."""
        return PackedKV(self.k_q, self.v_q, self.norms, self.k_res, self.v_res, self._rot, self._values_rotated)

    def _stored(self):
        return {"codes": [self.k_q, self.v_q], "norms": [self.norms], "residual": [self.k_res, self.v_res]}


class OScaRRows(OScaRLayer):
    """The sequences of a padded batch (quant/rows.py) in one layer of batch B on the kernel path, so that a decode
    step is one kernel launch per layer for the whole batch. Row b holds its own n_b packed tokens at the start of
    the packed buffers and w_b tokens at the start of the window: the kernels' per-sequence kv_lens and res_lens.

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
        self._win = tuple(torch.zeros(len(rows), h, r, d, dtype=x.dtype, device=self.device)
                          for x in (first.k_res, first.v_res))
        for b, row in enumerate(rows):
            self._win[0][b, :, :self._w[b]] = row.k_res[0]
            self._win[1][b, :, :self._w[b]] = row.v_res[0]
        self._win_len = torch.tensor(self._w, dtype=torch.int32, device=self.device)
        self._kv_lens = torch.tensor(self._n, dtype=torch.int32, device=self.device)
        self._ranges: dict[int, torch.Tensor] = {}
        k_like, v_like, n_like = self._pack(*self._win, self._backend())  # the packed layout of a block of B rows
        self._kbuf, self._vbuf = _buffer(k_like, self._capacity()), _buffer(v_like, self._capacity())
        self._nbuf = None if n_like is None else n_like.new_ones(len(rows), self._kbuf.num_tokens)
        for b, row in enumerate(rows):
            if self._n[b]:
                _write(self._kbuf.map(lambda t: t[b:b + 1]), row.k_q.to_order(k_like.order), 0)
                _write(self._vbuf.map(lambda t: t[b:b + 1]), row.v_q.to_order(v_like.order), 0)
                if self._nbuf is not None:
                    self._nbuf[b, :self._n[b]] = row.norms[0]
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
            raise ValueError("a padded batch on the kernel path takes one new token per sequence at a time; "
                             f"got {key_states.shape[-2]}")
        return self._rows_step(key_states, value_states), None

    def _rows_step(self, k, v):
        from quant.kernels.hf_decode import PackedStep

        r = self.config.residual_length
        if not self.graph_ready():  # grow: an eager step
            cap = self._capacity()
            self._kbuf, self._vbuf = _buffer(self._kbuf, cap, self._kbuf), _buffer(self._vbuf, cap, self._vbuf)
            if self._nbuf is not None:
                grown = self._nbuf.new_ones(self._nbuf.shape[0], self._kbuf.num_tokens)
                grown[:, :self._nbuf.shape[1]] = self._nbuf
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
        kernels = self.ctx.state.kernels
        return PackedStep(kv, self._kv_lens, self._win_len, kernels.backend if kernels else None,
                          kernels.wide_decode if kernels else True)

    def graph_ready(self) -> bool:
        return max(self._n) + self.config.residual_length <= self._kbuf.num_tokens

    def graph_variant(self) -> bool:
        """Which of the two device works the next step is (quant.kernels.graph_decode keeps a graph of each): with the
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
            row.k_q = _head(self._kbuf.map(lambda t: t[b:b + 1]), n)
            row.v_q = _head(self._vbuf.map(lambda t: t[b:b + 1]), n)
            row.norms = None if self._nbuf is None else self._nbuf[b:b + 1, :n]
        row.k_res, row.v_res = self._win[0][b:b + 1, :, :w], self._win[1][b:b + 1, :, :w]
        return row

    def _dense(self):
        raise NotImplementedError("a padded batch's stacked layer decodes on the kernels only (quant/rows.py)")
