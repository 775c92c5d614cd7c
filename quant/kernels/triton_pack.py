"""Triton append/pack: Hadamard rotation, OScaR token norm, INT2 quantization and packing, fused.

One program per (sequence b, 32-token group). For K [B, H, T, D] and V [B, H, T, D] (T a multiple of 32):
    K_rot = K @ Hd, n_t = ||K_rot[b, :, t, :]|| over all heads and channels (n <= 0 -> 1)
    keys:   per channel over the 32 tokens: s = fp16((max - min) / 3), z = fp16(min) of K_rot / n (integer zero
            point: z = fp16(-s * rint(-min / s))),
            code = clamp(rint((x - z) / s), 0, 3), 16 tokens per int32 word (token i at bits 2i)
    values: per token over 32 channels of V_rot = V @ Hd, 16 channels per word
exactly as quant.primitives.asym_quantize + pack_codes define them (fp16 scale/zero rounded before the
codes; division rounded to nearest). Hd = H_pm1 / sqrt(D) with H_pm1 the +-1 Sylvester matrix: the
product with +-1 entries is exact on tensor cores (bf16/fp16 inputs, fp32 accumulation), so the
rotation costs a dot, not a float32 matmul.
"""

from __future__ import annotations

import math
import os

import triton
import triton.language as tl

from quant.primitives import hadamard, tensor_cache


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _rotate(x_ptr, t, d, hpm, inv_sqrt_d, ROTATE: tl.constexpr, EXACT: tl.constexpr):
    """Load [32, D] rows of one head and rotate them: fp32 [32, D]."""
    x = tl.load(x_ptr + t[:, None] + d[None, :])
    if ROTATE:
        if EXACT:  # float32 inputs, and the interpreter (whose bf16 dot is wrong): exact fp32 products
            x = tl.dot(x.to(tl.float32), hpm.to(tl.float32), input_precision="ieee") * inv_sqrt_d
        else:
            x = tl.dot(x, hpm.to(x.dtype)) * inv_sqrt_d
    return x.to(tl.float32)


@triton.jit
def _rint(y):
    """Round half to even (torch.round), exact for |y| < 2^22; written out because the interpreter
    has no libdevice.rint. y - floor(y) is exact there, so the tie test is exact too."""
    r = tl.math.floor(y)
    f = y - r
    odd = r - 2.0 * tl.math.floor(r * 0.5)
    return r + tl.where((f > 0.5) | ((f == 0.5) & (odd == 1.0)), 1.0, 0.0)


@triton.jit
def _quant(x, lo, hi, INTEGER: tl.constexpr):
    """asym_quantize given the group's min/max (fp32) -> (int32 codes, fp16 scale, fp16 zero); INTEGER: the integer
    zero point's offset -s * rint(-lo / s) (quant.primitives.integer_zero) instead of the minimum."""
    # round to fp16 first, then guard: 2**-24 (quant.primitives.MIN_SCALE) is the smallest positive fp16
    scale = tl.maximum(
        tl.math.div_rn(hi - lo, tl.full(hi.shape, 3.0, tl.float32)).to(tl.float16).to(tl.float32),
        5.9604644775390625e-08,
    ).to(tl.float16)
    sf = scale.to(tl.float32)
    if INTEGER:
        zero = (-sf * _rint(tl.math.div_rn(-lo, sf))).to(tl.float16)
    else:
        zero = lo.to(tl.float16)
    # A scale that rounds to 0 in fp16 means a (near-)constant group: code 0 reproduces it.
    q = _rint(tl.math.div_rn(x - zero.to(tl.float32), tl.where(sf > 0, sf, 1.0)))
    q = tl.where(sf > 0, q, 0.0)
    return tl.minimum(tl.maximum(q, 0.0), 3.0).to(tl.int32), scale, zero


@triton.jit
def pack_kernel(
    K,
    V,
    HPM,
    KC,
    KS,
    KZ,
    VC,
    VS,
    VZ,
    NORM,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    T,
    inv_sqrt_d,
    H: tl.constexpr,
    D: tl.constexpr,
    ROTATE: tl.constexpr,
    TOKEN_NORM: tl.constexpr,
    EXACT: tl.constexpr,
    ROTATE_V: tl.constexpr,
    INTEGER: tl.constexpr,
):
    """Pack tokens [32 g, 32 g + 32) of sequence b for every head (layout: quant.packed)."""
    g = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    tt = g * 32 + tl.arange(0, 32)
    d = tl.arange(0, D)
    hpm = tl.load(HPM + d[:, None] * D + d[None, :])  # +-1 entries (unused when ROTATE is off)
    n = tl.full((32,), 1.0, tl.float32)
    if TOKEN_NORM:
        ss = tl.zeros((32,), tl.float32)
        for h in range(H):
            kr = _rotate(K + b * stride_kb + h * stride_kh, tt * stride_kt, d, hpm, inv_sqrt_d, ROTATE, EXACT)
            ss += tl.sum(kr * kr, 1)
        n = tl.sqrt_rn(ss)
        n = tl.where(n > 0, n, 1.0)
        tl.store(NORM + b * T + tt, n)
    shifts = (tl.arange(0, 16) * 2)[None, :, None]
    for h in range(H):
        bh = b * H + h
        kr = _rotate(K + b * stride_kb + h * stride_kh, tt * stride_kt, d, hpm, inv_sqrt_d, ROTATE, EXACT)
        ku = tl.math.div_rn(kr, n[:, None]) if TOKEN_NORM else kr
        codes, s, z = _quant(ku, tl.min(ku, 0)[None, :], tl.max(ku, 0)[None, :], INTEGER)
        words = tl.reduce(tl.reshape(codes, (2, 16, D)) << shifts, 1, _or)  # [2, D]
        tl.store(KC + (bh * (T // 16) + g * 2 + tl.arange(0, 2))[:, None] * D + d[None, :], words)
        tl.store(KS + (bh * (T // 32) + g) * D + d[None, :], s)
        tl.store(KZ + (bh * (T // 32) + g) * D + d[None, :], z)

        vr = tl.reshape(
            _rotate(V + b * stride_vb + h * stride_vh, tt * stride_vt, d, hpm, inv_sqrt_d, ROTATE_V, EXACT),
            (32, D // 32, 32),
        )
        codes, s, z = _quant(vr, tl.min(vr, 2)[:, :, None], tl.max(vr, 2)[:, :, None], INTEGER)
        words = tl.reduce(tl.reshape(codes, (32, D // 16, 16)) << (tl.arange(0, 16) * 2)[None, None, :], 2, _or)
        tok = bh * T + tt
        tl.store(VC + tok[:, None] * (D // 16) + tl.arange(0, D // 16)[None, :], words)
        gv = tok[:, None] * (D // 32) + tl.arange(0, D // 32)[None, :]
        tl.store(VS + gv, tl.reshape(s, (32, D // 32)))
        tl.store(VZ + gv, tl.reshape(z, (32, D // 32)))


def pack_kv(
    k, v, rotate: bool = True, token_norm: bool = True, rotate_values: bool | None = None, zero_point: str = "float"
):
    """Quantize and pack a block of K, V [B, H, T, D] (T a multiple of 32, D 64 or 128) for OScaR.

    Returns (k_q QTensor axis -2 of K_unit, v_q QTensor axis -1 of V_rot, norms fp32 [B, T] or None),
    the same triple as quant.methods.oscar.pack_block. rotate_values (default: rotate) = False packs V as it
    comes (the model's weights carry its rotation, quant/fold.py). zero_point: "float" or "integer"
    (quant.primitives.asym_quantize).
    """
    import torch

    from quant.packed import QTensor

    _check_block(k, v)
    if k.is_cuda and k.device.index != torch.cuda.current_device():  # Triton launches on the current device
        with torch.cuda.device(k.device):  # a layer of a model spread over GPUs (device_map)
            return pack_kv(k, v, rotate, token_norm, rotate_values, zero_point)
    b, h, t, d = k.shape
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        k, v = k.contiguous(), v.contiguous()
    dev = k.device
    exact = k.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1" or dev.type != "cuda"
    hpm = _hadamard_pm1(d, dev, torch.float32 if exact else k.dtype)
    i32, f16 = dict(dtype=torch.int32, device=dev), dict(dtype=torch.float16, device=dev)
    kc = torch.empty(b, h, t // 16, d, **i32)
    ks, kz = torch.empty(b, h, t // 32, d, **f16), torch.empty(b, h, t // 32, d, **f16)
    vc = torch.empty(b, h, t, d // 16, **i32)
    vs, vz = torch.empty(b, h, t, d // 32, **f16), torch.empty(b, h, t, d // 32, **f16)
    norms = torch.empty(b, t, dtype=torch.float32, device=dev)
    pack_kernel[(t // 32, b)](
        k,
        v,
        hpm,
        kc,
        ks,
        kz,
        vc,
        vs,
        vz,
        norms,
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        t,
        1.0 / math.sqrt(d),
        H=h,
        D=d,
        ROTATE=rotate,
        TOKEN_NORM=token_norm,
        EXACT=exact,
        ROTATE_V=rotate if rotate_values is None else rotate_values,
        INTEGER=zero_point == "integer",
        num_warps=4,
    )
    return (QTensor(kc, ks, kz, 2, 32, -2), QTensor(vc, vs, vz, 2, 32, -1), norms if token_norm else None)


@tensor_cache(maxsize=16)
def _hadamard_pm1(d: int, device, dtype):
    """The +-1 Sylvester matrix H_d * sqrt(d), exact, once per (d, device, dtype): a pack of every flush reads it."""
    return (hadamard(d, device=device) * math.sqrt(d)).round().to(dtype)


def _check_block(k, v) -> None:
    if k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"K and V must both be [B, H, T, D], got {tuple(k.shape)} and {tuple(v.shape)}")
    t, d = k.shape[2], k.shape[3]
    if t % 32:
        raise ValueError(f"a packed block needs a multiple of 32 tokens, got {t}: keep the rest in the window")
    if d not in (64, 128):
        raise ValueError(f"head_dim {d} is not compiled; supported: 64, 128")
