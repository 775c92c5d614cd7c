"""Triton split-KV decode attention over an OScaR packed cache (quant.packed.PackedKV layout).

One program per (split, batch * KV head). The query heads sharing a KV head (GQA) and the Lq query
tokens (speculative decoding) form the M rows of one tensor-core tile, so every loaded byte of codes
serves all of them. Quantized keys hold K_unit = (K @ Hd) / n_t, so for a quantized token j

    s_j = scaling * n_j * (q @ Hd) . (code_j * scale_g + zero_g)

and the values are V @ Hd: the quantized part accumulates P @ V_hat in the rotated basis. The last
program of each row handles the full-precision residual window (s_r = scaling * q . k_r, causal among
the Lq new tokens). A combine kernel merges the splits by log-sum-exp and rotates the quantized part
back: out = (O_q @ Hd + O_r) / L.
"""
from __future__ import annotations

import triton
import triton.language as tl

NEG_INIT = tl.constexpr(-1.0e30)  # finite running-max start: fully masked blocks then give exp(-inf) = 0, never NaN
LOG2E = 1.4426950408889634
# Dots of fp32 operands (the window, the rotation back) on TF32 tensor cores. The window's q and k hold bf16 (or fp16)
# values, which TF32 carries exactly (fp16's last mantissa bit aside); P and the merged output lose bits below 2^-11,
# under the bf16 output's 2^-9. "ieee" runs on the FMA units: the merge's 16 x 128 x 128 rotation alone took ~155 us a
# step on the H100 (run 88), and Triton's "tf32x3" compiled too slowly for the GPU tests (run 89).
PRECISE = tl.constexpr("tf32")


@triton.jit
def _unpack_tokens(words, ROWS: tl.constexpr, D: tl.constexpr):
    """int32 [ROWS, D] words (16 tokens each) -> int32 codes [ROWS * 16, D]; token i at bits 2i."""
    shifts = (tl.arange(0, 16) * 2)[None, :, None]
    codes = (words[:, None, :] >> shifts) & 3
    return tl.reshape(codes, (ROWS * 16, D))


@triton.jit
def _unpack_channels(words, ROWS: tl.constexpr, D: tl.constexpr):
    """int32 [ROWS, D // 16] words (16 channels each) -> int32 codes [ROWS, D]."""
    shifts = (tl.arange(0, 16) * 2)[None, None, :]
    codes = (words[:, :, None] >> shifts) & 3
    return tl.reshape(codes, (ROWS, D))


@triton.jit
def _quantized_block(qr, kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr, norm_ptr, t0, kv_len, scale_log2,
                     BLOCK_T: tl.constexpr, D: tl.constexpr):
    """Scores [M, BLOCK_T] (log2 units, masked) and dequantized V [BLOCK_T, D] fp16 of one block.

    Pointers are at (b, h, token 0). Keys: codes [T/16, D], scale/zero [T/32, D].
    Values: codes [T, D/16], scale/zero [T, D/32]. Norms fp32 [T].
    """
    d = tl.arange(0, D)
    # Loads past kv_len are masked to 0: they may lie past the stored tokens (or be another head's), and
    # a masked score times a garbage (inf / NaN) value would still poison the sum.
    rows = t0 // 16 + tl.arange(0, BLOCK_T // 16)
    kw = tl.load(kc_ptr + rows[:, None] * D + d[None, :], mask=(rows * 16 < kv_len)[:, None], other=0)
    grp = t0 // 32 + tl.arange(0, BLOCK_T // 32)
    g = grp[:, None] * D + d[None, :]
    gok = (grp * 32 < kv_len)[:, None]
    ks = tl.load(ks_ptr + g, mask=gok, other=0.0).to(tl.float32)
    kz = tl.load(kz_ptr + g, mask=gok, other=0.0).to(tl.float32)
    kcodes = tl.reshape(_unpack_tokens(kw, BLOCK_T // 16, D), (BLOCK_T // 32, 32, D)).to(tl.float32)
    k = tl.reshape(kcodes * ks[:, None, :] + kz[:, None, :], (BLOCK_T, D)).to(tl.float16)
    t = t0 + tl.arange(0, BLOCK_T)
    tok = t < kv_len
    n = tl.load(norm_ptr + t, mask=tok, other=0.0)
    s = tl.dot(qr, tl.trans(k)) * (n * scale_log2)[None, :]
    s = tl.where(tok[None, :], s, float("-inf"))

    vw = tl.load(vc_ptr + t[:, None] * (D // 16) + tl.arange(0, D // 16)[None, :], mask=tok[:, None], other=0)
    gv = t[:, None] * (D // 32) + tl.arange(0, D // 32)[None, :]
    vs = tl.load(vs_ptr + gv, mask=tok[:, None], other=0.0).to(tl.float32)
    vz = tl.load(vz_ptr + gv, mask=tok[:, None], other=0.0).to(tl.float32)
    vcodes = tl.reshape(_unpack_channels(vw, BLOCK_T, D), (BLOCK_T, D // 32, 32)).to(tl.float32)
    v = tl.reshape(vcodes * vs[:, :, None] + vz[:, :, None], (BLOCK_T, D)).to(tl.float16)
    return s, v


@triton.jit
def _online_update(s, v, m, l, acc):
    """One flash-attention step in base 2: s [M, N] log2-scaled scores, v [N, D]."""
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, 1)
    if v.dtype == tl.float32:
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISE)
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l, acc


@triton.jit
def decode_split_kernel(
    Q, QR, KC, KS, KZ, VC, VS, VZ, NORM, KR, VR, KV_LEN, RES_LEN, PO, PML,
    T, Tr, num_splits, split_tokens, scale_log2,
    stride_rb, stride_rh, stride_rt, stride_vb, stride_vh, stride_vt,
    HKV: tl.constexpr, GROUP: tl.constexpr, LQ: tl.constexpr, M: tl.constexpr, D: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """Partial attention of one split. Q, QR: [B, Hq, LQ, D] fp16 (QR = Q @ Hd).

    Writes PO[b, h, split] = unnormalized output [M, D] fp32 and PML[b, h, split] = (m, l) [2, M]
    (row max in log2 units, sum of exp2). Row r of M is query token r // GROUP of head h*GROUP + r % GROUP.
    """
    split = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // HKV
    h = bh % HKV
    r = tl.arange(0, M)
    row_ok = r < GROUP * LQ
    q_off = ((b * HKV + h) * GROUP + r % GROUP) * LQ * D + (r // GROUP) * D
    d = tl.arange(0, D)
    m = tl.full((M,), NEG_INIT, tl.float32)
    l = tl.zeros((M,), tl.float32)
    acc = tl.zeros((M, D), tl.float32)
    if split < num_splits:
        qr = tl.load(QR + q_off[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
        kv_len = tl.load(KV_LEN + b)
        start = split * split_tokens
        end = tl.minimum(start + split_tokens, kv_len)
        kbase = (b * HKV + h).to(tl.int64) * T
        for t0 in range(start, end, BLOCK_T):
            s, v = _quantized_block(qr, KC + kbase // 16 * D, KS + kbase // 32 * D, KZ + kbase // 32 * D,
                                    VC + kbase * (D // 16), VS + kbase * (D // 32), VZ + kbase * (D // 32),
                                    NORM + b.to(tl.int64) * T, t0, kv_len, scale_log2, BLOCK_T, D)
            m, l, acc = _online_update(s, v, m, l, acc)
    else:
        q = tl.load(Q + q_off[:, None] + d[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
        res_len = tl.load(RES_LEN + b)
        # Query token i sees residual positions < res_len - LQ + 1 + i (the new tokens are the last LQ).
        limit = res_len - LQ + 1 + r // GROUP
        kr_base = KR + b.to(tl.int64) * stride_rb + h * stride_rh
        vr_base = VR + b.to(tl.int64) * stride_vb + h * stride_vh
        for t0 in range(0, res_len, BLOCK_R):
            t = t0 + tl.arange(0, BLOCK_R)
            ok = t < res_len
            # fp32 operands (TF32 products, exact for bf16 values) for the <= ~128-token window: bf16 dots are wrong
            # under the Triton interpreter (3.9), which CI runs.
            k = tl.load(kr_base + t[:, None] * stride_rt + d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
            v = tl.load(vr_base + t[:, None] * stride_vt + d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISE) * scale_log2
            s = tl.where(t[None, :] < limit[:, None], s, float("-inf"))
            m, l, acc = _online_update(s, v, m, l, acc)
    out = (bh * (num_splits + 1) + split).to(tl.int64)
    tl.store(PO + out * M * D + r[:, None] * D + d[None, :], acc)
    tl.store(PML + out * 2 * M + r, m)
    tl.store(PML + out * 2 * M + M + r, l)


@triton.jit
def combine_kernel(PO, PML, HD, OUT, num_splits,
                   HKV: tl.constexpr, GROUP: tl.constexpr, LQ: tl.constexpr, M: tl.constexpr, D: tl.constexpr,
                   ROTATE_OUT: tl.constexpr):
    """Merge the splits of one (b, h) by log-sum-exp; out = (O_q @ Hd + O_r) / L into OUT [B, Hq, LQ, D]
    (O_q as it is without ROTATE_OUT: the model's weights carry V's rotation)."""
    bh = tl.program_id(0)
    r = tl.arange(0, M)
    d = tl.arange(0, D)
    base = bh.to(tl.int64) * (num_splits + 1)
    m_tot = tl.full((M,), NEG_INIT, tl.float32)
    for s in range(0, num_splits + 1):
        m_tot = tl.maximum(m_tot, tl.load(PML + (base + s) * 2 * M + r))
    l_tot = tl.zeros((M,), tl.float32)
    o_q = tl.zeros((M, D), tl.float32)
    for s in range(0, num_splits):
        w = tl.exp2(tl.load(PML + (base + s) * 2 * M + r) - m_tot)
        l_tot += w * tl.load(PML + (base + s) * 2 * M + M + r)
        o_q += w[:, None] * tl.load(PO + (base + s) * M * D + r[:, None] * D + d[None, :])
    w = tl.exp2(tl.load(PML + (base + num_splits) * 2 * M + r) - m_tot)
    l_tot += w * tl.load(PML + (base + num_splits) * 2 * M + M + r)
    o_r = w[:, None] * tl.load(PO + (base + num_splits) * M * D + r[:, None] * D + d[None, :])
    if ROTATE_OUT:
        hd = tl.load(HD + d[:, None] * D + d[None, :])
        o_q = tl.dot(o_q, hd, input_precision=PRECISE)
    out = (o_q + o_r) / l_tot[:, None]
    b = bh // HKV
    h = bh % HKV
    o_off = ((b * HKV + h) * GROUP + r % GROUP) * LQ * D + (r // GROUP) * D
    tl.store(OUT + o_off[:, None] + d[None, :], out.to(OUT.dtype.element_ty), mask=(r < GROUP * LQ)[:, None])


def decode_attention(query, kv, scaling: float, kv_lens=None, res_lens=None, block_t: int = 64,
                     split_tokens: int | None = None, num_warps: int = 4, num_stages: int | None = None,
                     waves: float = 3):
    """OScaR decode attention with Triton. query [B, Hq, Lq, D] -> out [B, Hq, Lq, D] (query dtype).

    kv: quant.packed.PackedKV. kv_lens / res_lens: valid quantized / residual tokens per sequence
    (default: all stored). split_tokens: tokens per split (default: fill ~`waves` waves of the device).
    block_t, num_warps, num_stages (Triton's software pipelining; None: its default): the launch's tuning.
    """
    import torch

    from quant.kernels.common import choose_split, num_sms, padded_rows, prepare_decode

    x = prepare_decode(query, kv, kv_lens, res_lens)
    m = padded_rows(x.group, x.lq)
    rows = x.batch * x.kv_heads
    if split_tokens is None:
        split_tokens, splits = choose_split(x.tokens, rows, block_t, num_sms(query.device), waves)
    else:
        if split_tokens % block_t:
            raise ValueError(f"split_tokens ({split_tokens}) must be a multiple of block_t ({block_t})")
        splits = -(-x.tokens // split_tokens)
    dev = query.device
    po = torch.empty(rows, splits + 1, m, x.head_dim, dtype=torch.float32, device=dev)
    pml = torch.empty(rows, splits + 1, 2, m, dtype=torch.float32, device=dev)
    sl2 = float(scaling) * LOG2E
    decode_split_kernel[(splits + 1, rows)](
        x.q, x.qr, x.kc, x.ks, x.kz, x.vc, x.vs, x.vz, x.norms, x.k_res, x.v_res, x.kv_lens, x.res_lens, po, pml,
        x.tokens, x.residual, splits, split_tokens, sl2,
        x.k_res.stride(0), x.k_res.stride(1), x.k_res.stride(2), x.v_res.stride(0), x.v_res.stride(1),
        x.v_res.stride(2), HKV=x.kv_heads, GROUP=x.group, LQ=x.lq, M=m, D=x.head_dim, BLOCK_T=block_t,
        BLOCK_R=32, num_warps=num_warps, **({} if num_stages is None else {"num_stages": num_stages}))
    out = torch.empty(query.shape, dtype=query.dtype, device=dev)
    combine_kernel[(rows,)](po, pml, x.hd, out, splits, HKV=x.kv_heads, GROUP=x.group, LQ=x.lq, M=m,
                            D=x.head_dim, ROTATE_OUT=kv.rotate_out, num_warps=4)
    return out
