"""OScaR's value rotation folded into a model's weights (the official code's "offline V Hadamard"), and undone.

In every text attention layer, with H = H_d / sqrt(d) per head (symmetric, H H = I):
    v_proj:  W_v <- R_kv W_v,  b_v <- R_kv b_v     R_kv = blockdiag(H, .., H) over the KV heads' output rows
    o_proj:  W_o <- W_o R_q                        R_q = blockdiag(H, .., H) over the query heads' input columns
Each head's values come out as V H; attention mixes values within a head, so its output is O H, and o_proj's
columns take H back out. The model computes the same function (the folded weights are rounded to their dtype).
A cache made for it stores the values as they come: the kernels skip V's rotation in the pack and the rotation
back after attention.

`set_folded(model, on, traits)` puts a model in the wanted state (quant.prepare_model folds, PreparedModel.undo
unfolds). Folding keeps the original weights (CPU copies) and unfolding restores them bit for bit, so methods sharing
one loaded model (eval --quant bf16,oscar,kivi) each see the weights they expect. Only attention classes whose output
goes straight from the value mix to o_proj are folded: those the model's family lists (quant.traits.ModelTraits
.attention); another class raises, naming the switch that avoids it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from quant.primitives import hadamard
from quant.traits import ModelTraits

_ORIGINALS = "_oscar_value_fold"  # attribute of a folded model: [(parameter, its original CPU copy)], to restore


def wants_fold(method) -> bool:
    """Whether `method` expects the model's weights to carry the values' rotation (its `folds_values`)."""
    return bool(getattr(method, "folds_values", False))


def attention_layers(model: nn.Module, traits: ModelTraits) -> list[nn.Module]:
    """The text backbone's attention modules (those with v_proj and o_proj, as many as its layers) in order;
    raises ValueError when they are not all of a class `traits.attention` lists."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    found = [
        m
        for m in model.modules()
        if isinstance(getattr(m, "v_proj", None), nn.Linear) and isinstance(getattr(m, "o_proj", None), nn.Linear)
    ]
    unknown = sorted({ModelTraits.name(type(m)) for m in found} - set(traits.attention))
    if unknown or len(found) != config.num_hidden_layers:
        what = (
            f"attention class {', '.join(unknown)} is not among the classes the model's traits list as foldable "
            f"({', '.join(traits.attention) or 'none'})"
            if unknown
            else f"found {len(found)} attention modules with v_proj/o_proj for {config.num_hidden_layers} layers"
        )
        raise ValueError(
            f"oscar.value_rotation='offline' folds the value Hadamard into v_proj/o_proj, but {what}: "
            "pass oscar.value_rotation=online (--quant-opts value_rotation=online) to rotate in the cache"
        )
    return found


def is_folded(model: nn.Module) -> bool:
    return any(hasattr(m, _ORIGINALS) for m in model.modules())


def set_folded(model: nn.Module, on: bool, traits: ModelTraits | None = None) -> bool:
    """Fold (on) or restore (off) the values' rotation in `model`'s weights; a no-op when already so. Returns on.
    Folding needs the model family's `traits` (the attention classes known to fold); restoring needs nothing."""
    if not on:
        for m in model.modules():
            saved = m.__dict__.pop(_ORIGINALS, None)
            if saved is not None:
                with torch.no_grad():
                    for param, original in saved:
                        param.copy_(original)
        return False
    if hasattr(model, _ORIGINALS):
        return True
    if traits is None:
        raise ValueError(
            "folding the values' rotation needs the model family's quant.traits.ModelTraits (its "
            "attention classes known to fold): set_folded(model, True, traits)"
        )
    set_folded(model, False)  # a submodule folded on its own (another entry point) starts from the originals
    layers = attention_layers(model, traits)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    d = getattr(config, "head_dim", None) or config.hidden_size // heads
    params = [p for layer in layers for p in _layer_params(layer)]
    if any(p.device.type == "meta" or p.dtype not in (torch.float16, torch.bfloat16, torch.float32) for p in params):
        raise ValueError(
            "oscar.value_rotation='offline' needs v_proj/o_proj as fp16/bf16/fp32 weights in memory "
            "(not offloaded or quantized): pass oscar.value_rotation=online"
        )
    originals = [p.detach().to("cpu", copy=True) for p in params]
    with torch.no_grad():
        for layer in layers:
            _fold_layer(layer, kv_heads, heads, d)
    model.__dict__[_ORIGINALS] = list(zip(params, originals))
    return True


def _layer_params(layer: nn.Module) -> list[torch.Tensor]:
    v, o = layer.v_proj, layer.o_proj
    return [v.weight] + ([v.bias] if v.bias is not None else []) + [o.weight]


def _fold_layer(layer: nn.Module, kv_heads: int, heads: int, d: int) -> None:
    v, o = layer.v_proj, layer.o_proj
    if v.out_features != kv_heads * d or o.in_features != heads * d:
        raise ValueError(
            f"v_proj ({v.out_features} outputs) / o_proj ({o.in_features} inputs) do not match "
            f"{kv_heads} KV heads and {heads} query heads of {d}: pass oscar.value_rotation=online"
        )
    work = torch.float64 if v.weight.dtype == torch.float32 else torch.float32
    signs = (hadamard(d) * math.sqrt(d)).round()  # the +-1 entries, exact
    h = signs.to(device=v.weight.device, dtype=work) / math.sqrt(d)
    w = v.weight.to(work).view(kv_heads, d, -1)
    v.weight.copy_((h @ w).reshape(v.weight.shape))  # rows of each KV head: H W_h
    if v.bias is not None:
        v.bias.copy_((h @ v.bias.to(work).view(kv_heads, d, 1)).reshape(-1))
    w = o.weight.to(work).view(o.out_features, heads, d)
    o.weight.copy_((w @ h).reshape(o.weight.shape))  # columns of each query head: W_h H
