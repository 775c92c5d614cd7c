"""OScaR with the key rotation fitted to RoPE [ours, beyond the paper]: OScaR's token scaling, INT2 per-channel key
groups and values, with only the keys' rotation changed.

OScaR rotates every key by the D x D Hadamard before quantizing. Where a few loud channels swing within a 32-token
group while the queries read the quiet ones, the Hadamard spreads the swing's rounding error into every channel,
the quiet ones included (`oscar-eval diagnose`, docs/METHODS.md: Qwen2.5's layer 0, whose keys are its k_proj bias
turned by RoPE, rho ~110). Two rotations that keep such a swing where it lives:

- `oscar-pairwise` (OScaRPairwiseConfig): a 2 x 2 Hadamard within each RoPE frequency pair, channel i with
  i + D/2 (transformers' rotate_half pairing). RoPE turns each pair by its own angle per token, so a constant on a
  pair swings inside those two channels only, and the pair rotation mixes nothing else into them.
- `oscar-prerope` (OScaRPreRoPEConfig): keys quantized before RoPE. RoPE is undone at each token's position
  (the cache receives keys after it), OScaR's Hadamard and scaling applied, the codes stored; after dequantizing,
  RoPE is applied again. A constant (a bias) then stays constant over tokens and costs a group no range.

Values are OScaR's: the Hadamard folded into v_proj / o_proj (quant/fold.py), or rotated in the cache where the
model is not prepared. The reference path only (no kernel decode): the fused packs and decode kernels implement the
full Hadamard.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quant.methods.base import check
from quant.methods.oscar import OScaRConfig, OScaRLayer
from quant.methods.rotatekv import find_rope, rope, unrope
from quant.packed import pack_reference
from quant.primitives import hadamard


def pair_hadamard(d: int, device=None) -> torch.Tensor:
    """The D x D rotation that applies the normalised 2 x 2 Hadamard to each RoPE pair (channel i with i + D/2):
    (a, b) -> ((a + b) / sqrt 2, (a - b) / sqrt 2). Symmetric and its own inverse, as OScaR's Hadamard is."""
    if d % 2:
        raise ValueError(f"a RoPE-pair rotation needs an even head dim, got {d}")
    half, s = d // 2, 2.0**-0.5
    r = torch.zeros(d, d, device=device)
    i = torch.arange(half, device=device)
    r[i, i], r[i, i + half], r[i + half, i], r[i + half, i + half] = s, s, s, -s
    return r


def _check_variant(config: OScaRConfig, name: str) -> None:
    check(config.rotation == "hadamard", f"{name} rotates its keys itself: leave rotation='hadamard' (its values')")
    check(not config.align_modality_groups, f"{name} takes whole 32-token key groups (align_modality_groups=false)")


@dataclass(frozen=True)
class OScaRPairwiseConfig(OScaRConfig):
    method = "oscar-pairwise"

    def validate(self):
        super().validate()
        _check_variant(self, "oscar-pairwise")

    @property
    def kernel_decode(self) -> bool:
        return False

    def make_layer(self, ctx):
        return OScaRRoPELayer(self, ctx)


@dataclass(frozen=True)
class OScaRPreRoPEConfig(OScaRConfig):
    method = "oscar-prerope"

    def validate(self):
        super().validate()
        _check_variant(self, "oscar-prerope")

    @property
    def kernel_decode(self) -> bool:
        return False

    def make_layer(self, ctx):
        return OScaRRoPELayer(self, ctx)

    def cannot_run(self, model) -> str | None:
        try:
            find_rope(model)
        except ValueError as err:  # RoPE is undone and applied again: it needs the model's rotary embedding
            return str(err).replace("rotatekv", "oscar-prerope")
        return None

    def prepare(self, model, tokenizer, shared: dict) -> None:
        """The model's RoPE at any positions and layer (quant.methods.rotatekv.find_rope)."""
        shared["rope"] = find_rope(model)


class OScaRRoPELayer(OScaRLayer):
    """OScaRLayer whose keys are rotated by the variant's rotation (and, before RoPE, for oscar-prerope); values as
    OScaR's. Packs and dequantizes on the reference path."""

    def lazy_initialization(self, key_states, value_states):
        super().lazy_initialization(key_states, value_states)
        d = self.ctx.head_dim
        pairwise = isinstance(self.config, OScaRPairwiseConfig)
        self._krot = pair_hadamard(d, self.device) if pairwise else hadamard(d, device=self.device)
        self._vrot = hadamard(d, device=self.device) if self._values_rotated else None
        self._rot = None  # OScaR's single rotation of keys and values: this layer keeps them apart
        self._prerope = not pairwise

    def _rope_at(self, start: int, length: int, device):
        positions = torch.arange(start, start + length, device=device)
        return self.ctx.shared["rope"](positions, self.ctx.layer_idx)

    def _pack(self, k: torch.Tensor, v: torch.Tensor, backend: str | None):
        """Keys: RoPE undone at their positions (oscar-prerope), the variant's rotation; values: OScaR's Hadamard
        unless the weights carry it; then OScaR's reference pack (scaling, per-channel key groups, per-token values)
        with no rotation of its own. A block starts where the stored tokens end."""
        k = k.float()
        if self._prerope:
            cos, sin = self._rope_at(0 if self.k_q is None else self.k_q.num_tokens, k.shape[-2], k.device)
            k = unrope(k, cos, sin)
        v = v.float() @ self._vrot if self._vrot is not None else v.float()
        c = self.config
        return pack_reference(k @ self._krot, v, c.bits, c.group_size, None, c.token_norm, c.zero_point)

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.k_q is None:
            return None
        k = self.k_q.dequantize()
        if self.norms is not None:
            k = k * self.norms[:, None, :, None]
        k = k @ self._krot
        if self._prerope:
            cos, sin = self._rope_at(0, k.shape[-2], k.device)
            k = rope(k, cos, sin)
        v = self.v_q.dequantize()
        return k, (v @ self._vrot if self._vrot is not None else v)

    def packed_view(self):
        raise NotImplementedError(f"{self.config.method} decodes on the reference path only (no packed kernels)")
