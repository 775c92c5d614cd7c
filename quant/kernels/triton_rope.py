"""Rotary position embedding of q and k in one Triton kernel, and `fuse_rotary`, which puts it under a model.

On CUDA the patched RoPE launches the same formula as a CUDA kernel when the layout suits it (quant.kernels.cuda.rope,
csrc/include/oscar_rope.cuh, same bits); this kernel is the fallback and the one CI runs under the interpreter.

transformers applies RoPE as `q * cos + rotate_half(q) * sin` (and the same for k): ten elementwise kernels
per layer (4 multiplies, 2 adds, 2 negations, 2 concatenations). At batch 1 they are ~0.7 ms of a 36-layer
Qwen3-8B decode step on an H100 (profiled), about as much as the OScaR attention saves beside
them. The kernel does one (batch, position) per program, every q and k head, and reproduces transformers'
bits for fp16/bf16: each product is rounded to the input dtype, then their sum (a product of two 16-bit
floats is exact in float32, so float32 math then one rounding is torch's result for each op).
"""
from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from quant.kernels.triton_norm import INTERPRET, _round

DTYPES = (torch.float16, torch.bfloat16)
# Modules whose apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1) was read in transformers 5.x and is the
# formula above (tests/kernels/test_kernels_rope.py checks each against the kernel, bit for bit).
ALLOWED = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen3_vl", "qwen3_vl_moe", "qwen3_omni_moe", "smollm3")


@triton.jit
def _rotate(x_ptr, o_ptr, c, s, h, d, half, n_heads, d_model, sx_h, so_h, INTERPRET: tl.constexpr):
    """o[h, d] = round(round(x[h, d] c[d]) + round(rot(x)[h, d] s[d])), rot(x)[d] = -x[d + D/2] | x[d - D/2]."""
    mask = (h < n_heads)[:, None] & (d < d_model)[None, :]
    x = tl.load(x_ptr + h[:, None] * sx_h + d[None, :], mask=mask, other=0.0)
    partner = tl.where(d < half, d + half, d - half)
    xp = tl.load(x_ptr + h[:, None] * sx_h + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    rot = tl.where((d < half)[None, :], -xp, xp)
    dt = x_ptr.dtype.element_ty
    a = _round(x.to(tl.float32) * c[None, :], dt, INTERPRET).to(tl.float32)
    b = _round(rot * s[None, :], dt, INTERPRET).to(tl.float32)
    tl.store(o_ptr + h[:, None] * so_h + d[None, :], _round(a + b, dt, INTERPRET), mask=mask)


@triton.jit(do_not_specialize=["sq_b", "sq_h", "sq_l", "sk_b", "sk_h", "sk_l", "sc_b", "sc_l", "soq_b", "soq_h",
                               "soq_l", "sok_b", "sok_h", "sok_l"])
def rope_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, oq_ptr, ok_ptr, length, hq, hk, d_model,
                sq_b, sq_h, sq_l, sk_b, sk_h, sk_l, sc_b, sc_l, soq_b, soq_h, soq_l, sok_b, sok_h, sok_l,
                BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, INTERPRET: tl.constexpr):
    """Program (b, l): all hq query heads and hk key heads at that position. Last dims contiguous."""
    pid = tl.program_id(0)
    b = (pid // length).to(tl.int64)
    pos = (pid % length).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    h = tl.arange(0, BLOCK_H)
    c = tl.load(cos_ptr + b * sc_b + pos * sc_l + d, mask=d < d_model, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + b * sc_b + pos * sc_l + d, mask=d < d_model, other=0.0).to(tl.float32)
    half = d_model // 2
    _rotate(q_ptr + b * sq_b + pos * sq_l, oq_ptr + b * soq_b + pos * soq_l, c, s, h, d, half, hq, d_model,
            sq_h, soq_h, INTERPRET)
    _rotate(k_ptr + b * sk_b + pos * sk_l, ok_ptr + b * sok_b + pos * sok_l, c, s, h, d, half, hk, d_model,
            sk_h, sok_h, INTERPRET)


def supported(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1) -> bool:
    """Whether `rope` takes these inputs: q [B, Hq, L, D], k [B, Hk, L, D], cos/sin [B or 1, L, D], one fp16/bf16
    dtype, D even, last dims contiguous, no autograd, unsqueeze_dim 1 (transformers' decoder layout)."""
    if unsqueeze_dim != 1 or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.shape != cos.shape:
        return False
    b, _, length, d = q.shape
    if (k.shape[0] != b or k.shape[2:] != (length, d) or d % 2 or cos.shape[1:] != (length, d)
            or cos.shape[0] not in (1, b)):
        return False
    if any(t.dtype != q.dtype or t.device != q.device or t.stride(-1) != 1 for t in (k, cos, sin)):
        return False
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, cos, sin))
    return q.dtype in DTYPES and q.stride(-1) == 1 and cos.stride() == sin.stride() and not grad


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q * cos + rotate_half(q) * sin, the same for k), cos/sin broadcast over heads, with transformers' rounding.
    Inputs as `supported` requires; the outputs take q's and k's strides (as torch's elementwise ops would)."""
    if not supported(q, k, cos, sin):
        raise ValueError(f"rope: q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)}, cos {tuple(cos.shape)} "
                         f"{cos.dtype}: need q/k [B, H, L, D] and cos/sin [B or 1, L, D] of one fp16/bf16 dtype, "
                         "even D, contiguous last dims, no autograd")
    b, hq, length, d = q.shape
    oq, ok = torch.empty_like(q), torch.empty_like(k)
    if q.numel() == 0 or k.numel() == 0:
        return oq, ok
    sc_b = 0 if cos.shape[0] == 1 else cos.stride(0)
    args = (q, k, cos, sin, oq, ok, length, hq, k.shape[1], d, *(q.stride(i) for i in (0, 1, 2)),
            *(k.stride(i) for i in (0, 1, 2)), sc_b, cos.stride(1), *(oq.stride(i) for i in (0, 1, 2)),
            *(ok.stride(i) for i in (0, 1, 2)))
    block_h, block_d = triton.next_power_of_2(max(hq, k.shape[1])), triton.next_power_of_2(d)
    meta = dict(BLOCK_H=block_h, BLOCK_D=block_d, INTERPRET=INTERPRET, num_warps=4 if block_h * block_d <= 4096 else 8)
    if not INTERPRET:  # no multiply-add contraction: each product is rounded on its own, as torch does
        meta["enable_fp_fusion"] = False
    if q.is_cuda and q.device.index != torch.cuda.current_device():  # Triton launches on the current device
        with torch.cuda.device(q.device):
            rope_kernel[(b * length,)](*args, **meta)
    else:
        rope_kernel[(b * length,)](*args, **meta)
    return oq, ok


def _fused(original):
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if q.is_cuda and supported(q, k, cos, sin, unsqueeze_dim):
            from quant.kernels import cuda

            if (apply_rotary_pos_emb.cuda_launch and cuda.layer_kernels_on(q.device)
                    and cuda.rope_takes(q, k, cos, sin)):  # one C++ launch (csrc/)
                return cuda.rope(q, k, cos, sin)
            return rope(q, k, cos, sin)
        return original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    apply_rotary_pos_emb.oscar_original = original
    apply_rotary_pos_emb.cuda_launch = True
    apply_rotary_pos_emb.__doc__ = ("quant.kernels.cuda.rope or triton_rope on CUDA, else transformers' own "
                                     "(oscar_original).")
    return apply_rotary_pos_emb


def fuse_rotary(model: torch.nn.Module, cuda_launch: bool = True) -> list[str]:
    """Route the RoPE of `model`'s allow-listed transformers modules through `rope` on CUDA.

    The modeling module's `apply_rotary_pos_emb` is replaced by a wrapper that calls the kernel for CUDA inputs it
    supports and the original otherwise, so every model of that family in the process gets it: the kernel gives
    transformers' bits, so the replacement is invisible except in speed. Idempotent; `cuda_launch` (the last call's
    applies to the family) launches the CUDA kernel instead where `quant.kernels.cuda.layer_kernels_on`. Returns the
    modules patched now (those already patched are not listed)."""
    patched = []
    for name in sorted({type(m).__module__ for m in model.modules()}):
        family = name.rpartition(".modeling_")[2]
        mod = sys.modules.get(name)
        if (name != f"transformers.models.{family}.modeling_{family}" or family not in ALLOWED
                or not callable(getattr(mod, "apply_rotary_pos_emb", None))):
            continue
        if not hasattr(mod.apply_rotary_pos_emb, "oscar_original"):
            mod.apply_rotary_pos_emb = _fused(mod.apply_rotary_pos_emb)
            patched.append(name)
        mod.apply_rotary_pos_emb.cuda_launch = cuda_launch
    return patched
