"""BF16 (reference): the plain cache on the same code path as every quantized method."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from quant.methods.base import MethodConfig, QuantLayer, cat_tokens, check


@dataclass(frozen=True)
class BF16Config(MethodConfig):
    method = "bf16"
    # "model": store K/V in the model's dtype (bf16 on GPU runs); or force a storage dtype.
    dtype: str = "model"

    def validate(self):
        check(self.dtype in ("model", "bfloat16", "float16", "float32"), f"bf16.dtype must be model|bfloat16|float16|float32, got {self.dtype!r}")

    def make_layer(self, ctx):
        return BF16Layer(self, ctx)


class BF16Layer(QuantLayer):
    keys: torch.Tensor | None
    values: torch.Tensor | None

    def _store_dtype(self):
        return self.dtype if self.config.dtype == "model" else getattr(torch, self.config.dtype)

    def _append(self, k, v):
        dt = self._store_dtype()
        self.keys = cat_tokens(self.keys, k.to(dt))
        self.values = cat_tokens(self.values, v.to(dt))

    def _dense(self):
        return self.out_dtype(self.keys), self.out_dtype(self.values)

    def _stored(self):
        return {"fp": [self.keys, self.values]}
