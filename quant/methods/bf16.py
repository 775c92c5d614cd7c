"""BF16 (reference): the plain cache on the same code path as every quantized method.

On a GPU its decode steps take the same machinery as OScaR's kernel path: the decode engine's BF16 layer
(quant/engine/bf16.py) keeps K/V in preallocated buffers, so a step has the same shapes and addresses every time and
quant.engine.graphs replays it as a CUDA graph. A comparison of decode speed then sets graphs against graphs, not
graphs against eager steps. This file holds the method: its config and the plain storage (the reference path).
"""

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
        check(
            self.dtype in ("model", "bfloat16", "float16", "float32"),
            f"bf16.dtype must be model|bfloat16|float16|float32, got {self.dtype!r}",
        )

    def exact_chunk(self, position):
        return 1 << 30  # stored as given: any chunk sees what its decode steps would

    @property
    def fixed_shape_decode(self) -> bool:
        return True

    def make_layer(self, ctx):
        """The storage layer (reference path); a cache takes the engine's subclass with the fixed-shape steps
        (quant.engine.make_layer)."""
        return BF16Layer(self, ctx)


class BF16Layer(QuantLayer):
    keys: torch.Tensor | None
    values: torch.Tensor | None

    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self.keys = self.values = None

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
