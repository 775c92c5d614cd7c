"""KIVI (ICML 2024): per-channel keys in token groups, per-token values, full-precision windows.

Keys: full-precision keys accumulate; whenever R are pending they are quantized at once (per channel,
groups of G tokens) and the window empties, so 0..R-1 keys stay FP. The prompt quantizes its first
L - L mod R keys. Values (per token, groups of G channels), by `value_flush`: "fifo" (KIVI's own code) keeps the
newest R FP and quantizes older ones one by one; "block" (OScaR's evaluation framework, its default for every
method) flushes them with the keys.
`zero_point`: "float" (KIVI's own code: x_hat = q * s + min) or "integer" (OScaR's framework runs KIVI so:
x_hat = s * (q - round(-min / s))).
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
from quant.packed import QTensor, cat_optional, quantize


@dataclass(frozen=True)
class KIVIConfig(MethodConfig):
    method = "kivi"
    key_bits: int = 2
    value_bits: int = 2
    group_size: int = 32
    residual_length: int = 128
    value_flush: str = "fifo"  # "fifo" | "block"
    zero_point: str = "float"  # "float" | "integer"

    def validate(self):
        check(
            self.key_bits in (2, 4) and self.value_bits in (2, 4),
            f"kivi bits must be 2 or 4, got K{self.key_bits} V{self.value_bits}",
        )
        check_pow2_group("kivi.group_size", self.group_size)
        check(
            self.residual_length > 0 and self.residual_length % self.group_size == 0,
            f"kivi.residual_length ({self.residual_length}) must be a positive multiple of group_size "
            f"({self.group_size})",
        )
        check(
            self.value_flush in ("fifo", "block"),
            f"kivi.value_flush must be 'fifo' or 'block', got {self.value_flush!r}",
        )
        check_zero_point("kivi", self.zero_point)

    @property
    def bits(self):
        return float(self.key_bits)

    def exact_chunk(self, position):
        # a FIFO value window moves with every token: only a step at a time sees it as decoding does
        return block_flush_chunk(position, self.residual_length) if self.value_flush == "block" else 1

    def make_layer(self, ctx):
        return KIVILayer(self, ctx)


class KIVILayer(QuantLayer):
    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self.k_q: QTensor | None = None
        self.v_q: QTensor | None = None
        self.k_res: torch.Tensor | None = None
        self.v_res: torch.Tensor | None = None

    def _append(self, k, v):
        c = self.config
        self.k_res = cat_tokens(self.k_res, k)
        full = (self.k_res.shape[-2] // c.residual_length) * c.residual_length
        if full:
            self.k_q = cat_optional(
                self.k_q,
                quantize(self.k_res[..., :full, :], c.key_bits, c.group_size, axis=-2, zero_point=c.zero_point),
            )
            self.k_res = own(self.k_res[..., full:, :])
        self.v_res = cat_tokens(self.v_res, v)
        excess = full if c.value_flush == "block" else self.v_res.shape[-2] - c.residual_length
        if excess > 0:
            self.v_q = cat_optional(
                self.v_q,
                quantize(self.v_res[..., :excess, :], c.value_bits, c.group_size, axis=-1, zero_point=c.zero_point),
            )
            self.v_res = own(self.v_res[..., excess:, :])

    def _dense(self):
        k, v = self.k_res, self.v_res
        if self.k_q is not None:
            k = torch.cat([self._memo("k", (self.k_q,), self._dequantized_k), k], -2)
        if self.v_q is not None:
            v = torch.cat([self._memo("v", (self.v_q,), self._dequantized_v), v], -2)
        return k, v

    def _dequantized_k(self):
        return self.out_dtype(self.k_q.dequantize())

    def _dequantized_v(self):
        return self.out_dtype(self.v_q.dequantize())

    def _stored(self):
        return {"codes": [self.k_q, self.v_q], "residual": [self.k_res, self.v_res]}
