"""Preparing a model for a method: one explicit call, undone by one call.

    prepared = quant.prepare_model(model, method, kernels, traits)
    cache = prepared.make_cache(config=..., tokenizer=...)        # as many caches as wanted; the model stays as it is
    with quant.engine.decode_graphs(model, cache) as graphs:
        model.generate(..., past_key_values=cache)
    prepared.undo()                                               # the model exactly as it was

`prepare_model` does everything a method needs done to the model itself, and nothing else does it:
- folds the values' rotation into the weights when the method keeps it there (`method.folds_values`: OScaR's
  offline rotation, quant/fold.py), for the attention classes `traits.attention` lists;
- switches the text backbone's attention to the fixed-shape decode's function (quant.kernels.hf_decode, SDPA for
  everything but the fixed-shape decode steps) when the method has such steps (`method.fixed_shape_decode`) and
  they apply on the model's device with `kernels` (quant.cache.fast_decode_applies);
- in the batch-invariant mode (`kernels.batch_invariant`), wraps the text attention so that a masked decode step
  runs row by row, and on a GPU keeps SDPA off its cuDNN kernel until undo (quant/invariant.py);
- puts the layer kernels under a GPU model (quant.kernels.patch_model: RMSNorms, RoPE, decode-sized linear layers,
  for the classes `traits` lists).
`PreparedModel.undo()` restores the weights bit for bit, every config's attention implementation and every patched
forward; the same model can then be prepared for another method (a run of bf16, oscar, kivi on one loaded model).
A model is prepared for one method at a time: preparing it again before the undo is refused.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from quant import fold, invariant
from quant.cache import FAST_ATTENTION, QuantizedKVCache, fast_decode_applies, make_cache, text_config
from quant.kernels.hf_decode import register
from quant.kernels.options import KernelOptions
from quant.methods import get_method
from quant.methods.base import MethodConfig
from quant.traits import ModelTraits

_PREPARED = "_oscar_prepared"  # attribute of a prepared model: a weak reference to its PreparedModel


@dataclass(eq=False)
class PreparedModel:
    """A model prepared for `method` (see the module docstring). `values_folded`: its weights carry the values'
    rotation; `fast_decode`: its text attention takes the fixed-shape decode steps; `kernels_patched`: the layer
    kernels patched, by kind."""

    model: nn.Module
    method: MethodConfig
    kernels: KernelOptions
    traits: ModelTraits
    values_folded: bool = False
    fast_decode: bool = False
    kernels_patched: dict[str, int] = field(default_factory=dict)
    undone: bool = False
    _attn: list[tuple[Any, Any]] = field(default_factory=list, repr=False)  # (config, its implementation before)
    _experts: list[tuple[Any, Any]] = field(default_factory=list, repr=False)  # (config, its MoE experts' before)
    _patches: Any = field(default=None, repr=False)
    _no_cudnn: Any = field(default=None, repr=False)  # quant.invariant.without_cudnn_attention, held until undo

    def make_cache(self, config=None, tokenizer=None) -> QuantizedKVCache:
        """A fresh cache of the prepared method for this model (quant.make_cache: sized from `config` or the model's
        text config; `tokenizer` for the methods that calibrate). No side effect on the model: RotateKV's per-cache
        `prepare` hook (its RoPE, sink hooks and calibration) sets up that cache's own state, not the model's."""
        if self.undone:
            raise ValueError("this PreparedModel was undone: prepare the model again (quant.prepare_model)")
        return make_cache(self.method, self.model, config=config, tokenizer=tokenizer, kernels=self.kernels)

    def undo(self) -> None:
        """Restore the model exactly as it was before `prepare_model`: the layer kernels' forwards and hooks, the
        attention implementation of every config, the weights bit for bit. A second call does nothing."""
        if self.undone:
            return
        if self._patches is not None:
            self._patches.undo()
        if self._no_cudnn is not None:
            self._no_cudnn.__exit__(None, None, None)
        for config, implementation in reversed(self._attn):
            config._attn_implementation_internal = implementation
        for config, implementation in reversed(self._experts):
            config._experts_implementation_internal = implementation
        if self.values_folded:
            fold.set_folded(self.model, False)
        self.model.__dict__.pop(_PREPARED, None)
        self.undone = True

    def __enter__(self) -> "PreparedModel":
        return self

    def __exit__(self, *exc) -> bool:
        self.undo()
        return False


def prepare_model(
    model: nn.Module,
    method: MethodConfig | str,
    kernels: KernelOptions | None = None,
    traits: ModelTraits | None = None,
) -> PreparedModel:
    """Prepare `model` for `method` (a config or a preset name): fold, switch the attention, patch the layer kernels
    (see the module docstring). `kernels`: the run's kernel options (default: the defaults); `traits`: the model
    family's quant.traits.ModelTraits (default: none listed, so nothing is folded or fused by class; a folding method
    then raises, naming value_rotation=online). Returns the PreparedModel that makes caches and undoes it all."""
    method = get_method(method)
    kernels = kernels or KernelOptions()
    traits = traits if traits is not None else ModelTraits()
    current = model.__dict__.get(_PREPARED)
    if current is not None and current() is not None and not current().undone:
        raise ValueError(
            f"the model is already prepared for {current().method.name or current().method.method}: "
            "call that PreparedModel's undo() before preparing it for another method"
        )
    if fold.is_folded(model):
        raise ValueError(
            "the model's weights carry a folded value rotation made outside quant.prepare_model: "
            "restore them first (quant.fold.set_folded(model, False))"
        )
    prepared = PreparedModel(model, method, kernels, traits)
    try:
        if method.folds_values:
            prepared.values_folded = fold.set_folded(model, True, traits)
        if method.fixed_shape_decode and fast_decode_applies(kernels, model):
            prepared._attn = _switch_attention(model, register(FAST_ATTENTION))
            prepared.fast_decode = True
        if kernels.batch_invariant:  # the text attention row by row at masked decode steps (quant/invariant.py)
            before = _switch_attention(model, invariant.register(text_config(model)._attn_implementation))
            prepared._attn = prepared._attn or before
            prepared._experts = _invariant_experts(model, kernels)
            prepared._no_cudnn = invariant.without_cudnn_attention(next(model.parameters()).device)
            prepared._no_cudnn.__enter__()
        from quant.kernels import patch_model

        prepared._patches = patch_model(model, kernels, traits)
        prepared.kernels_patched = dict(prepared._patches.counts)
    except BaseException:
        prepared.undo()
        raise
    model.__dict__[_PREPARED] = weakref.ref(prepared)
    return prepared


def _configs(model: nn.Module) -> list:
    """Every config the model and its submodels hold (sub-configs at any depth), each once."""
    seen: dict[int, Any] = {}
    todo = [model.config] + [
        m.config for m in model.modules() if hasattr(getattr(m, "config", None), "_attn_implementation_internal")
    ]
    while todo:
        config = todo.pop()
        if id(config) in seen or not hasattr(config, "_attn_implementation_internal"):
            continue
        seen[id(config)] = config
        for key in getattr(config, "sub_configs", {}) or {}:
            sub = getattr(config, key, None)
            if sub is not None:
                todo.append(sub)
    return list(seen.values())


def _invariant_experts(model: nn.Module, kernels: KernelOptions) -> list[tuple[Any, Any]]:
    """MoE experts (the Qwen3-Omni thinker's) for the batch-invariant mode. transformers' grouped GEMM sizes its
    tiles by how many tokens each expert got from the whole batch, so: on the kernel path the project's Triton experts
    (quant.kernels.triton_moe: pairs sorted by expert on the device, fixed row blocks, no host sync, so CUDA graphs
    capture them) where they compute the model's experts; else transformers' eager loop, one expert at a time over its
    tokens with `linear`, which the mode multiplies in fixed row blocks. Returns what to restore."""
    configs = [c for c in _configs(model) if getattr(c, "_experts_implementation_internal", None) is not None]
    if not configs:
        return []
    name = "eager"
    if kernels.backend_for(next(model.parameters()).device) != "torch":
        from quant.kernels import triton_moe

        experts = [
            m for m in model.modules() if getattr(m, "gate_up_proj", None) is not None and hasattr(m, "has_gate")
        ]
        if experts and all(triton_moe.supports(m) for m in experts):
            name = triton_moe.register()
    configs = [c for c in configs if c._experts_implementation_internal != name]  # an "eager" one too, on kernels
    before = [(config, config._experts_implementation_internal) for config in configs]
    for config in configs:
        config._experts_implementation_internal = name
    return before


def _switch_attention(model: nn.Module, name: str) -> list[tuple[Any, Any]]:
    """Switch the text backbone's attention to the registered function `name` (vision and audio encoders keep
    theirs); returns every config's implementation before, to restore."""
    before = [(config, config._attn_implementation_internal) for config in _configs(model)]
    if text_config(model) is model.config:
        model.set_attn_implementation(name)
    else:  # composite models: the text backbone only (vision/audio encoders keep their attention)
        model.set_attn_implementation({"text_config": name})
    return before
