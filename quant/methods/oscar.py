"""OScaR (arXiv 2605.19660): Canalized Rotation + Omni-Token Scaling, then KIVI-style INT2.

Keys: rotate every head with the normalized Sylvester Hadamard H_d (natural order, no signs), divide
each token by its norm n_t over ALL KV heads and channels (one fp32 per token per layer), quantize per
channel in groups of G tokens. Values: rotate with the same H_d, quantize per token in groups of G
channels (not norm-scaled). New tokens wait in a full-precision window; every R tokens the block is
quantized (block flush for K and V); the prompt quantizes floor(L / R) * R tokens.
Dequantized: K = (K_unit_hat * n) @ H_d, V = V_hat @ H_d (H_d is symmetric and its own inverse).

The values' rotation is "offline" by default, as in the official code: quant.prepare_model(model, method, ...)
folds H_d into the model's v_proj rows and o_proj columns (quant/fold.py), so the values arrive rotated, are
quantized as they come, and the attention output goes to o_proj in that basis. "online" rotates them in the cache
and back after attention (the same function; the folded weights differ from the originals by their rounding).
A cache made from a config alone (no model to fold) rotates online.

This file holds the method: its config, the reference math (pack_block) and the storage (OScaRLayer: packed
buffers, the full-precision window, the dense reference path). The fixed-shape decode steps of the kernel path
(a fixed window, CUDA-graph replay, a padded batch's stacked rows) are the decode engine's: quant/engine/oscar.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from quant.methods.base import (
    MethodConfig,
    QuantLayer,
    block_flush_chunk,
    cat_tokens,
    check,
    check_pow2_group,
    check_zero_point,
    own,
)
from quant.packed import TL_BLOCK, PackedKV, QTensor, cat_optional, pack_reference, token_norms  # noqa: F401
from quant.primitives import hadamard


@dataclass(frozen=True)
class OScaRConfig(MethodConfig):
    method = "oscar"
    bits: int = 2
    group_size: int = 32
    residual_length: int = 128
    rotation: str = "hadamard"  # "hadamard" | "none"
    # Where the values' H_d lives: "offline" folded into v_proj / o_proj by quant.prepare_model (the
    # official code's choice; the kernels then skip V's rotation in the pack and after attention), "online"
    # in the cache.
    value_rotation: str = "offline"
    token_norm: bool = True
    # [ours] key groups also end at modality boundaries (needs cache.set_modalities). Off by default:
    # every boundary adds a key group's scales and zeros (docs/METHODS.md).
    align_modality_groups: bool = False
    # "integer" z = round(-min / s), as the official framework and CUDA pack round it; "float": the minimum itself
    # (KIVI's convention). Both store the offset zero = -s * z or min; the fused packs here write either.
    zero_point: str = "float"

    def validate(self):
        check(self.bits in (2, 3, 4), f"oscar.bits must be 2, 3 or 4, got {self.bits}")
        check_pow2_group("oscar.group_size", self.group_size)
        check(
            self.rotation in ("hadamard", "none"), f"oscar.rotation must be 'hadamard' or 'none', got {self.rotation!r}"
        )
        check(
            self.value_rotation in ("offline", "online"),
            "oscar.value_rotation must be 'offline' (folded into v_proj/o_proj) or 'online', "
            f"got {self.value_rotation!r}",
        )
        check(isinstance(self.align_modality_groups, bool), "oscar.align_modality_groups must be true or false")
        check_zero_point("oscar", self.zero_point)
        check(
            self.residual_length > 0 and self.residual_length % self.group_size == 0,
            f"oscar.residual_length ({self.residual_length}) must be a positive multiple of group_size "
            f"({self.group_size})",
        )

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
        """The storage layer (reference path); a cache whose config has fixed-shape decode steps takes the engine's
        subclass instead (quant.engine.make_layer)."""
        return OScaRLayer(self, ctx)


# The code order each kernel backend's decode reads (quant/packed.py).
DECODE_ORDER = {"cuda": "frag", "triton": "tl"}


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


def pack_block(
    k: torch.Tensor,
    v: torch.Tensor,
    config: OScaRConfig,
    rot: torch.Tensor | None,
    starts: torch.Tensor | None = None,
    rotate_values: bool = True,
    backend: str | None = None,
):
    """The reference packer for a block of T tokens (T a multiple of the group size).

    k, v: [B, H, T, D]. Returns (k_q: QTensor axis -2 of K_unit, v_q: QTensor axis -1 of V_rot,
    norms: float32 [B, T] or None when token scaling is off). `starts`: variable key groups.
    rotate_values=False: V is quantized as it comes (the model's weights carry its rotation).
    backend: the fused packer's (None: the device's default); "torch" packs here (quant.packed.pack_reference).
    """
    if k.is_cuda and config.bits == 2 and config.group_size == 32 and starts is None:
        from quant.kernels import pack_kv
        from quant.kernels.options import default_backend

        backend = backend or default_backend(k.device)
        if backend != "torch":  # the fused CUDA/Triton packer writes the same layout
            return pack_kv(
                k,
                v,
                rotate=rot is not None,
                token_norm=config.token_norm,
                backend=backend,
                rotate_values=rot is not None and rotate_values,
                zero_point=config.zero_point,
            )
    return pack_reference(
        k, v, config.bits, config.group_size, rot, config.token_norm, config.zero_point, starts, rotate_values
    )


HEADROOM = 256  # tokens of packed room a flush leaves beyond what it stores (growing copies the packed part)
# Tokens packed in one pass: the reference pack's float32 temporaries of a long prompt stay this size (every group,
# 32 tokens of keys or one token of values, lies inside a chunk, so chunking changes no code).
PACK_CHUNK = 2048


def rows_of(q: QTensor, name: str, tokens: int) -> int:
    """Rows along dim 2 of q's `name` tensor (codes, scale or zero) that `tokens` tokens take."""
    if q.axis == -1:
        return tokens
    return tokens // (32 // q.bits) if name == "codes" else tokens // q.group


def buffer_like(like: QTensor, tokens: int, old: QTensor | None = None) -> QTensor:
    """Zeroed buffers for `tokens` tokens laid out as `like`, holding `old`'s tokens at the start."""
    parts = {}
    for name in ("codes", "scale", "zero"):
        t = getattr(like, name)
        parts[name] = t.new_zeros(*t.shape[:2], rows_of(like, name, tokens), *t.shape[3:])
        if old is not None:
            parts[name][:, :, : getattr(old, name).shape[2]] = getattr(old, name)
    return replace(like, **parts)


def write_block(buf: QTensor, block: QTensor, at: int) -> None:
    for name in ("codes", "scale", "zero"):
        r = rows_of(buf, name, at)
        getattr(buf, name)[:, :, r : r + getattr(block, name).shape[2]] = getattr(block, name)


def head_of(buf: QTensor, tokens: int) -> QTensor:
    """The first `tokens` tokens of a buffer (views)."""
    return replace(buf, **{n: getattr(buf, n)[:, :, : rows_of(buf, n, tokens)] for n in ("codes", "scale", "zero")})


class OScaRLayer(QuantLayer):
    """OScaR's storage and its reference path. Packed tokens live in buffers with room to spare (`_kbuf`, `_vbuf`,
    `_nbuf`: HEADROOM tokens more than stored after each growth), so a flush writes its block in place and the kernel
    path (quant.engine.oscar.OScaRStepLayer) reads the buffers with the valid length on the device: no per-flush copy
    of the cache, no transient second copy. `k_q`, `v_q` and `norms` are views of the stored tokens (what the
    reference path reads and nbytes() counts)."""

    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self.k_q: QTensor | None = None
        self.v_q: QTensor | None = None
        self.norms: torch.Tensor | None = None
        self.k_res: torch.Tensor | None = None
        self.v_res: torch.Tensor | None = None
        self._rot: torch.Tensor | None = None
        self._values_rotated = True  # the cache rotates V (and the output back); see lazy_initialization
        self._kbuf: QTensor | None = None  # packed buffers (see the class docstring); None: k_q/v_q/norms are all
        self._vbuf: QTensor | None = None
        self._nbuf: torch.Tensor | None = None
        self._reserve = 0  # tokens to make room for at the next growth (fill_random knows the length ahead)

    def lazy_initialization(self, key_states, value_states):
        super().lazy_initialization(key_states, value_states)
        # The values arrive rotated when quant.prepare_model folded H_d into the model's weights (quant/fold.py).
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
            starts = (
                aligned_starts(self.ctx.state.modalities, start, full, c.group_size)
                if c.align_modality_groups
                else None
            )
            backend = self._backend()
            if starts is not None:  # variable groups: one block, appended as it comes
                k_q, v_q, norms = pack_block(
                    self.k_res[..., :full, :],
                    self.v_res[..., :full, :],
                    c,
                    self._rot,
                    starts,
                    self._values_rotated,
                    backend,
                )
                self.k_q, self.v_q = cat_optional(self.k_q, k_q), cat_optional(self.v_q, v_q)
                if norms is not None:
                    self.norms = norms if self.norms is None else torch.cat([self.norms, norms], -1)
            else:
                if full > PACK_CHUNK:  # a long prompt: one allocation for all its chunks
                    self._reserve = max(self._reserve, start + full + HEADROOM)
                for t0 in range(0, full, PACK_CHUNK):  # groups never cross a chunk: the codes of one pass
                    self._pack_store(
                        self.k_res[..., t0 : min(full, t0 + PACK_CHUNK), :],
                        self.v_res[..., t0 : min(full, t0 + PACK_CHUNK), :],
                        backend,
                    )
            self.k_res, self.v_res = own(self.k_res[..., full:, :]), own(self.v_res[..., full:, :])

    def _pack_store(self, k: torch.Tensor, v: torch.Tensor, backend: str | None) -> None:
        """Pack a block of whole groups (the run's pack) and store it in the decode backend's code order."""
        self._store(*self._pack(k, v, backend))

    def _pack(self, k: torch.Tensor, v: torch.Tensor, backend: str | None):
        """(k_q, v_q, norms) of a block of whole groups, packed by the run's pack in the decode backend's code order."""
        k_q, v_q, norms = pack_block(k, v, self.config, self._rot, None, self._values_rotated, backend)
        order = DECODE_ORDER.get(backend) if self.ctx.state.fast_decode else None
        if order is not None and k_q.order != order and k.shape[-2] % TL_BLOCK == 0 and self.ctx.head_dim in (64, 128):
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
        write_block(self._kbuf, k_q, n)
        write_block(self._vbuf, v_q, n)
        if norms is not None:
            self._nbuf[:, n : n + full] = norms
        self._view(n + full)

    def _grow(self, k_like: QTensor, v_like: QTensor, norms_like, tokens: int) -> None:
        tokens = -(-tokens // TL_BLOCK) * TL_BLOCK
        self._kbuf, self._vbuf = buffer_like(k_like, tokens, self.k_q), buffer_like(v_like, tokens, self.v_q)
        self._nbuf = None
        if norms_like is not None:
            self._nbuf = norms_like.new_ones(norms_like.shape[0], tokens)
            if self.norms is not None:
                self._nbuf[:, : self.norms.shape[-1]] = self.norms

    def _view(self, tokens: int) -> None:
        self.k_q, self.v_q = head_of(self._kbuf, tokens), head_of(self._vbuf, tokens)
        self.norms = self._nbuf[:, :tokens] if self._nbuf is not None else None

    def _backend(self) -> str | None:
        """The run's kernel backend on this layer's device (None before the first tokens arrive: pack_block's
        default)."""
        kernels = self.ctx.state.kernels
        if kernels is None or not self.is_initialized:
            return None
        return kernels.backend_for(self.device)

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
        self._kbuf = self._vbuf = self._nbuf = None

    def reset(self) -> None:
        super().reset()
        self._kbuf = self._vbuf = self._nbuf = None

    def _map_state(self, fn) -> None:
        super()._map_state(fn)  # the views are new tensors now: the buffers are rebuilt from them when needed
        self._kbuf = self._vbuf = self._nbuf = None

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
        deq = None if self.k_q is None else self._memo("kv", (self.k_q, self.v_q, self.norms), self.dequantized)
        if deq is None:
            return self.k_res, self.v_res
        return torch.cat([self.out_dtype(deq[0]), self.k_res], -2), torch.cat([self.out_dtype(deq[1]), self.v_res], -2)

    def packed_view(self) -> PackedKV:
        """The stored state as the handle fast attention kernels read (see quant.packed.PackedKV)."""
        return PackedKV(self.k_q, self.v_q, self.norms, self.k_res, self.v_res, self._rot, self._values_rotated)

    def _stored(self):
        return {"codes": [self.k_q, self.v_q], "norms": [self.norms], "residual": [self.k_res, self.v_res]}
