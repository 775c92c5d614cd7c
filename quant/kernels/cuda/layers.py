"""The decode-time RMSNorm and RoPE on the layer extension's CUDA kernels (quant/kernels/triton_norm.py and
triton_rope.py launch them on CUDA in place of their Triton kernels); the GEMV's launcher is
quant/kernels/fused_linear.py."""

from __future__ import annotations

import torch

from quant.kernels.cuda import loader

NORM_DTYPES = (torch.float16, torch.bfloat16)


NORM_MAX_N = 16384


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """x [..., N] as the [rows, N] view the CUDA RMSNorm takes, or None when it does not take these inputs (one
    fp16/bf16 dtype, N % 8 == 0 up to NORM_MAX_N, 16-byte aligned rows, a contiguous aligned weight)."""
    n = x.shape[-1] if x.dim() else 0
    if not (
        x.dtype in NORM_DTYPES
        and weight.dtype == x.dtype
        and n
        and n % 8 == 0
        and n <= NORM_MAX_N
        and weight.is_contiguous()
        and weight.data_ptr() % 16 == 0
        and weight.device == x.device
    ):
        return None
    try:
        x2 = x.view(-1, n)
    except RuntimeError:  # strides that do not collapse to rows
        return None
    ok = x2.stride(-1) == 1 and x2.data_ptr() % 16 == 0 and (x2.shape[0] <= 1 or x2.stride(0) % 8 == 0)
    return x2 if ok else None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [..., N] with weight [N] on the CUDA kernel (csrc/include/oscar_rmsnorm.cuh), transformers'
    formula and rounding -> a contiguous tensor of x's shape and dtype. Inputs as `rms_norm_rows` takes."""
    x2 = rms_norm_rows(x, weight)
    if x2 is None:
        raise ValueError(
            f"cuda.rms_norm: x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} {weight.dtype}: "
            f"need one fp16/bf16 dtype, N % 8 == 0 up to {NORM_MAX_N}, 16-byte aligned rows "
            "(quant.kernels.triton_norm.rms_norm takes the rest)"
        )
    return loader.load_layers().rms_norm(x2, weight, float(eps)).view(x.shape)


def rope_takes(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether the CUDA RoPE takes inputs that quant.kernels.triton_rope.supported accepts: D % 8 == 0 and 8-byte
    loads (aligned bases, strides in whole 4-element units)."""
    if q.shape[-1] % 8:
        return False
    for t in (q, k, cos, sin):
        if t.data_ptr() % 8 or any(st % 4 for n, st in zip(t.shape[:-1], t.stride()[:-1]) if n > 1):
            return False
    return True


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q * cos + rotate_half(q) * sin, the same for k) on the CUDA kernel (csrc/include/oscar_rope.cuh), with
    transformers' bits; q/k [B, H, L, D], cos/sin [B or 1, L, D]. Outputs keep q's and k's strides."""
    oq, ok = loader.load_layers().rope(q, k, cos, sin)
    return oq, ok
