"""The quantized KV cache: a transformers `Cache` whose layers store one method's packed codes.

Use it with any decoder in transformers: prepare the model for the method once (quant.prepare_model: the folded
value rotation, the attention function of the fixed-shape decode, the layer kernels), then
`model.generate(..., past_key_values=prepared.make_cache())`. Making a cache never changes the model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers.cache_utils import Cache

from quant import engine
from quant.kernels.options import KernelOptions
from quant.methods import get_method
from quant.methods.base import FP_PARTS, QUANTIZED_PARTS, CacheState, LayerContext, MethodConfig
from quant.rows import RowsLayer, left_pads

# Modality code of each KV position (QuantizedKVCache.set_modalities).
MODALITIES = ("text", "image", "video", "audio")


def text_config(model_or_config):
    config = getattr(model_or_config, "config", model_or_config)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


class MethodState(dict):
    """A method's own cache-wide data (RotateKV: its RoPE, calibrated permutations, sink hooks' data); a dict
    subclass so that model hooks can hold a weak reference and notice when their cache is gone."""


class QuantizedKVCache(Cache):
    """`state` holds the cache-wide facts every layer reads (quant.methods.base.CacheState: modalities, folded
    values, the kernel options and whether decode steps take the kernels); `shared` a method's own data."""

    def __init__(
        self,
        method: MethodConfig,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        kernels: KernelOptions | None = None,
    ):
        self.method = method
        self.state = CacheState(kernels=kernels or KernelOptions())
        self.shared: dict[str, Any] = MethodState()
        ctxs = [LayerContext(i, num_layers, num_kv_heads, head_dim, self.shared, self.state) for i in range(num_layers)]
        layers = [engine.make_layer(method, ctx) for ctx in ctxs]
        super().__init__(layers=layers)
        self.modalities: torch.Tensor | None = None

    @property
    def kernels(self) -> KernelOptions:
        return self.state.kernels

    def set_modalities(self, tags: torch.Tensor) -> None:
        """Modality code of each prompt position, LongTensor [B, S] (0 text, 1 image, 2 video, 3 audio).
        Call before the prefill; positions after the prompt (generated tokens) are text."""
        if tags.dim() != 2:
            raise ValueError(f"modality tags must be [batch, seq_len], got shape {tuple(tags.shape)}")
        self.modalities = tags.long()
        self.state.modalities = self.modalities

    def set_padding(self, attention_mask: torch.Tensor, rows: bool = False) -> None:
        """The prompt's padding, [B, S] (1 token, 0 pad; left padding only). Call before the prefill, after
        `set_modalities`. A batch with padding stores each sequence in layers of its own (quant/rows.py: the codes
        of each sequence are those of its prompt alone); a batch of equal lengths keeps one layer and may decode on
        the fixed-shape path together (CacheState.uniform_rows), unless `rows` (each prompt prefilled alone into its
        own rows: the batch-invariant mode, harness/runner.py)."""
        pads = left_pads(attention_mask)
        if not any(pads) and not rows:
            self.state.uniform_rows = True
            return
        if any(layer.is_initialized for layer in self.layers):
            raise ValueError("set_padding must come before the prefill: the layers already hold tokens")
        states = [
            dataclasses.replace(
                self.state,
                window_lengths=None,
                uniform_rows=False,
                graph_steps=0,
                modalities=None if self.modalities is None else self.modalities[b : b + 1, pad:],
            )
            for b, pad in enumerate(pads)
        ]
        self.layers = [
            engine.rows_layer(
                [
                    engine.make_layer(self.method, dataclasses.replace(layer.ctx, state=s, row=b))
                    for b, s in enumerate(states)
                ],
                pads,
                self.state,
            )
            for layer in self.layers
        ]
        self.shared["pads"] = pads  # methods that watch the model's activations skip them (RotateKV's sinks)

    def row(self, b: int) -> "QuantizedKVCache | EvenShare":
        """Sequence `b` of a padded batch as a cache of its own (its layers, state and modality tags; quant/rows.py),
        for per-sequence accounting: `cache.row(b).nbytes()`. Without padding every row holds as many tokens: an
        even share of the cache (EvenShare)."""
        if not isinstance(self.layers[0], RowsLayer):
            rows = next((layer.batch for layer in self.layers if layer.is_initialized), 1)
            return EvenShare(self, rows)
        view = object.__new__(type(self))
        view.__dict__.update(self.__dict__)
        view.layers = [layer.row(b) for layer in self.layers]
        view.state = view.layers[0].ctx.state
        view.modalities = view.state.modalities
        return view

    def nbytes(self) -> dict[str, Any]:
        """Bytes of the tensors each layer actually holds: totals, by category and per layer."""
        per_layer = [layer.nbytes() for layer in self.layers]
        parts = {k: sum(p[k] for p in per_layer) for k in QUANTIZED_PARTS + FP_PARTS}
        quantized = sum(parts[k] for k in QUANTIZED_PARTS)
        full = sum(parts[k] for k in FP_PARTS)
        total = quantized + full
        return {
            "total": total,
            "quantized": quantized,
            "full_precision": full,
            "parts": parts,
            "per_layer": [sum(p.values()) for p in per_layer],
            "bits_per_element": self.bits_per_element(total),
            "per_modality": self.bytes_by_modality(total),
        }

    def bytes_by_modality(self, total: int) -> dict[str, int]:
        """Total bytes apportioned to modalities by their share of cached positions (generated tokens are
        text). An apportionment, not a separate measurement: every position costs about the same."""
        seen = self.get_seq_length()
        if not seen:
            return {}
        counts = dict.fromkeys(MODALITIES, 0)
        prompt = 0
        if self.modalities is not None:
            prompt = min(self.modalities.shape[1], seen)
            for code, name in enumerate(MODALITIES):
                counts[name] = int((self.modalities[:, :prompt] == code).sum()) // self.modalities.shape[0]
        counts["text"] += seen - prompt
        return {name: round(total * n / seen) for name, n in counts.items() if n}

    def num_elements(self) -> int:
        """K and V elements represented: 2 * layers * batch * kv_heads * tokens * head_dim."""
        total = 0
        for layer in self.layers:
            if isinstance(layer, RowsLayer):
                total += layer.elements()
            elif layer.is_initialized:
                total += 2 * layer.batch * layer.ctx.num_kv_heads * layer.seen * layer.ctx.head_dim
        return total

    def bits_per_element(self, total: int | None = None) -> float:
        """Measured storage bits per cached K/V element (all parts, windows included)."""
        n = self.num_elements()
        if total is None:
            total = self.nbytes()["total"]
        return 8.0 * total / n if n else 0.0


def make_cache(
    method: MethodConfig | str,
    model=None,
    *,
    config=None,
    tokenizer=None,
    kernels: KernelOptions | None = None,
    **overrides,
) -> QuantizedKVCache:
    """A fresh cache for `method` (a config or a preset name) sized from the model's text config. It never changes the
    model: it reads the state quant.prepare_model left it in (PreparedModel.make_cache is the usual way here).

    With a model, the cache follows it: the values arrive rotated when the model's weights carry the folded rotation
    (quant/fold.py), and a method with fixed-shape decode steps (`method.fixed_shape_decode`: OScaR's kernel path,
    BF16's buffers) takes them when the model's text attention is the fixed-shape decode's function (prepare_model
    switches it for a GPU model, or when the kernel options name a kernel backend) and `kernels` picks a kernel
    backend on the model's device. A model that does not suit the method is refused: a method whose value rotation
    lives in the weights (`method.folds_values`) on a model not prepared for it, or any other method on a model
    whose weights carry it. From a config alone, values are rotated in the cache and decode takes the reference path
    (set `cache.state` by hand to drive the fixed-shape steps, as the tests and benchmarks do).

    Methods that need the model (RotateKV: its RoPE, sink hooks, calibration with `tokenizer`) get it through their
    `prepare(model, tokenizer, shared)` hook, here: what it sets up is this cache's own state (kept in
    `cache.shared`, the hooks holding it weakly), not a preparation of the model. `kernels`: the run's kernel options
    (default: the defaults).
    """
    method = get_method(method, **overrides)
    cfg = text_config(config if config is not None else model)
    if cfg is None:
        raise ValueError("make_cache needs a model or a config= to size the cache")
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    cache = QuantizedKVCache(method, cfg.num_hidden_layers, kv_heads, head_dim, kernels)
    if model is not None:
        cache.state.values_folded = values_folded(model, method)
    prepare = getattr(method, "prepare", None)
    if prepare is not None:
        if model is None:
            raise ValueError(
                f"{method.name or method.method} needs the model itself: make_cache(method, model, tokenizer=...)"
            )
        prepare(model, tokenizer, cache.shared)
    if method.fixed_shape_decode and model is not None and fast_decode_ready(cache.kernels, model):
        cache.state.fast_decode = True
    return cache


def values_folded(model, method: MethodConfig) -> bool:
    """Whether `model`'s weights carry the folded value rotation, checked against what `method` expects of them."""
    from quant import fold

    folded = fold.is_folded(model)
    if method.folds_values and not folded:
        raise ValueError(
            f"{method.name or method.method}: oscar.value_rotation='offline' needs the values' rotation "
            "folded into the model's weights: prepare the model first (prepared = quant.prepare_model("
            "model, method, kernels, traits); cache = prepared.make_cache()), or pass "
            "value_rotation=online"
        )
    if folded and not method.folds_values:
        raise ValueError(
            f"{method.name or method.method}: the model's weights carry OScaR's folded value rotation "
            "(quant.prepare_model for a folding method): undo that preparation (PreparedModel.undo()) "
            "and prepare the model for this method"
        )
    return folded


FAST_ATTENTION = "oscar_packed"  # the attention function of the fixed-shape decode (quant.kernels.hf_decode.register)


def fast_decode_applies(kernels: KernelOptions, model) -> bool:
    """Whether a method with fixed-shape decode steps (the kernel path, BF16's buffers) takes them on `model`: it sits
    on a GPU, or the kernel options name a kernel backend. Only single sequences and a padded batch's stacked rows
    take them (quant/engine/rows.py). A model with sliding-window layers (Gemma-3) or a head dim the decode kernels
    are not built for (64 and 128) takes the plain path for every method: the fixed steps attend to every cached
    token and the kernels to those head dims only, so the comparison stays on one machinery. An encoder-decoder
    (Whisper) takes the plain path too: its decoder reads a cross-attention cache the fixed steps do not know, and
    switching the attention would switch its encoder's."""
    device = next(model.parameters()).device
    if kernels.backend_for(device) == "torch" or getattr(model.config, "is_encoder_decoder", False):
        return False
    cfg = text_config(model)
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    sliding = getattr(cfg, "sliding_window", None) and "sliding_attention" in (getattr(cfg, "layer_types", None) or [])
    return head_dim in (64, 128) and not sliding


def fast_decode_ready(kernels: KernelOptions, model) -> bool:
    """fast_decode_applies, and the model's text attention is the fixed-shape decode's function (FAST_ATTENTION,
    switched by quant.prepare_model): SDPA for everything but those steps."""
    return fast_decode_applies(kernels, model) and text_config(model)._attn_implementation in (
        FAST_ATTENTION,
        FAST_ATTENTION + "_invariant",  # the same function, row by row at masked steps (quant/invariant.py)
    )


class EvenShare:
    """One row's share of a cache whose rows hold the same number of tokens: `nbytes()` is the cache's over `rows`."""

    def __init__(self, cache, rows: int):
        self.cache, self.rows = cache, rows

    def nbytes(self) -> dict[str, Any]:
        return per_sequence(self.cache.nbytes(), self.rows)


def per_sequence(kv: dict, rows: int) -> dict:
    """A batch's cache bytes (QuantizedKVCache.nbytes) per sequence, where every row holds as many tokens."""
    out = {}
    for key, value in kv.items():
        if isinstance(value, dict):
            out[key] = per_sequence(value, rows)
        elif isinstance(value, list):
            out[key] = [x // rows for x in value]
        else:
            out[key] = value // rows if isinstance(value, int) else value
    return out
