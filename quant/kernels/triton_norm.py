"""Triton RMSNorm in one kernel, and `fuse_rms_norms`, which puts it under a transformers model's norms.

On CUDA the patched norms launch the same formula as a CUDA kernel when it takes the inputs
(quant.kernels.cuda.rms_norm, csrc/include/oscar_rmsnorm.cuh: its C++ launch costs a third of Triton's host time);
this kernel is the fallback, the backend CI runs under the interpreter, and the one that takes mixed dtypes.

transformers' Llama/Qwen RMSNorm runs as ~7 elementwise and reduction kernels; a Qwen3-8B decode step
calls it 145 times (two per layer, q_norm/k_norm per head, the final norm). For x [..., N] and weight [N]:
    h = float32(x);  r = rsqrt(mean(h^2 over N) + eps);  out = weight * dtype_x(h * r)
the normalized value is rounded to x's dtype before the weight multiplies it, and out has the promoted
dtype of (weight, x), exactly as the transformers forward. The product of two fp16/bf16 numbers is exact
in float32, so one float32 multiply rounded to the output dtype gives torch's bits for that step.
"""

from __future__ import annotations

import functools
import os
import types

import torch
import triton
import triton.language as tl

from quant.kernels.patches import Patches
from quant.traits import ModelTraits

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_N = 16384
# Triton picks its interpreter when it is imported; the kernel then rounds bf16 by hand (`_round`).
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _round(x, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """float32 x -> dtype, rounded to nearest even (the GPU's cast). The interpreter's fp32 -> bf16 cast
    truncates instead: there the bits are rounded to bf16 precision first, so its cast is exact."""
    if INTERPRET and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # ties go to the even bf16 mantissa
        x = tl.where(x == x, bits.to(tl.float32, bitcast=True), x)  # NaN stays NaN
    return x.to(dtype)


@triton.jit(do_not_specialize=["rows"])  # the batch size must not pick a new compilation
def rms_norm_kernel(
    x_ptr, w_ptr, out_ptr, rows, n, x_row_stride, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr, INTERPRET: tl.constexpr
):
    """ROWS rows per program; a row is BLOCK >= n contiguous elements, masked past n."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK)
    mask = (r < rows)[:, None] & (c < n)[None, :]
    r64 = r.to(tl.int64)[:, None]  # rows x stride passes 2^31 in long batched prefills
    h = tl.load(x_ptr + r64 * x_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
    var = tl.sum(h * h, axis=1) / n  # masked lanes are 0: they add nothing
    normed = _round(h * tl.rsqrt(var + eps)[:, None], x_ptr.dtype.element_ty, INTERPRET)
    w = tl.load(w_ptr + c, mask=c < n, other=0.0).to(tl.float32)
    out = normed.to(tl.float32) * w[None, :]
    tl.store(out_ptr + r64 * n + c[None, :], _round(out, out_ptr.dtype.element_ty, INTERPRET), mask=mask)


def launch_config(n: int) -> tuple[int, int, int]:
    """(BLOCK, ROWS, num_warps) from N alone: one specialization per N, no autotuning (graph capture)."""
    block = triton.next_power_of_2(n)
    rows = max(1, min(16, 2048 // block))  # small N (head_dim 128): 16 rows share a program
    return block, rows, min(16, max(4, block * rows // 512))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [..., N] (fp16/bf16/fp32) with weight [N] -> [..., N], dtype promote(weight, x).

    The leading dims may have any strides that collapse to one row stride (a slice of a wider row);
    other layouts are copied first. N <= 16384. Output is contiguous.
    """
    n = x.shape[-1]
    if x.dtype not in DTYPES or weight.dtype not in DTYPES or weight.shape != (n,) or not 0 < n <= MAX_N:
        raise ValueError(
            f"rms_norm: x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} {weight.dtype}; "
            f"need weight [N], N <= {MAX_N}, dtypes in {DTYPES}"
        )
    x2 = x.reshape(-1, n) if x.stride(-1) == 1 else x.contiguous().view(-1, n)  # a view when strides allow
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    if x2.shape[0] == 0:
        return out
    block, rows, warps = launch_config(n)
    grid = (triton.cdiv(x2.shape[0], rows),)
    args = (x2, weight.contiguous(), out, x2.shape[0], n, x2.stride(0), float(eps))
    meta = dict(ROWS=rows, BLOCK=block, INTERPRET=INTERPRET, num_warps=warps)
    if x.is_cuda and x.device.index != torch.cuda.current_device():  # Triton launches on the current device
        with torch.cuda.device(x.device):
            rms_norm_kernel[grid](*args, **meta)
    else:
        rms_norm_kernel[grid](*args, **meta)
    return out


def _fused_forward(self, hidden_states: torch.Tensor, cuda_launch: bool = True) -> torch.Tensor:
    """Instance forward of a patched norm: on CUDA the CUDA kernel (quant.kernels.cuda.rms_norm: fp16/bf16 with a
    weight of the same dtype, N % 8 == 0, `layer_kernels_on`; where the patch chose `cuda_launch`) or this Triton
    kernel; the class's forward elsewhere."""
    w = self.weight
    grad = torch.is_grad_enabled() and (hidden_states.requires_grad or w.requires_grad)  # kernel has no backward
    if (
        hidden_states.is_cuda
        and not grad
        and hidden_states.dtype in DTYPES
        and w.dtype in DTYPES
        and 0 < hidden_states.shape[-1] <= MAX_N
    ):
        from quant.kernels import cuda

        if cuda_launch and cuda.layer_kernels_on(hidden_states.device):  # the same formula, one C++ launch
            x2 = cuda.rms_norm_rows(hidden_states, w)
            if x2 is not None:
                return cuda.load_layers().rms_norm(x2, w, float(self.variance_epsilon)).view(hidden_states.shape)
        return rms_norm(hidden_states, w, self.variance_epsilon)
    return type(self).forward(self, hidden_states)


def _allowed(module, qualified: tuple[str, ...]) -> bool:
    # The module is part of the name: a remote-code class may reuse a listed name with another forward.
    return (
        ModelTraits.name(type(module)) in qualified
        and hasattr(module, "variance_epsilon")
        and isinstance(getattr(module, "weight", None), torch.nn.Parameter)
    )


def fuse_rms_norms(
    model: torch.nn.Module, traits: ModelTraits, cuda_launch: bool = True, patches: Patches | None = None
) -> int:
    """Route every RMSNorm of `model` of a class `traits.norm` lists through `rms_norm` when its input is on CUDA
    (through the CUDA kernel instead where `cuda_launch` and `quant.kernels.cuda.layer_kernels_on`).

    Sets an instance `forward` (a bound method, so deepcopy rebinds it; the choice of `cuda_launch` is bound into it)
    recorded in `patches` (quant.kernels.patches.Patches: `undo()` takes it back); classes and transformers' modules
    are left untouched, and a module whose forward is already overridden is skipped. Returns the count.
    """
    patches = patches if patches is not None else Patches()
    count = 0
    for module in model.modules():
        if _allowed(module, traits.norm) and "forward" not in module.__dict__:
            patches.set(
                module, "forward", types.MethodType(functools.partial(_fused_forward, cuda_launch=cuda_launch), module)
            )
            count += 1
    patches.add("norm", count)
    return count
