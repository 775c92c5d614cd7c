"""Whisper's KV cache with a method: its decoder's self-attention cache and its cross-attention cache, both the
project's QuantizedKVCache, in transformers' EncoderDecoderCache.

The cross-attention cache is written once, at the first decoder forward (the encoder's frames, projected by each
layer's k_proj / v_proj), and read at every later step. WhisperAttention reads it back from the layer's `keys` and
`values` attributes (transformers 5.x), not through `update`; `ReadBack` gives a quantized layer those attributes: the
layer's stored state dequantized, which is what a decode step of `update` returns for a self-attention layer. The
dequantized copy is kept while the stored state is unchanged (the same tensors at the same version counters), so a
decode step does not decode the encoder's frames again: the same numbers, without the per-step cost that made the
reference (torch) path several times slower than BF16 on a CPU. The copy is working memory of the reference path:
the cache's reported bytes (`nbytes`) are the stored codes, scales and window, what a kernel path holds. The first
forward (the decoder prompt) attends over the exact K/V, as every prompt does with this project's caches
(quant.methods.base.QuantLayer.update).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import CacheLayerMixin, EncoderDecoderCache

from quant.cache import MODALITIES, QuantizedKVCache, per_sequence


def _version(t: torch.Tensor) -> int | None:
    return None if t.is_inference() else t._version


class ReadBack(CacheLayerMixin):
    """One layer of a cross-attention cache, as WhisperAttention reads it: `keys` and `values` are the stored state
    dequantized (one dequantization serves the keys and the values of a step); everything else is the wrapped layer's.
    A CacheLayerMixin, as transformers' Cache checks its layers to be (its own __init__ is not run: it would set
    `keys` and `values`)."""

    def __init__(self, layer: CacheLayerMixin):
        object.__setattr__(self, "layer", layer)
        object.__setattr__(self, "_memo", None)  # (fingerprint of the stored state, dense keys, dense values)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.layer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.layer, name, value)

    def _state(self) -> list:
        tensors = []
        for name in self.layer._state_names():
            value = getattr(self.layer, name)
            tensors += [value.codes, value.scale, value.zero] if hasattr(value, "codes") else [value]
        return tensors

    def _dense(self):
        """The dequantized keys and values, kept while every stored tensor is the same object at the same in-place
        version (inference tensors keep none: the layer API below, through which the cache writes, drops the copy):
        a new tensor or an in-place write decodes again. The memo holds the tensors it compares, so an identity
        cannot be reused by a new tensor meanwhile."""
        state = self._state()
        memo = self._memo
        if (
            memo is None
            or len(memo[0]) != len(state)
            or any(t is not s or _version(t) != v for (s, v), t in zip(memo[0], state))
        ):
            memo = ([(t, _version(t)) for t in state], *self.layer._dense())
            object.__setattr__(self, "_memo", memo)
        return memo[1], memo[2]

    @property
    def keys(self):
        return self._dense()[0]

    @property
    def values(self):
        return self._dense()[1]

    # the layer API, each call the wrapped layer's
    def lazy_initialization(self, key_states, value_states):
        object.__setattr__(self, "_memo", None)
        return self.layer.lazy_initialization(key_states, value_states)

    def update(self, key_states, value_states, *args, **kwargs):
        object.__setattr__(self, "_memo", None)
        return self.layer.update(key_states, value_states, *args, **kwargs)

    def get_mask_sizes(self, query_length):
        return self.layer.get_mask_sizes(query_length)

    def get_seq_length(self):
        return self.layer.get_seq_length()

    def get_max_length(self):
        return self.layer.get_max_length()

    def reset(self):
        object.__setattr__(self, "_memo", None)
        return self.layer.reset()

    def reorder_cache(self, beam_idx):
        object.__setattr__(self, "_memo", None)
        return self.layer.reorder_cache(beam_idx)

    def offload(self):
        object.__setattr__(self, "_memo", None)
        return self.layer.offload()

    def prefetch(self):
        object.__setattr__(self, "_memo", None)
        return self.layer.prefetch()


def read_back(cache: QuantizedKVCache) -> QuantizedKVCache:
    """`cache` with its layers read as WhisperAttention reads a cross-attention cache (ReadBack)."""
    cache.layers = [ReadBack(layer) for layer in cache.layers]
    return cache


class QuantizedEncoderDecoderCache(EncoderDecoderCache):
    """EncoderDecoderCache of two QuantizedKVCaches, with what the runner reads of a cache: `method`, `state` (the
    self-attention cache's: decode steps, graph steps), `nbytes()` over both, `row(b)` for per-sequence accounting."""

    def __init__(self, self_attention_cache: QuantizedKVCache, cross_attention_cache: QuantizedKVCache):
        super().__init__(self_attention_cache, cross_attention_cache)
        self.method = self_attention_cache.method
        self.state = self_attention_cache.state
        self.modalities = self_attention_cache.modalities

    def nbytes(self) -> dict[str, Any]:
        """Both caches' bytes added up (QuantizedKVCache.nbytes' keys; per_layer lists the self-attention layers then
        the cross-attention ones), and each alone under "self_attention" / "cross_attention"."""
        mine, cross = self.self_attention_cache.nbytes(), self.cross_attention_cache.nbytes()
        total = mine["total"] + cross["total"]
        elements = self.self_attention_cache.num_elements() + self.cross_attention_cache.num_elements()
        modality = dict.fromkeys(MODALITIES, 0)
        for part in (mine, cross):
            for name, n in part["per_modality"].items():
                modality[name] += n
        return {
            "total": total,
            "quantized": mine["quantized"] + cross["quantized"],
            "full_precision": mine["full_precision"] + cross["full_precision"],
            "parts": {k: mine["parts"][k] + cross["parts"][k] for k in mine["parts"]},
            "per_layer": mine["per_layer"] + cross["per_layer"],
            "bits_per_element": 8.0 * total / elements if elements else 0.0,
            "per_modality": {k: n for k, n in modality.items() if n},
            "self_attention": mine,
            "cross_attention": cross,
        }

    def row(self, b: int) -> "_Row":
        """Sequence `b`'s share: every row of a Whisper batch holds the same number of positions (a decoder prompt of
        one length, the encoder's fixed frames), so each holds the batch's bytes over its rows."""
        return _Row(self)


class _Row:
    def __init__(self, cache: QuantizedEncoderDecoderCache):
        self.cache = cache

    def nbytes(self) -> dict[str, Any]:
        layers = self.cache.cross_attention_cache.layers
        rows = next((layer.batch for layer in layers if layer.is_initialized), 1)
        return per_sequence(self.cache.nbytes(), rows)
