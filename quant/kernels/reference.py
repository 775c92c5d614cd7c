"""Oracles the kernels are tested against: the PackedKV attention formula in float64 and in bf16.

PackedKV (quant/packed.py), per query head (GQA maps it to its KV head h = head // group):
    s_j = scaling * ((q @ Hd) . k_hat_j) * n_j      quantized j < kv_len
    s_r = scaling * q . k_res_r                      residual r < res_len (causal among the Lq new tokens)
    out = softmax(s) @ [v_hat @ Hd ; v_res]
`attention_f64` evaluates exactly that in float64 (the truth); `attention_bf16` is the same function as
a plain bf16 torch implementation would compute it (the error budget: a kernel may be at most 2x as far
from the truth as this one, FlashAttention's rule); `attention_f32` computes it in float32 and rounds the output
to the query's dtype (the tighter budget: what any kernel with that output dtype meets at best).
"""

from __future__ import annotations

import torch

from quant.packed import PackedKV


def _lens(lens, default: int, batch: int) -> list[int]:
    if lens is None:
        return [default] * batch
    return [int(x) for x in torch.as_tensor(lens).reshape(-1).tolist()]


def dequantized_kv(kv: PackedKV, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of the quantized part in the model basis: (K_unit_hat * n) @ Hd, V_hat @ Hd, [B, Hkv, T, D]."""
    k = kv.k.dequantize().to(dtype)
    if kv.norms is not None:
        k = k * kv.norms.to(dtype)[:, None, :, None]
    v = kv.v.dequantize().to(dtype)
    if kv.hadamard is not None:
        hd = kv.hadamard.to(dtype)
        k = k @ hd
        v = v @ hd if kv.values_rotated else v
    return k, v


def _attention(query, k_all, v_all, scaling, kv_lens, res_lens, t, dtype, softmax_dtype):
    """Masked attention per sequence; k_all/v_all [B, Hkv, T + Tr, D] with the quantized part first."""
    b, hq, lq, d = query.shape
    hkv = k_all.shape[1]
    out = torch.empty(b, hq, lq, d, dtype=dtype)
    for i in range(b):
        keep = list(range(kv_lens[i])) + list(range(t, t + res_lens[i]))
        k = k_all[i, :, keep].repeat_interleave(hq // hkv, 0)  # [Hq, L, D]
        v = v_all[i, :, keep].repeat_interleave(hq // hkv, 0)
        s = (query[i].to(dtype) @ k.transpose(-1, -2)) * scaling  # [Hq, Lq, L]
        # New token a (of Lq) sees residual positions < res_len - Lq + 1 + a.
        pos = torch.arange(len(keep)) - kv_lens[i]
        limit = res_lens[i] - lq + 1 + torch.arange(lq)
        s = s.masked_fill((pos[None, :] >= limit[:, None])[None], float("-inf"))
        p = torch.softmax(s.to(softmax_dtype), -1).to(dtype)
        out[i] = p @ v
    return out


def _attention_in(
    dtype: torch.dtype,
    query: torch.Tensor,
    kv: PackedKV,
    scaling: float,
    kv_lens,
    res_lens,
    softmax: torch.dtype | None = None,
):
    """The PackedKV formula on the CPU with K/V (dequantized in float32 at least), query and matmuls in `dtype` and
    the softmax in `softmax` (default: `dtype`)."""
    b, t = query.shape[0], kv.num_quantized
    k_res, v_res = kv.k_res.cpu().to(dtype), kv.v_res.cpu().to(dtype)
    if t:
        kq, vq = dequantized_kv(kv, dtype if dtype in (torch.float32, torch.float64) else torch.float32)
        k_res, v_res = torch.cat([kq.cpu().to(dtype), k_res], 2), torch.cat([vq.cpu().to(dtype), v_res], 2)
    return _attention(
        query.cpu().to(dtype),
        k_res,
        v_res,
        scaling,
        _lens(kv_lens, t, b),
        _lens(res_lens, kv.k_res.shape[2], b),
        t,
        dtype,
        softmax or dtype,
    )


def attention_f64(query: torch.Tensor, kv: PackedKV, scaling: float, kv_lens=None, res_lens=None) -> torch.Tensor:
    """The PackedKV formula in float64 on the CPU. query [B, Hq, Lq, D] -> [B, Hq, Lq, D] float64."""
    return _attention_in(torch.float64, query, kv, scaling, kv_lens, res_lens)


def attention_bf16(query: torch.Tensor, kv: PackedKV, scaling: float, kv_lens=None, res_lens=None) -> torch.Tensor:
    """The same attention as a bf16 torch implementation computes it: bf16 K/V and matmuls, fp32 softmax."""
    return _attention_in(torch.bfloat16, query, kv, scaling, kv_lens, res_lens, softmax=torch.float32)


def attention_f32(query: torch.Tensor, kv: PackedKV, scaling: float, kv_lens=None, res_lens=None) -> torch.Tensor:
    """The formula in float32 (K/V dequantized in float32, float32 matmuls and softmax), the output rounded to the
    query's dtype: the same-precision reference of FlashAttention's rule. query [B, Hq, Lq, D] -> [B, Hq, Lq, D]."""
    return _attention_in(torch.float32, query, kv, scaling, kv_lens, res_lens).to(query.dtype)


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64."""
    x, ref = x.cpu().double(), ref.cpu().double()
    return float((x - ref).norm() / ref.norm())


def random_packed_kv(
    b: int,
    hkv: int,
    t: int,
    tr: int,
    d: int,
    seed: int,
    rotate: bool = True,
    token_norm: bool = True,
    device="cpu",
    res_dtype=torch.bfloat16,
    rotate_values: bool = True,
) -> PackedKV:
    """A PackedKV packed from fresh random K/V (keys with per-channel outlier scales, as real keys have) as OScaR's
    default config packs them (INT2, groups of 32, float zero point; quant.methods.oscar.pack_block: on a CUDA device
    the fused pack of the device's default backend, else quant.packed.pack_reference), plus a random residual window
    of tr tokens. rotate_values=False: V packed as it is (the model's weights carry its rotation, quant/fold.py)."""
    from quant.kernels import pack_kv
    from quant.kernels.options import default_backend
    from quant.packed import pack_reference
    from quant.primitives import hadamard

    g = torch.Generator().manual_seed(seed)
    k = torch.randn(b, hkv, t, d, generator=g) * (1 + 4 * torch.rand(d, generator=g))
    v = torch.randn(b, hkv, t, d, generator=g)
    rot = hadamard(d) if rotate else None
    k, v = k.to(device), v.to(device)
    rot_dev = rot.to(device) if rot is not None else None
    backend = default_backend(k.device) if k.is_cuda else "torch"
    if backend != "torch":  # what pack_block does on a CUDA device: the fused pack writes the same layout
        kq, vq, n = pack_kv(
            k,
            v,
            rotate=rotate,
            token_norm=token_norm,
            backend=backend,
            rotate_values=rotate and rotate_values,
            zero_point="float",
        )
    else:
        kq, vq, n = pack_reference(k, v, 2, 32, rot_dev, token_norm, "float", None, rotate_values)
    k_res = torch.randn(b, hkv, tr, d, generator=g).to(device=device, dtype=res_dtype)
    v_res = torch.randn(b, hkv, tr, d, generator=g).to(device=device, dtype=res_dtype)
    return PackedKV(kq, vq, n, k_res, v_res, rot_dev, rotate_values)
