"""RotateKV (IJCAI 2025), written from the paper's description.

Keys are quantized PRE-RoPE: the cache receives post-RoPE keys, so it undoes RoPE at the token's
cache position, rotates groups of `head_span` KV heads together with one normalized Hadamard of size
head_span * d, reorders channels by a per-layer permutation calibrated offline (ascending signed
per-channel sums of rotated keys over calibration text), and quantizes per token in groups of
`group_size` reordered channels (asym, clip 0.8). Reading back: un-permute, Hadamard, re-apply RoPE.
Values: per-head Hadamard, per-token groups, clip 0.8. Attention sinks: the tokens holding the top-20
|activations| of each layer's input during prefill keep full-precision K/V. `residual_length` R: RotateKV keeps no
FP window (R = 0); with R > 0 the newest tokens wait in full precision and every R are quantized at once (block
flush, as OScaR's evaluation framework runs every method). `zero_point`: "integer" (RotateKV's code) or "float".

[ours] Positions are cache indices (left-padded rows see shifted positions; undo and redo use the same
ones, so only the quantization basis moves). With fewer heads than `head_span` the span is the largest
power of two dividing the number of KV heads (so the Hadamard size stays a power of two). M-RoPE models
use the text (1-D) rotary positions.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from quant.methods.base import MethodConfig, QuantLayer, block_flush_chunk, check, check_zero_point
from quant.packed import QTensor, cat_optional, quantize
from quant.primitives import hadamard

# Calibration prose written for this project (never evaluation data): keys' channel statistics only.
CALIBRATION_TEXT = (
    "The harbour town wakes before the sun. Fishing boats slip past the breakwater while the bakery on the "
    "corner pulls its first trays from the oven, and the smell of bread drifts down to the quay. By seven the "
    "market square is full: farmers unload crates of apples and cabbages, a man sharpens knives on a treadle "
    "wheel, and children weave between the stalls on their way to school. The ferry horn sounds twice. In the "
    "library above the post office, an archivist sorts letters from the eighteen-nineties, noting dates, "
    "names and the price of coal in a ledger. Tables of numbers follow: 12, 47, 3.5, 1024, 88 percent. "
    "Questions are asked and answered; lists are written, crossed out and written again. In the afternoon the "
    "wind turns, clouds gather over the hills, and the first drops of rain darken the cobblestones."
)


@dataclass(frozen=True)
class RotateKVConfig(MethodConfig):
    method = "rotatekv"
    bits: int = 2
    group_size: int = 128
    clip_ratio: float = 0.8
    head_span: int = 4
    sink_tokens: int = 20
    calibrate: bool = True
    residual_length: int = 0
    zero_point: str = "integer"

    def validate(self):
        check(self.bits in (2, 3, 4), f"rotatekv.bits must be 2, 3 or 4, got {self.bits}")
        check(
            self.group_size >= 16 and self.group_size & (self.group_size - 1) == 0,
            "rotatekv.group_size must be a power of two >= 16",
        )
        check(
            self.head_span >= 1 and self.head_span & (self.head_span - 1) == 0,
            "rotatekv.head_span must be a power of two",
        )
        check(0.5 <= self.clip_ratio <= 1.0, f"rotatekv.clip_ratio must be in [0.5, 1], got {self.clip_ratio}")
        check(self.sink_tokens >= 0, "rotatekv.sink_tokens must be >= 0")
        check(
            self.residual_length >= 0,
            f"rotatekv.residual_length must be >= 0 (0 = no window), got {self.residual_length}",
        )
        check_zero_point("rotatekv", self.zero_point)

    def exact_chunk(self, position):
        return block_flush_chunk(position, self.residual_length)  # per-token groups: tokens quantize independently

    def make_layer(self, ctx):
        return RotateKVLayer(self, ctx)

    def cannot_run(self, model) -> str | None:
        try:
            find_rope(model)
        except ValueError as err:  # its pre-RoPE rotation needs the model's rotary embedding (Whisper has none)
            return str(err)
        return None

    def prepare(self, model, tokenizer, shared: dict) -> None:
        """Find the model's rotary embedding, install the sink hooks, calibrate the permutations."""
        shared["rope"] = find_rope(model)
        if self.calibrate:  # before the hooks: the calibration forward must not record sinks
            if tokenizer is None:
                raise ValueError(
                    "rotatekv calibrates its channel permutation on text: pass tokenizer= to make_cache "
                    "(or use rotatekv with calibrate=False)"
                )
            shared["perms"] = calibrate_permutations(model, tokenizer, self, shared)
        if self.sink_tokens:
            install_sink_hooks(model, shared, self.sink_tokens)


def span_heads(num_kv_heads: int, span: int) -> int:
    while num_kv_heads % span:
        span //= 2
    return span


def unrope(k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Inverse of k * cos + rotate_half(k) * sin (a rotation by -theta per channel pair)."""
    half = k.shape[-1] // 2
    rot = torch.cat([-k[..., half:], k[..., :half]], -1)
    return k * cos - rot * sin


def rope(k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = k.shape[-1] // 2
    return k * cos + torch.cat([-k[..., half:], k[..., :half]], -1) * sin


def find_rope(model):
    """A function (positions[T], layer index) -> (cos, sin) float32 [T, d] from the text model's rotary embedding.
    Models whose layers of different types rotate differently (Gemma-3: local sliding-window layers and global layers
    of other RoPE bases, `config.layer_types`) get the layer's own type."""
    modules = [
        m for n, m in model.named_modules() if n.endswith("rotary_emb") and "vision" not in n and "audio" not in n
    ]
    if not modules:
        raise ValueError(f"rotatekv needs a RoPE model; no rotary_emb module found in {type(model).__name__}")
    emb = modules[-1]
    per_type = hasattr(emb, "layer_types")  # transformers' RoPE of per-layer-type bases takes a layer_type argument
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layer_types = list(getattr(cfg, "layer_types", None) or [])
    if per_type and not layer_types:
        raise ValueError(f"rotatekv: {type(emb).__name__} rotates per layer type, but the config lists no layer_types")

    def cos_sin(positions: torch.Tensor, layer: int):
        dummy = torch.zeros(1, dtype=torch.float32, device=positions.device)
        pos = positions.view(1, -1)
        if getattr(emb, "mrope_section", None) is not None:  # M-RoPE: a text token has one position on all 3 axes
            pos = pos.expand(3, 1, -1)  # (transformers 5.17 takes only [3, B, T]; 5.23 also [B, T])
        # on the embedding's device when device_map spreads the model: back to the caller's
        cos, sin = emb(dummy, pos, layer_types[layer]) if per_type else emb(dummy, pos)
        return (
            cos.reshape(-1, cos.shape[-1]).float().to(positions.device),
            sin.reshape(-1, sin.shape[-1]).float().to(positions.device),
        )

    return cos_sin


def decoder_layers(model) -> torch.nn.ModuleList:
    """The text backbone's decoder layers: the ModuleList of modules with a `self_attn`, outside vision/audio towers."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) and hasattr(module[0], "self_attn"):
            if "vision" not in name and "audio" not in name and "visual" not in name:
                return module
    raise ValueError(f"no decoder layers with self_attn found in {type(model).__name__}")


def install_sink_hooks(model, shared: dict, top: int) -> None:
    """Forward pre-hooks recording, per layer and prefill, the tokens holding the top |activations|."""
    shared_ref = weakref.ref(shared)
    shared["sinks"] = {}
    handles = []

    def make_hook(idx):
        def hook(module, args, kwargs):
            target = shared_ref()
            if target is None:  # the cache is gone: this hook is stale
                for h in handles:
                    h.remove()
                return
            x = args[0] if args else kwargs["hidden_states"]
            if x.shape[1] > 1:
                # a left-padded batch (quant/rows.py): each sequence's sinks among its own tokens, indexed from them
                pads = target.get("pads")
                if pads is None or len(pads) != x.shape[0]:  # unpadded, or another cache's batch
                    pads = [0] * x.shape[0]
                rows = [x[b, pad:].detach().abs().float().reshape(-1) for b, pad in enumerate(pads)]
                target["sinks"][idx] = torch.stack([r.topk(min(top, r.numel())).indices // x.shape[-1] for r in rows])

        return hook

    for idx, layer in enumerate(decoder_layers(model)):
        handles.append(layer.register_forward_pre_hook(make_hook(idx), with_kwargs=True))
    shared["hook_handles"] = handles


def calibrate_permutations(model, tokenizer, config: RotateKVConfig, shared: dict) -> list[torch.Tensor]:
    """Per layer: argsort (ascending) of the signed per-channel sums of rotated pre-RoPE keys."""
    from transformers import DynamicCache

    cache_key = ("rotatekv_perms", config.head_span)
    stash = model.__dict__.setdefault("_oscar_calibration", {})
    if cache_key in stash:
        return stash[cache_key]
    device = next(model.parameters()).device
    ids = tokenizer(CALIBRATION_TEXT, return_tensors="pt").input_ids.to(device)
    cache = DynamicCache()
    with torch.no_grad():
        lm = model.get_decoder() if hasattr(model, "get_decoder") else model
        lm(input_ids=ids, past_key_values=cache, use_cache=True)
    positions = torch.arange(ids.shape[1], device=device)
    perms = []
    for index, layer in enumerate(cache.layers):  # each on its layer's device (device_map)
        dev = layer.keys.device
        cos, sin = shared["rope"](positions, index)
        k = unrope(layer.keys.float(), cos.to(dev), sin.to(dev))
        b, h, t, d = k.shape
        s = span_heads(h, config.head_span)
        spanned = k.view(b, h // s, s, t, d).permute(0, 1, 3, 2, 4).reshape(b, h // s, t, s * d)
        kr = spanned @ hadamard(s * d, device=dev)
        perms.append(kr.sum(dim=(0, 1, 2)).argsort())
    stash[cache_key] = perms
    return perms


class RotateKVLayer(QuantLayer):
    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self.span = span_heads(ctx.num_kv_heads, config.head_span)
        self.k_q: QTensor | None = None
        self.v_q: QTensor | None = None
        self.k_res: torch.Tensor | None = None
        self.v_res: torch.Tensor | None = None
        self.sink_k = self.sink_v = self.sink_pos = None

    def lazy_initialization(self, key_states, value_states):
        super().lazy_initialization(key_states, value_states)
        sd = self.span * self.ctx.head_dim
        self._hk = hadamard(sd, device=self.device)
        self._hv = hadamard(self.ctx.head_dim, device=self.device)
        perms = self.ctx.shared.get("perms")
        self._perm = perms[self.ctx.layer_idx].to(self.device) if perms else torch.arange(sd, device=self.device)
        self._inv = self._perm.argsort()

    def _group(self, width: int) -> int:
        return min(self.config.group_size, width)

    def _spanned(self, k):  # [B, H, T, D] -> [B, H/s, T, s*D]
        b, h, t, d = k.shape
        s = self.span
        return k.reshape(b, h // s, s, t, d).permute(0, 1, 3, 2, 4).reshape(b, h // s, t, s * d)

    def _unspanned(self, k):  # inverse of _spanned
        b, g, t, sd = k.shape
        d = sd // self.span
        return k.reshape(b, g, t, self.span, d).permute(0, 1, 3, 2, 4).reshape(b, g * self.span, t, d)

    def _append(self, k, v):
        c, t = self.config, k.shape[-2]
        sinks = self.ctx.shared.get("sinks", {}).get(self.ctx.layer_idx)
        # one sequence of a padded batch (quant/rows.py), unless that sequence's prompt went through alone (the
        # batch-invariant prefill): then the forward's sinks are its own
        if sinks is not None and self.ctx.row is not None and sinks.shape[0] > 1:
            sinks = sinks[self.ctx.row : self.ctx.row + 1]
        if sinks is not None and t > 1 and self.seen == 0:  # the prefill's sinks (a later chunk's are not RotateKV's)
            self._keep_sinks(k, v, sinks)
        start = 0 if self.k_q is None else self.k_q.num_tokens
        block = self._window_blocks(k, v, c.residual_length)
        if block is None:
            return
        kb, vb = block
        positions = torch.arange(start, start + kb.shape[-2], device=k.device)
        cos, sin = self.ctx.shared["rope"](positions, self.ctx.layer_idx)
        kr = (self._spanned(unrope(kb.float(), cos, sin)) @ self._hk)[..., self._perm]
        z = c.zero_point
        kq = quantize(kr, c.bits, self._group(kr.shape[-1]), axis=-1, clip=c.clip_ratio, zero_point=z)
        self.k_q = cat_optional(self.k_q, kq)
        self.v_q = cat_optional(
            self.v_q,
            quantize(
                vb.float() @ self._hv, c.bits, self._group(vb.shape[-1]), axis=-1, clip=c.clip_ratio, zero_point=z
            ),
        )

    def _keep_sinks(self, k, v, sinks):
        """sinks: [B, n] token indices within this chunk; keep their K/V in full precision."""
        idx = sinks.to(k.device).unsqueeze(1).unsqueeze(-1).expand(-1, k.shape[1], -1, k.shape[-1])
        pos = sinks.to(k.device) + self.seen
        self.sink_k = k.gather(-2, idx) if self.sink_k is None else torch.cat([self.sink_k, k.gather(-2, idx)], -2)
        self.sink_v = v.gather(-2, idx) if self.sink_v is None else torch.cat([self.sink_v, v.gather(-2, idx)], -2)
        self.sink_pos = pos if self.sink_pos is None else torch.cat([self.sink_pos, pos], -1)

    def _dense(self):
        k, v = self.k_res, self.v_res
        if self.k_q is not None:
            kq, vq = self._memo("kv", (self.k_q, self.v_q), self._dequantized)
            k, v = torch.cat([kq, self.k_res], -2), torch.cat([vq, self.v_res], -2)
        if self.sink_pos is not None:
            idx = self.sink_pos.unsqueeze(1).unsqueeze(-1).expand(-1, k.shape[1], -1, k.shape[-1])
            k, v = k.scatter(-2, idx, self.sink_k.to(k.dtype)), v.scatter(-2, idx, self.sink_v.to(v.dtype))
        return k, v

    def _dequantized(self):
        """The quantized part back in the model's basis, keys with RoPE applied again at their positions."""
        kr = self.k_q.dequantize()[..., self._inv] @ self._hk
        cos, sin = self.ctx.shared["rope"](torch.arange(kr.shape[-2], device=kr.device), self.ctx.layer_idx)
        return self.out_dtype(rope(self._unspanned(kr), cos, sin)), self.out_dtype(self.v_q.dequantize() @ self._hv)

    def _stored(self):
        return {
            "codes": [self.k_q, self.v_q],
            "outliers": [self.sink_k, self.sink_v, self.sink_pos],
            "residual": [self.k_res, self.v_res],
        }
