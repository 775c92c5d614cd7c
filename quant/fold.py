"""OScaR's value rotation folded into a model's weights (the official code's "offline V Hadamard"), and undone.

In every text attention layer, with H = H_d / sqrt(d) per head (symmetric, H H = I):
    v_proj:  W_v <- R_kv W_v,  b_v <- R_kv b_v     R_kv = blockdiag(H, .., H) over the KV heads' output rows
    o_proj:  W_o <- W_o R_q                        R_q = blockdiag(H, .., H) over the query heads' input columns
(o_proj is out_proj in Whisper's attention; an encoder-decoder folds its decoder's self- and cross-attentions, whose
caches then both hold rotated values, and leaves its encoder as it is).
Each head's values come out as V H; attention mixes values within a head, so its output is O H, and o_proj's
columns take H back out. The model computes the same function (the folded weights are rounded to their dtype).
A cache made for it stores the values as they come: the kernels skip V's rotation in the pack and the rotation
back after attention.

`set_folded(model, on, traits)` puts a model in the wanted state (quant.prepare_model folds, PreparedModel.undo
unfolds). Folding keeps the original weights (CPU copies) and unfolding restores them bit for bit, so methods sharing
one loaded model (eval --quant bf16,oscar,kivi) each see the weights they expect. Only attention classes whose output
goes straight from the value mix to o_proj are folded: those the model's family lists (quant.traits.ModelTraits
.attention or .value_fold); another class raises, naming the switch that avoids it.
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


def _text_config(model: nn.Module):
    """The config of the attention layers that fold: an encoder-decoder's decoder (its layers and heads), else the
    text backbone's."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        return config.get_text_config(decoder=True)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def out_proj(module: nn.Module, names: tuple[str, ...] = ("o_proj", "out_proj")) -> nn.Linear | None:
    """An attention module's output projection: o_proj, or out_proj (Whisper's attention), else None."""
    for name in names:
        proj = getattr(module, name, None)
        if isinstance(proj, nn.Linear):
            return proj
    return None


def attention_layers(model: nn.Module, traits: ModelTraits) -> list[nn.Module]:
    """The text backbone's attention modules (those with v_proj and an output projection, as many as its layers; an
    encoder-decoder's decoder: a self- and a cross-attention per layer, its encoder untouched) in order; raises
    ValueError when they are not all of a class `traits.attention` or `traits.value_fold` lists."""
    config = _text_config(model)
    encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
    root = model.get_decoder() if encoder_decoder else model
    # out_proj only in an encoder-decoder's decoder: a decoder-only model's vision or audio towers have attentions
    # with v_proj and out_proj (CLIP's), which are not the text backbone's
    names = ("o_proj", "out_proj") if encoder_decoder else ("o_proj",)
    found = [
        m
        for m in root.modules()
        if isinstance(getattr(m, "v_proj", None), nn.Linear) and out_proj(m, names) is not None
    ]
    expected = config.num_hidden_layers * (2 if encoder_decoder else 1)
    foldable = set(traits.attention) | set(traits.value_fold)
    unknown = sorted({ModelTraits.name(type(m)) for m in found} - foldable)
    if unknown or len(found) != expected:
        what = (
            f"attention class {', '.join(unknown)} is not among the classes the model's traits list as foldable "
            f"({', '.join(sorted(foldable)) or 'none'})"
            if unknown
            else f"found {len(found)} attention modules with v_proj and an output projection for {expected}"
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
    config = _text_config(model)
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
    v, o = layer.v_proj, out_proj(layer)
    return [v.weight] + ([v.bias] if v.bias is not None else []) + [o.weight]


def _fold_layer(layer: nn.Module, kv_heads: int, heads: int, d: int) -> None:
    v, o = layer.v_proj, out_proj(layer)
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
