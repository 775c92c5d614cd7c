"""OScaR with a guarded key rotation [ours, beyond the paper]: per sequence, layer and KV head, the key rotation that
the prompt's own queries and keys predict to cost the least logit error.

Why. OScaR rotates every key by the D x D Hadamard. `oscar-eval diagnose` (quant/diagnose.py, docs/METHODS.md "Where
OScaR's rotation hurts") predicts the rotation's effect from the model's post-RoPE queries q and keys K as rho, the
ratio of the logit-error variance with the rotation to that without. It varies by layer and model: Qwen2.5-0.5B's
layer 0 has rho ~109 and carries most of OScaR's loss, Gemma-3-270M's global layers 4.5-13, while on SmolLM2-135M rho
is 0.47-1.84 and OScaR is the best method. No single rotation is right everywhere, so this method measures rho where
it runs and chooses.

The rule. At the prompt's first forward, for each KV head, among R in {identity (OScaR's scaling only), the RoPE-pair
rotation (`oscar-pairwise`'s pair_hadamard), the full Hadamard (OScaR)}:

    rho_R = sum_j [sum_q (q R)_j^2] [sum_g range_g(K R)_j^2] / sum_i [sum_q q_i^2] [sum_g range_g(K)_i^2]

over the prompt's queries of the head's GQA group and its whole 32-token key groups (a shorter tail is left out, as
diagnose does; rho_identity = 1). The least rho wins; the full Hadamard wins any near tie (within MARGIN of the least),
and wherever rho says nothing (no whole group, or keys that never move within a group): OScaR is the default and needs
evidence to be left. Token scaling, INT2 per-channel key groups of 32, values (OScaR's Hadamard, folded into
v_proj / o_proj by quant.prepare_model) and bytes are exactly OScaR's; only the keys' rotation varies. From the
decision on, every key of that head (the prompt's, then decoded ones) is quantized in the chosen basis and rotated
back when dequantized. The decision costs no stored bytes: it is one small code per sequence and head.

How the queries are seen. transformers calls cache.update(k, v) before the attention function gets the queries,
and hands that function no cache. So a layer holds its first prompt chunk exact (the prompt attends with exact K/V
anyway, quant/methods/base.py) and waits in a short hand-off list (`_AWAITING`); the attention function that
`prepare` installs over the model's own (GUARD_ATTENTION) finds the waiting layers of its layer index, hands each its
rows of the query, and then calls the model's attention unchanged. The layer decides and quantizes what it held. A
left-padded batch's layers (quant/rows.py: one per sequence, updated in order) take the query's rows in that order,
each the last n positions (its own tokens). A layer asked to store anything more before it has decided raises: the
model was not prepared for this method (or the prompt was replayed into the cache without the model's attention).

Reading the choices: `choices(cache)` gives each layer's count of KV heads (over the batch's sequences) per rotation;
a layer's `rotation_code` is the choice per [sequence, KV head] (ROTATIONS' index) and `rotation_rho` the three rho
values it weighed (float32 [B, H, 3], in ROTATIONS' order).

Limits: the reference path only (no kernel decode: the fused packs and decode kernels implement one rotation for all
heads); decoder-only models (an encoder-decoder's decoder is not reached through the text attention switch).
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass

import torch

from quant.methods.oscar import OScaRConfig, OScaRLayer
from quant.methods.oscar_rope import _check_variant, pair_hadamard
from quant.packed import pack_reference
from quant.primitives import hadamard

ROTATIONS = ("identity", "pair", "hadamard")  # the codes 0, 1, 2 a layer stores per sequence and KV head
IDENTITY, PAIR, HADAMARD = range(3)
# The full Hadamard (OScaR) wins unless another rotation's rho is lower by more than this share: rho is a prediction
# from one prompt, and a difference of a few percent is within what the next tokens may change.
MARGIN = 0.02
# Tokens per float64 pass of the rho sums (rounded to whole key groups): a long prompt's temporaries stay small.
CHUNK = 4096
GUARD_ATTENTION = "oscar_guarded"  # prefix of the registered attention function's name: "oscar_guarded_<wrapped>"


def rotation_bank(d: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """[3, d, d]: the candidate rotations in ROTATIONS' order (rows rotate as x @ R). Each is symmetric and its own
    inverse."""
    return torch.stack([torch.eye(d), pair_hadamard(d), hadamard(d)]).to(device=device, dtype=dtype)


def rho_by_rotation(q: torch.Tensor, k: torch.Tensor, group: int = 32) -> torch.Tensor:
    """rho of each candidate rotation (module docstring), float64 [Hkv, 3] in ROTATIONS' order, from grouped queries
    q [Hkv, N, D] and keys k [Hkv, S, D]. The sums factorize (quant.diagnose.rho_terms): the queries' energy per
    rotated channel, diag(R^T (q^T q) R), times the sum over whole key groups of each rotated channel's squared range.
    NaN (no whole group) or inf (keys constant within every group) where rho says nothing."""
    h, s, d = k.shape
    bank = rotation_bank(d, k.device, torch.float64)
    moment = torch.zeros(h, d, d, dtype=torch.float64, device=q.device)
    for t0 in range(0, q.shape[1], CHUNK):
        part = q[:, t0 : t0 + CHUNK].double()
        moment += part.mT @ part
    energy = torch.diagonal(bank.mT @ moment[:, None] @ bank, dim1=-2, dim2=-1)  # [Hkv, 3, D]
    ranges = torch.zeros(h, 3, d, dtype=torch.float64, device=k.device)
    whole, step = s // group * group, max(CHUNK // group, 1) * group
    for t0 in range(0, whole, step):
        part = k[:, t0 : min(whole, t0 + step)].double()
        rotated = (part[:, None] @ bank).unflatten(2, (-1, group))  # [Hkv, 3, groups, G, D]
        ranges += (rotated.amax(3) - rotated.amin(3)).pow(2).sum(2)
    terms = (energy * ranges).sum(-1)  # [Hkv, 3]
    return terms / terms[:, IDENTITY : IDENTITY + 1]


def choose(rho: torch.Tensor) -> torch.Tensor:
    """The rotation codes (long, rho's shape without its last dim) of rho [..., 3]: the least rho, the full Hadamard
    within MARGIN of it or where rho is not finite."""
    best = rho.amin(-1)
    hadamard_wins = rho[..., HADAMARD] <= best * (1 + MARGIN)
    codes = torch.where(hadamard_wins, HADAMARD, rho[..., :HADAMARD].argmin(-1))
    return torch.where(torch.isfinite(rho).all(-1), codes, HADAMARD)


@dataclass(frozen=True)
class OScaRGuardedConfig(OScaRConfig):
    method = "oscar-guarded"

    def validate(self):
        super().validate()
        _check_variant(self, "oscar-guarded")

    @property
    def kernel_decode(self) -> bool:
        return False  # a rotation per sequence and head: the reference path (module docstring)

    def make_layer(self, ctx):
        return OScaRGuardedLayer(self, ctx)

    def cannot_run(self, model) -> str | None:
        if getattr(model.config, "is_encoder_decoder", False):
            return (
                "oscar-guarded chooses each head's key rotation from the prompt's queries, seen through the text "
                "attention function; an encoder-decoder's decoder caches are not reached that way"
            )
        return None

    def prepare(self, model, tokenizer, shared: dict) -> None:
        """Install the deciding attention function over the model's text attention (once per prepared model)."""
        install(model)


class OScaRGuardedLayer(OScaRLayer):
    """OScaR's storage whose keys are rotated per sequence and KV head by the chosen rotation (`rotation_code`,
    [B, H] long: per-row state, so batch selection and reordering carry it). Until the choice, the first prompt chunk
    waits exact in the window (k_res, v_res)."""

    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self.rotation_code: torch.Tensor | None = None
        self.rotation_rho: torch.Tensor | None = None

    def lazy_initialization(self, key_states, value_states):
        super().lazy_initialization(key_states, value_states)
        self._bank = rotation_bank(self.ctx.head_dim, self.device)
        self._vrot = hadamard(self.ctx.head_dim, device=self.device) if self._values_rotated else None
        self._rot = None  # OScaR's single rotation of keys and values: this layer keeps them apart

    def update(self, key_states, value_states, *args, **kwargs):
        if self.rotation_code is not None:
            return super().update(key_states, value_states, *args, **kwargs)
        if self.seen:
            raise RuntimeError(
                f"oscar-guarded, layer {self.ctx.layer_idx}: {key_states.shape[-2]} more token(s) arrived before its "
                "key rotation was chosen. The choice is made by the attention function that quant.prepare_model + "
                "make_cache install (prepared = quant.prepare_model(model, 'oscar-guarded'); cache = "
                "prepared.make_cache()), during the prompt's forward through the model: this model was not prepared "
                "for oscar-guarded, or the prompt reached the cache without the model's attention"
            )
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.k_res, self.v_res = key_states, value_states  # held exact until the choice (the prompt attends exactly)
        self.seen += key_states.shape[-2]
        _await(self)
        return key_states, value_states

    def decide(self, query: torch.Tensor) -> None:
        """Choose each sequence's and KV head's rotation from its queries, query [B, Hq, n, D] (this layer's rows and
        the n prompt tokens it holds), then quantize what it held in the chosen basis."""
        keys = self.k_res
        if query.shape[0] != keys.shape[0] or query.shape[2] != keys.shape[2]:
            raise RuntimeError(
                f"oscar-guarded, layer {self.ctx.layer_idx}: queries of shape {tuple(query.shape)} do not match the "
                f"{tuple(keys.shape)} keys held for the choice"
            )
        # query head i reads KV head i // (Hq / Hkv) (transformers' repeat_kv): each KV head's group stacked
        grouped = query.reshape(keys.shape[0], self.ctx.num_kv_heads, -1, query.shape[-1])
        group = self.config.group_size
        rho = torch.stack([rho_by_rotation(grouped[b], keys[b], group) for b in range(keys.shape[0])])
        self.rotation_rho = rho.float()
        self.rotation_code = choose(rho).to(keys.device)
        empty = keys[..., :0, :]
        OScaRLayer._append(self, empty, self.v_res[..., :0, :])  # flush the held tokens by OScaR's window rule

    def choices(self) -> dict[str, int] | None:
        """How many (sequence, KV head) took each rotation, or None before the choice."""
        if self.rotation_code is None:
            return None
        return {name: int((self.rotation_code == i).sum()) for i, name in enumerate(ROTATIONS)}

    def _rotations(self) -> torch.Tensor:
        """[B, H, D, D]: each sequence's and head's key rotation."""
        if self.rotation_code is None:
            raise RuntimeError(f"oscar-guarded, layer {self.ctx.layer_idx}: no key rotation chosen yet")
        return self._bank[self.rotation_code.to(self._bank.device)]

    def _pack(self, k: torch.Tensor, v: torch.Tensor, backend: str | None):
        """Keys rotated by their head's choice, values by OScaR's Hadamard unless the weights carry it; then OScaR's
        reference pack (token scaling, per-channel key groups, per-token values) with no rotation of its own. The
        token norms are OScaR's: every candidate is orthogonal per head."""
        v = v.float() @ self._vrot if self._vrot is not None else v.float()
        c = self.config
        return pack_reference(k.float() @ self._rotations(), v, c.bits, c.group_size, None, c.token_norm, c.zero_point)

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.k_q is None:
            return None
        k = self.k_q.dequantize()
        if self.norms is not None:
            k = k * self.norms[:, None, :, None]
        v = self.v_q.dequantize()
        return k @ self._rotations().mT, (v @ self._vrot if self._vrot is not None else v)

    def packed_view(self):
        raise NotImplementedError("oscar-guarded decodes on the reference path only (no packed kernels)")


def choices(cache) -> list[dict[str, int] | None]:
    """Per layer of `cache`, how many (sequence, KV head) took each rotation (summed over a padded batch's
    sequences), or None for a layer that has not chosen."""
    out = []
    for layer in cache.layers:
        rows = getattr(layer, "rows", [layer])  # quant/rows.py: one layer per sequence of a padded batch
        counts = [row.choices() for row in rows]
        if any(c is None for c in counts):
            out.append(None)
        else:
            out.append({name: sum(c[name] for c in counts) for name in ROTATIONS})
    return out


# -- the hand-off from cache.update to the attention function -------------------------------------------------------
_AWAITING: list[weakref.ref] = []  # layers holding a prompt chunk for their choice, in the order they were updated


def _await(layer: OScaRGuardedLayer) -> None:
    """Queue `layer` for the attention call that follows its update. What is queued for another layer index or cache is
    stale (its attention did not choose; that layer raises at its next update) and is dropped."""
    same = [
        other
        for other in (ref() for ref in _AWAITING)
        if other is not None and other.ctx.layer_idx == layer.ctx.layer_idx and other.ctx.shared is layer.ctx.shared
    ]
    _AWAITING[:] = [weakref.ref(x) for x in [*same, layer]]


def _decide(layer_idx, query: torch.Tensor) -> None:
    """Hand the waiting layers of `layer_idx` their rows of `query` [B, Hq, S, D], in order."""
    layers = [x for x in (ref() for ref in _AWAITING) if x is not None and x.ctx.layer_idx == layer_idx]
    if not layers:
        return
    _AWAITING.clear()
    rows = sum(x.k_res.shape[0] for x in layers)
    if rows != query.shape[0]:
        raise RuntimeError(
            f"oscar-guarded, layer {layer_idx}: {rows} sequence(s) wait for a choice but the attention has "
            f"{query.shape[0]} rows of queries"
        )
    b = 0
    for layer in layers:
        n, batch = layer.k_res.shape[-2], layer.k_res.shape[0]
        layer.decide(query[b : b + batch, :, query.shape[2] - n :])  # left padding: its own tokens are the last n
        b += batch


def _wrapped(module, base: str):
    """The attention function registered as `base`; the model's own eager function for "eager"."""
    from transformers import AttentionInterface

    if base in AttentionInterface._global_mapping:
        return AttentionInterface._global_mapping[base]
    return sys.modules[type(module).__module__].eager_attention_forward


def register(base: str) -> str:
    """Register the deciding attention function over `base` (with `base`'s mask function); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    def attention(module, query, key, value, attention_mask, **kwargs):
        if _AWAITING:
            _decide(getattr(module, "layer_idx", None), query)
        return _wrapped(module, base)(module, query, key, value, attention_mask, **kwargs)

    name = f"{GUARD_ATTENTION}_{base}"
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, AttentionMaskInterface._global_mapping[base])
    return name


def install(model) -> None:
    """Switch `model`'s text attention to the deciding function over its current one, recorded on the model's
    PreparedModel so that its undo() restores it. Needs the model prepared (quant.prepare_model): a cache cannot change
    the model on its own, and the preparation is what gives the model back as it was."""
    from quant.cache import text_config
    from quant.prepare import _PREPARED, _switch_attention

    ref = model.__dict__.get(_PREPARED)
    prepared = ref() if ref is not None else None
    if prepared is None or prepared.undone:
        raise ValueError(
            "oscar-guarded chooses its key rotations inside the model's attention: prepare the model first "
            "(prepared = quant.prepare_model(model, 'oscar-guarded'); cache = prepared.make_cache())"
        )
    current = text_config(model)._attn_implementation or "sdpa"
    if current.startswith(GUARD_ATTENTION):
        return
    prepared._attn.extend(_switch_attention(model, register(current)))
