"""The end-to-end benchmark's caches, filled directly at a target length (speed does not depend on the values).

"oscar" is the cache `make eval` decodes with (quant.make_cache("oscar"), its layers on the kernel path), filled
through the run's own pack. "bf16" is `DenseDecodeLayer`: the BF16 baseline with the machinery a fast BF16 decode
uses, preallocated K/V written in place and views of the valid part handed to SDPA (no per-step concatenation, no
mask at one query token). Both replay a captured decode step idempotently: the step writes the same cache slot
each time (BF16: a host-constant position; OScaR: `repeat_step` resets the layers' window lengths in one launch).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


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
        self.keys[:, :, self.length : self.length + n] = key_states
        self.values[:, :, self.length : self.length + n] = value_states
        self.length += n
        return self.keys[:, :, : self.length], self.values[:, :, : self.length]

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


def make_cache(kind: str, cfg, batch: int, ctx: int, steps: int, kernels=None) -> Cache:
    """A cache of `kind` (bf16 | oscar) holding `ctx` random tokens in every layer (the same values in each: layer 0
    is filled and copied). `kernels`: the run's quant.kernels.KernelOptions (OScaR's backend and builds)."""
    if kind == "bf16":
        layers = [DenseDecodeLayer(ctx + steps + 256) for _ in range(cfg.num_hidden_layers)]
        layers[0].fill_random(batch, cfg.num_key_value_heads, cfg.head_dim, ctx, "cuda")
        for layer in layers[1:]:
            layer.copy_from(layers[0])
        return Cache(layers=layers)
    import quant

    cache = quant.make_cache(kind, config=cfg, kernels=kernels)
    if not cache.method.kernel_decode:
        raise ValueError(f"the e2e bench times methods with a kernel decode; {kind} has none")
    cache.state.values_folded = True  # random weights: the values count as rotated, as OScaR's folded default
    cache.state.fast_decode = True  # build_model's attention function takes the packed steps
    cache.state.uniform_rows = True  # every sequence is filled to the same length
    cache.layers[0].fill_random(batch, ctx, "cuda")
    for layer in cache.layers[1:]:
        layer.copy_from(cache.layers[0])
    return cache


def repeat_step(cache):
    """A function to run before each replay of a captured decode step so that every replay writes the same slot:
    OScaR's window lengths back to their value now (one launch for all layers); nothing for a BF16 cache."""
    lengths = getattr(getattr(cache, "state", None), "window_lengths", None)
    if lengths is None:
        return lambda: None
    saved = lengths.clone()
    return lambda: lengths.copy_(saved)


def kv_bytes(cache) -> int:
    """Bytes the cache's layers hold: a quantized cache's stored tensors (quant.cache.QuantizedKVCache.nbytes), a
    BF16 cache's preallocated buffers."""
    if hasattr(cache, "state"):
        return cache.nbytes()["total"]
    return sum(layer.nbytes() for layer in cache.layers)
