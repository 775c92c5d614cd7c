"""Decode through transformers on the fast kernels: a fixed-capacity OScaR cache and an attention function.

`packed_attention` is an AttentionInterface function ("oscar_packed"): when the cache hands it a
`PackedStep` (packed K/V plus lengths) instead of key/value tensors, it runs the decode kernel; otherwise
it is SDPA. `PackedDecodeLayer` is an OScaR cache layer with preallocated buffers (no per-step
concatenation): new tokens go to a residual window; every 128 tokens the window is packed by the kernel
into the next 128 slots of the packed buffers, so a step costs one window write plus, every 128th step,
one 128-token pack. `fill_random` fills it directly at a target length (benchmarks: speed does not
depend on the values). Prefill goes through the model with exact K/V and is packed the same way.
Like OScaR's default config, it takes the values as already rotated (the Hadamard folded into v_proj / o_proj,
quant/fold.py; benchmarks on random weights need no folding): `rotate_values=True` rotates them here instead.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from quant.kernels import decode_attention, default_backend, pack_kv
from quant.packed import PackedKV, QTensor
from quant.primitives import hadamard

BLOCK = 128  # residual window = flush block (OScaR's R)


@dataclass
class PackedStep:
    """What a packed layer hands the attention function: the layer's PackedKV (buffers at capacity) and
    the valid lengths per sequence, int32 [B] on the device."""

    kv: PackedKV
    kv_lens: torch.Tensor
    res_lens: torch.Tensor
    backend: str | None = None  # None: quant.kernels.default_backend


class PackedDecodeLayer(CacheLayerMixin):
    is_compileable = False
    is_sliding = False

    def __init__(self, capacity: int, backend: str | None = None, rotate_values: bool = False):
        super().__init__()
        self.capacity = -(-capacity // BLOCK) * BLOCK
        self.backend = backend
        self.rotate_values = rotate_values
        self.quantized = 0  # tokens packed
        self.res = 0  # tokens in the window

    def lazy_initialization(self, key_states, value_states):
        b, h, _, d = key_states.shape
        dev, self.dtype, self.device = key_states.device, key_states.dtype, key_states.device
        i32, f16 = dict(dtype=torch.int32, device=dev), dict(dtype=torch.float16, device=dev)
        t = self.capacity
        # the order the backend's decode reads: CUDA's pack writes "frag"; Triton's writes natural codes, which each
        # flushed block converts to "tl" once (_pack_into) rather than every decode call
        order = {"cuda": "frag", "triton": "tl"}.get(self.backend or default_backend(dev), "natural")
        self.k = QTensor(torch.zeros(b, h, t // 16, d, **i32), torch.zeros(b, h, t // 32, d, **f16),
                         torch.zeros(b, h, t // 32, d, **f16), 2, 32, -2, order=order)
        self.v = QTensor(torch.zeros(b, h, t, d // 16, **i32), torch.zeros(b, h, t, d // 32, **f16),
                         torch.zeros(b, h, t, d // 32, **f16), 2, 32, -1, order=order)
        self.norms = torch.ones(b, t, dtype=torch.float32, device=dev)
        self.k_res = torch.zeros(b, h, BLOCK, d, dtype=key_states.dtype, device=dev)
        self.v_res = torch.zeros_like(self.k_res)
        self.rot = hadamard(d, device=dev)
        self.kv_lens = torch.zeros(b, dtype=torch.int32, device=dev)
        self.res_lens = torch.zeros(b, dtype=torch.int32, device=dev)
        self.is_initialized = True

    def _pack_into(self, k, v):
        """Pack K, V [B, H, n, D] (n % 32 == 0) into the slots after the packed tokens."""
        n, t0 = k.shape[2], self.quantized
        if t0 + n > self.capacity:
            raise ValueError(f"cache capacity {self.capacity} exceeded: make it larger")
        kq, vq, norms = pack_kv(k, v, backend=self.backend, rotate_values=self.rotate_values)
        kq, vq = kq.to_order(self.k.order), vq.to_order(self.v.order)  # blocks are self-contained
        self.k.codes[:, :, t0 // 16:(t0 + n) // 16] = kq.codes
        self.k.scale[:, :, t0 // 32:(t0 + n) // 32], self.k.zero[:, :, t0 // 32:(t0 + n) // 32] = kq.scale, kq.zero
        self.v.codes[:, :, t0:t0 + n], self.v.scale[:, :, t0:t0 + n], self.v.zero[:, :, t0:t0 + n] = (
            vq.codes, vq.scale, vq.zero)
        self.norms[:, t0:t0 + n] = norms
        self.quantized += n
        self.kv_lens.fill_(self.quantized)

    def _append(self, k, v):
        """Store new tokens: full blocks are packed, the rest waits in the window."""
        pending_k = torch.cat([self.k_res[:, :, :self.res], k], 2)
        pending_v = torch.cat([self.v_res[:, :, :self.res], v], 2)
        full = pending_k.shape[2] // BLOCK * BLOCK
        if full:
            self._pack_into(pending_k[:, :, :full], pending_v[:, :, :full])
        self.res = pending_k.shape[2] - full
        self.k_res[:, :, :self.res] = pending_k[:, :, full:]
        self.v_res[:, :, :self.res] = pending_v[:, :, full:]
        self.res_lens.fill_(self.res)

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.shape[2] > 1:  # prefill: attend with the exact K/V, then store
            past = self.quantized + self.res
            if past:
                raise NotImplementedError("chunked prefill over a packed cache is not supported here")
            self._append(key_states, value_states)
            return key_states, value_states
        if self.res == BLOCK - 1:  # this token completes the window: pack it, then attend
            self._append(key_states, value_states)
        else:
            self.k_res[:, :, self.res] = key_states[:, :, 0]
            self.v_res[:, :, self.res] = value_states[:, :, 0]
            self.res += 1
            self.res_lens.fill_(self.res)
        view = PackedKV(self.k, self.v, self.norms, self.k_res[:, :, :max(self.res, 0)],
                        self.v_res[:, :, :max(self.res, 0)], self.rot, self.rotate_values)
        return PackedStep(view, self.kv_lens, self.res_lens, self.backend), None

    def fill_random(self, batch, heads, head_dim, length, device, dtype=torch.bfloat16, chunk=16384, seed=0):
        """Fill with `length` random tokens: floor(length / 128) * 128 packed, the rest in the window."""
        g = torch.Generator(device=device).manual_seed(seed)
        x = torch.empty(batch, heads, 1, head_dim, device=device, dtype=dtype)
        self.lazy_initialization(x, x)
        full = length // BLOCK * BLOCK
        for t0 in range(0, full, chunk):
            n = min(chunk, full - t0)
            k = torch.randn(batch, heads, n, head_dim, device=device, generator=g).to(dtype)
            self._pack_into(k, torch.randn(batch, heads, n, head_dim, device=device, generator=g).to(dtype))
        self.res = length - full
        self.k_res[:, :, :self.res].normal_(generator=g)
        self.v_res[:, :, :self.res].normal_(generator=g)
        self.res_lens.fill_(self.res)

    def copy_from(self, other: "PackedDecodeLayer") -> None:
        """Take another filled layer's contents (benchmarks fill one layer and copy it)."""
        x = other.k_res[:, :, :1]
        self.lazy_initialization(x, x)
        for mine, theirs in ((self.k, other.k), (self.v, other.v)):
            for f in ("codes", "scale", "zero"):
                getattr(mine, f).copy_(getattr(theirs, f))
        for name in ("norms", "k_res", "v_res", "kv_lens", "res_lens"):
            getattr(self, name).copy_(getattr(other, name))
        self.quantized, self.res = other.quantized, other.res

    def get_seq_length(self) -> int:
        return self.quantized + self.res

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return self.capacity

    def nbytes(self) -> int:
        """Bytes held (buffers at capacity): codes, scales, norms and the window."""
        parts = [self.k.codes, self.k.scale, self.k.zero, self.v.codes, self.v.scale, self.v.zero, self.norms,
                 self.k_res, self.v_res]
        return sum(p.nbytes for p in parts)


class DenseDecodeLayer(CacheLayerMixin):
    """The BF16 baseline with the same mechanics: preallocated K/V, in-place appends, views of the valid
    part handed to SDPA (no per-step concatenation, no mask at Lq = 1)."""

    is_compileable = False
    is_sliding = False

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.length = capacity, 0

    def lazy_initialization(self, key_states, value_states):
        b, h, _, d = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = torch.zeros(b, h, self.capacity, d, dtype=key_states.dtype, device=key_states.device)
        self.values = torch.zeros_like(self.keys)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[2]
        if self.length + n > self.capacity:
            raise ValueError(f"cache capacity {self.capacity} exceeded: make it larger")
        self.keys[:, :, self.length:self.length + n] = key_states
        self.values[:, :, self.length:self.length + n] = value_states
        self.length += n
        return self.keys[:, :, :self.length], self.values[:, :, :self.length]

    def fill_random(self, batch, heads, head_dim, length, device, dtype=torch.bfloat16, seed=0):
        x = torch.empty(batch, heads, 1, head_dim, device=device, dtype=dtype)
        self.lazy_initialization(x, x)
        g = torch.Generator(device=device).manual_seed(seed)
        self.keys[:, :, :length].normal_(generator=g)
        self.values[:, :, :length].normal_(generator=g)
        self.length = length

    def copy_from(self, other: "DenseDecodeLayer") -> None:
        x = other.keys[:, :, :1]
        self.lazy_initialization(x, x)
        self.keys.copy_(other.keys)
        self.values.copy_(other.values)
        self.length = other.length

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return self.capacity

    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


def make_packed_cache(num_layers: int, capacity: int, backend: str | None = None) -> Cache:
    return Cache(layers=[PackedDecodeLayer(capacity, backend) for _ in range(num_layers)])


def packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """AttentionInterface function: PackedStep or PackedKV (what a cache layer's update returns at decode)
    -> decode kernel (backend: quant.kernels.default_backend unless the step names one); tensors -> SDPA.
    Returns [B, Lq, Hq, D] as transformers' attention functions do."""
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    if isinstance(key, PackedStep):
        out = decode_attention(query, key.kv, scaling, backend=key.backend,
                               kv_lens=key.kv_lens, res_lens=key.res_lens)
        return out.transpose(1, 2).contiguous(), None
    if isinstance(key, PackedKV):
        return decode_attention(query, key, scaling).transpose(1, 2).contiguous(), None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=query.shape[2] > 1, **kwargs)


def decode_mask(batch_size: int, q_length: int, kv_length: int, *args, attention_mask=None, **kwargs):
    """sdpa_mask, except None for one new token per sequence without a padding mask: that token sees every
    cached token, so the mask is all true. (sdpa_mask drops such masks itself when it can inspect them, but
    not while a CUDA graph is being captured: the captured BF16 step then ran SDPA with a materialized mask,
    a slower kernel, and replayed slower than the eager step; quant/kernels/NOTES.md run 12.)"""
    from transformers.masking_utils import sdpa_mask

    if q_length == 1 and attention_mask is None:
        return None
    return sdpa_mask(batch_size, q_length, kv_length, *args, attention_mask=attention_mask, **kwargs)


def register(name: str = "oscar_packed") -> str:
    """Register `packed_attention` with transformers; load a model with attn_implementation=name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, packed_attention)
    # Without a mask function of its own the mask is silently None and left padding breaks on prefill.
    AttentionMaskInterface.register(name, decode_mask)
    return name
