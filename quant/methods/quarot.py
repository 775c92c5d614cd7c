"""QuaRot, KV part (NeurIPS 2024): Hadamard per head on K (and Q) after RoPE and on V, then per-token
asymmetric quantization of each head (group = head_dim) with clip ratio 0.95 on max and min.

`residual_length` R: QuaRot's own code keeps no full-precision window (R = 0: the prompt and every generated token
are quantized as they are stored); with R > 0 the newest tokens wait in full precision and every R are quantized
at once (block flush, as OScaR's evaluation framework runs every method). The prompt then quantizes
floor(L / R) * R tokens. `keep_first_tokens` [ours] keeps the first N tokens in full precision (OScaR's paper says
its QuaRot/RotateKV baselines "reserve a few high-precision tokens"); QuaRot's own code uses 0.
`zero_point`: "integer" (QuaRot's code: z = round(-min / s)) or "float" (the minimum itself).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quant.methods.base import MethodConfig, QuantLayer, block_flush_chunk, cat_tokens, check, check_zero_point
from quant.packed import QTensor, cat_optional, quantize
from quant.primitives import hadamard


@dataclass(frozen=True)
class QuaRotConfig(MethodConfig):
    method = "quarot"
    key_bits: int = 2
    value_bits: int = 2
    group_size: int = 0  # 0 = the whole head (head_dim), as QuaRot does
    clip_ratio: float = 0.95
    keep_first_tokens: int = 0
    residual_length: int = 0
    zero_point: str = "integer"

    def validate(self):
        check(self.key_bits in (2, 3, 4) and self.value_bits in (2, 3, 4), "quarot bits must be 2, 3 or 4")
        check(0.5 <= self.clip_ratio <= 1.0, f"quarot.clip_ratio must be in [0.5, 1], got {self.clip_ratio}")
        check(self.keep_first_tokens >= 0, "quarot.keep_first_tokens must be >= 0")
        check(self.group_size >= 0, "quarot.group_size must be >= 0 (0 = head_dim)")
        check(
            self.residual_length >= 0,
            f"quarot.residual_length must be >= 0 (0 = no window), got {self.residual_length}",
        )
        check_zero_point("quarot", self.zero_point)

    @property
    def bits(self):
        return float(self.key_bits)

    def exact_chunk(self, position):
        return block_flush_chunk(position, self.residual_length)  # per-token groups: tokens quantize independently

    def make_layer(self, ctx):
        return QuaRotLayer(self, ctx)


class QuaRotLayer(QuantLayer):
    """State: k_fp/v_fp (the first kept tokens), k_q/v_q (rotated, per-token packed), k_res/v_res (the window)."""

    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self.k_fp: torch.Tensor | None = None
        self.v_fp: torch.Tensor | None = None
        self.k_q: QTensor | None = None
        self.v_q: QTensor | None = None
        self.k_res: torch.Tensor | None = None
        self.v_res: torch.Tensor | None = None
        self._rot: torch.Tensor | None = None

    def lazy_initialization(self, key_states, value_states):
        super().lazy_initialization(key_states, value_states)
        self._rot = hadamard(self.ctx.head_dim, device=self.device)

    def _group(self) -> int:
        return self.config.group_size or self.ctx.head_dim

    def _append(self, k, v):
        c = self.config
        kept = 0 if self.k_fp is None else self.k_fp.shape[-2]
        n_fp = max(0, min(c.keep_first_tokens - kept, k.shape[-2]))
        if n_fp:
            self.k_fp, self.v_fp = cat_tokens(self.k_fp, k[..., :n_fp, :]), cat_tokens(self.v_fp, v[..., :n_fp, :])
            k, v = k[..., n_fp:, :], v[..., n_fp:, :]
        block = self._window_blocks(k, v, c.residual_length) if k.shape[-2] else None
        if block is not None:
            kb, vb = block
            g, z = self._group(), c.zero_point
            kq = quantize(kb.float() @ self._rot, c.key_bits, g, axis=-1, clip=c.clip_ratio, zero_point=z)
            vq = quantize(vb.float() @ self._rot, c.value_bits, g, axis=-1, clip=c.clip_ratio, zero_point=z)
            self.k_q, self.v_q = cat_optional(self.k_q, kq), cat_optional(self.v_q, vq)

    def _dense(self):
        parts_k, parts_v = [], []
        if self.k_fp is not None:
            parts_k.append(self.k_fp)
            parts_v.append(self.v_fp)
        if self.k_q is not None:
            k, v = self._memo("kv", (self.k_q, self.v_q), self._dequantized)
            parts_k.append(k)
            parts_v.append(v)
        if self.k_res is not None:
            parts_k.append(self.k_res)
            parts_v.append(self.v_res)
        return torch.cat(parts_k, -2), torch.cat(parts_v, -2)

    def _dequantized(self):
        return self.out_dtype(self.k_q.dequantize() @ self._rot), self.out_dtype(self.v_q.dequantize() @ self._rot)

    def _stored(self):
        return {"codes": [self.k_q, self.v_q], "outliers": [self.k_fp, self.v_fp], "residual": [self.k_res, self.v_res]}
