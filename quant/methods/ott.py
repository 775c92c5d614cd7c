"""OTT, Outlier Tokens Tracing (ACL 2025), as OScaR's comparison configures it: KIVI-style INT2
(keys per channel in G-token groups, values per token in G-channel groups), block flush every R
tokens, and a pool of the P tokens with the SMALLEST key magnitude kept in full precision.

At each block quantization, per KV head: the L1 key magnitude (over channels) of the block's tokens
and of the pooled tokens is compared; the P smallest enter (or stay in) the pool with their FP K and V.
In the block, pooled tokens' K and V are replaced by the mean of the block's other tokens so they do
not widen the min/max; a token pushed out of the pool is quantized into its slot (keys with its
group's scale/zero, values as their own per-token group). The first `skip_layers` layers keep no pool.
Values are block-flushed with the keys [ours: the pool holds K and V together, so both share blocks].
`zero_point`: "float" (KIVI's code, which OTT builds on) or "integer" (OScaR's evaluation framework).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quant.methods.base import (
    MethodConfig,
    QuantLayer,
    block_flush_chunk,
    cat_tokens,
    check,
    check_pow2_group,
    check_zero_point,
    own,
)
from quant.packed import QTensor, cat_optional, quantize, write_token


@dataclass(frozen=True)
class OTTConfig(MethodConfig):
    method = "ott"
    bits: int = 2
    group_size: int = 32
    residual_length: int = 128
    outlier_tokens: int = 5
    skip_layers: int = 2
    zero_point: str = "float"  # "float" | "integer"

    def validate(self):
        check(self.bits in (2, 3, 4), f"ott.bits must be 2, 3 or 4, got {self.bits}")
        check_pow2_group("ott.group_size", self.group_size)
        check(
            self.residual_length > 0 and self.residual_length % self.group_size == 0,
            f"ott.residual_length ({self.residual_length}) must be a positive multiple of group_size "
            f"({self.group_size})",
        )
        check_zero_point("ott", self.zero_point)
        check(self.outlier_tokens >= 0 and self.skip_layers >= 0, "ott.outlier_tokens and ott.skip_layers must be >= 0")

    def exact_chunk(self, position):
        return block_flush_chunk(position, self.residual_length)  # the pool changes only when a block flushes

    def make_layer(self, ctx):
        return OTTLayer(self, ctx)


def _replace_by_mean(x: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; pooled bool [B, H, T]: pooled rows become the mean of the other rows."""
    keep = (~pooled).unsqueeze(-1).float()
    mean = (x.float() * keep).sum(-2, keepdim=True) / keep.sum(-2, keepdim=True).clamp_min(1)
    return torch.where(pooled.unsqueeze(-1), mean.to(x.dtype), x)


class OTTLayer(QuantLayer):
    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self.pool_size = 0 if ctx.layer_idx < config.skip_layers else config.outlier_tokens
        self.k_q: QTensor | None = None
        self.v_q: QTensor | None = None
        self.k_res: torch.Tensor | None = None
        self.v_res: torch.Tensor | None = None
        self.pool_k = self.pool_v = self.pool_pos = self.pool_mag = None

    def _append(self, k, v):
        c = self.config
        self.k_res, self.v_res = cat_tokens(self.k_res, k), cat_tokens(self.v_res, v)
        full = (self.k_res.shape[-2] // c.residual_length) * c.residual_length
        if full:
            self._flush(self.k_res[..., :full, :], self.v_res[..., :full, :])
            self.k_res, self.v_res = own(self.k_res[..., full:, :]), own(self.v_res[..., full:, :])

    def _flush(self, kb: torch.Tensor, vb: torch.Tensor) -> None:
        b, h, t, d = kb.shape
        start = 0 if self.k_q is None else self.k_q.num_tokens
        if self.pool_size == 0:
            self._store_block(kb, vb)
            return
        mag = kb.float().abs().sum(-1)
        pos = torch.arange(start, start + t, device=kb.device).expand(b, h, t)
        old = 0 if self.pool_pos is None else self.pool_pos.shape[-1]
        cand_mag = mag if old == 0 else torch.cat([self.pool_mag, mag], -1)
        cand_pos = pos if old == 0 else torch.cat([self.pool_pos, pos], -1)
        cand_k = kb if old == 0 else torch.cat([self.pool_k, kb], -2)
        cand_v = vb if old == 0 else torch.cat([self.pool_v, vb], -2)
        n = min(self.pool_size, old + t)
        chosen = cand_mag.topk(n, dim=-1, largest=False).indices  # [B, H, n]
        is_chosen = torch.zeros_like(cand_mag, dtype=torch.bool).scatter_(-1, chosen, True)
        self._store_block(_replace_by_mean(kb, is_chosen[..., old:]), _replace_by_mean(vb, is_chosen[..., old:]))
        for bi, hi, j in (~is_chosen[..., :old]).nonzero().tolist():  # evicted pool tokens -> their slots
            p = int(self.pool_pos[bi, hi, j])
            write_token(self.k_q, bi, hi, p, self.pool_k[bi, hi, j])
            write_token(self.v_q, bi, hi, p, self.pool_v[bi, hi, j], self.config.zero_point)
        gather = chosen.unsqueeze(-1).expand(-1, -1, -1, d)
        self.pool_k, self.pool_v = cand_k.gather(-2, gather), cand_v.gather(-2, gather)
        self.pool_pos, self.pool_mag = cand_pos.gather(-1, chosen), cand_mag.gather(-1, chosen)

    def _store_block(self, kb, vb):
        c = self.config
        self.k_q = cat_optional(self.k_q, quantize(kb, c.bits, c.group_size, axis=-2, zero_point=c.zero_point))
        self.v_q = cat_optional(self.v_q, quantize(vb, c.bits, c.group_size, axis=-1, zero_point=c.zero_point))

    def _dense(self):
        if self.k_q is None:
            return self.k_res, self.v_res
        k, v = self.out_dtype(self.k_q.dequantize()), self.out_dtype(self.v_q.dequantize())
        if self.pool_pos is not None:
            idx = self.pool_pos.unsqueeze(-1).expand(-1, -1, -1, k.shape[-1])
            k, v = k.scatter(-2, idx, self.pool_k.to(k.dtype)), v.scatter(-2, idx, self.pool_v.to(v.dtype))
        return torch.cat([k, self.k_res], -2), torch.cat([v, self.v_res], -2)

    def _stored(self):
        return {
            "codes": [self.k_q, self.v_q],
            "residual": [self.k_res, self.v_res],
            "outliers": [self.pool_k, self.pool_v, self.pool_pos, self.pool_mag],
        }
