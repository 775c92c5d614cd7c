"""The pack of K and V into OScaR's codes on the CUDA kernel (csrc/oscar_bindings.cu `pack`)."""

from __future__ import annotations

import torch

from quant.kernels.cuda.loader import load
from quant.packed import QTensor


def pack_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    rotate: bool = True,
    token_norm: bool = True,
    rotate_values: bool | None = None,
    zero_point: str = "float",
):
    """Quantize and pack K, V [B, H, T, D] (T % 32 == 0) with the CUDA kernel; same return value as
    quant.methods.oscar.pack_block: (k_q QTensor axis -2, v_q QTensor axis -1, norms fp32 [B, T] or None),
    codes in the "frag" order the decode kernel reads (quant/packed.py). rotate_values (default: rotate) = False
    packs V as it comes (its rotation folded into the model's weights, quant/fold.py). zero_point: "float" or
    "integer" (quant.primitives.asym_quantize)."""
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        k, v = k.contiguous(), v.contiguous()
    kc, ks, kz, vc, vs, vz, norms = load(k.shape[-1]).pack(
        k, v, rotate, token_norm, rotate if rotate_values is None else rotate_values, zero_point == "integer"
    )
    return (
        QTensor(kc, ks, kz, 2, 32, -2, order="frag"),
        QTensor(vc, vs, vz, 2, 32, -1, order="frag"),
        norms if token_norm else None,
    )
