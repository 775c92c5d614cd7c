"""The Triton decode's device code: split-KV decode attention over an OScaR packed cache in the "tl" code order
(quant/packed.py). The launch and its plan: quant/kernels/triton_decode.py.

One program per (split, batch * KV head). The query heads sharing a KV head (GQA) and the Lq query
tokens (speculative decoding) form the M rows of one tensor-core tile, so every loaded byte of codes
serves all of them. Quantized keys hold K_unit = (K @ Hd) / n_t, so for a quantized token j

    s_j = scaling * n_j * (q @ Hd) . (code_j * scale_g + zero_g)

and the values are V @ Hd (or V as it comes when the model's weights carry V's rotation): the quantized part
accumulates P @ V_hat. The last program of each row handles the full-precision residual window (s_r = scaling *
q . k_r, causal among the Lq new tokens). A combine kernel, one program per query row, merges the splits by
log-sum-exp and rotates the quantized part back: out = (O_q @ Hd + O_r) / L.

The loop (per 128-token block, transposed products S^T = K Q^T and O^T = V^T P^T on wgmma, the tokens in M):
- the dequantized K [128, D] and V^T [D, 128] tiles are built directly in the registers of the wgmma A operand:
  the tl code order puts each thread's codes and scales in contiguous words (8- and 16-byte loads), and Triton
  carries the dot-operand layout back through the joins and reshapes to the loads (no shared-memory round trip);
- codes become fp16 in inline PTX, 3 instructions per fp16 pair with the FMA (_codes: lop3 of the pair into the
  mantissas of 2^E + c, sub.f16x2 2^E, exact; the interpreter, which cannot run PTX, takes _codes_plain);
- (code * scale + zero) is one fp16 FMA: the dequantized values are those of quant.primitives, one rounding;
- the split's whole blocks run without masks, its last partial block as one masked step after the loop;
- V^T is built after the softmax's cross-warp max, and the row sums are reduced once after the loop.
Together these leave the loop well under half the instructions of a loop over the natural code order, and about
twice as fast at long contexts (docs/PERFORMANCE.md, The Triton decode).
"""

from __future__ import annotations

import triton
import triton.language as tl

NEG_INIT = tl.constexpr(-1.0e30)  # finite running-max start: fully masked blocks then give exp(-inf) = 0, never NaN
LOG2E = 1.4426950408889634
BLOCK_T = 128  # tokens per step of a split's loop: the tl order's block
# Dots of fp32 operands (the window, the rotation back) on TF32 tensor cores. The window's q and k hold bf16 (or fp16)
# values, which TF32 carries exactly (fp16's last mantissa bit aside); P and the merged output lose bits below 2^-11,
# under the bf16 output's 2^-9. "ieee" runs on the FMA units, too slow for the merge's 16 x 128 x 128 rotation
# at every step, and Triton's "tf32x3" compiles too slowly for the GPU tests.
PRECISE = tl.constexpr("tf32")


@triton.jit
def _slot(r, MT: tl.constexpr):
    """Tile row r of a 64 MT-row wgmma tile over 4 warps -> position: the rows of one warp are consecutive
    (quant.packed.tl_row)."""
    return 16 * MT * ((r // 16) % 4) + 16 * (r // 64) + r % 16


@triton.jit
def _codes_plain(words):
    """_codes without inline asm (the Triton interpreter cannot run PTX): the same values."""
    shifts = tl.arange(0, 8) * 2
    y = ((words[:, :, None] >> shifts[None, None, :]) & 0x00030003) | 0x64006400
    lo = y.to(tl.int16).to(tl.float16, bitcast=True)
    hi = (y >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    return tl.join(lo, hi) - 1024.0


@triton.jit
def _codes(words, ASM: tl.constexpr):
    """int32 [A, B] -> fp16 [A, B, 8, 2]: [a, b, j, h] = the code at bits 2j + 16h, exact.

    One inline-asm instance per fp16 pair (pack=1, two fp16 outputs joined): lop3 (w & mask_j) | e_j puts the pair's two
    codes in the mantissas of 2^E + c (E = 10 - 2j' at mantissa bit 2j', j' = j for j < 5, else j - 5 after one shift of
    the word by 10), then sub.f16x2 2^E (exact). No int16 truncations, no shifts for j < 5."""
    if not ASM:
        return _codes_plain(words)
    j = tl.arange(0, 8)[None, None, :]
    jp = tl.where(j < 5, j, j - 5)
    src = tl.where(j < 5, words[:, :, None], (words >> 10)[:, :, None])
    mask = 0x00030003 << (2 * jp)
    e = (25 - 2 * jp) << 10
    orc = e | (e << 16)
    lo, hi = tl.inline_asm_elementwise(
        "{ .reg .b32 t; lop3.b32 t, $2, $3, $4, 0xEA; sub.f16x2 t, t, $4; mov.b32 {$0, $1}, t; }",
        "=h,=h,r,r,r",
        [src, mask, orc],
        dtype=(tl.float16, tl.float16),
        is_pure=True,
        pack=1,
    )
    return tl.join(lo, hi)


@triton.jit
def _scores(
    qr,
    kc_ptr,
    ks_ptr,
    kz_ptr,
    norm_ptr,
    t0,
    kv_len,
    scale_log2,
    BLOCK_T: tl.constexpr,
    D: tl.constexpr,
    MASKED: tl.constexpr,
    ASM: tl.constexpr,
):
    """Scores S^T [128, M] (tile row r = token t0 + tau(r)) and V^T [D, 128] (row r = channel sigma(r), column =
    token tau(col)) of one 128-token block in the tl code order (quant.packed.tl_maps). Pointers at (b, h, token 0)."""
    r = tl.arange(0, BLOCK_T)
    tr = _slot(r, 2)
    kw = tl.load(kc_ptr + (t0 + tr)[:, None] * (D // 16) + tl.arange(0, D // 16)[None, :])
    kc = tl.reshape(
        tl.permute(tl.reshape(_codes(kw, ASM), (BLOCK_T, 4, D // 64, 8, 2)), (0, 2, 3, 1, 4)), (2, 4, 16, D)
    )
    g = (t0 // 32 + tl.arange(0, 4))[:, None] * D + tl.arange(0, D)[None, :]
    ks = tl.reshape(tl.permute(tl.reshape(tl.load(ks_ptr + g), (4, 4, D // 64, 8, 2)), (0, 2, 3, 1, 4)), (4, D))
    kz = tl.reshape(tl.permute(tl.reshape(tl.load(kz_ptr + g), (4, 4, D // 64, 8, 2)), (0, 2, 3, 1, 4)), (4, D))
    # explicit fma: one rounding whatever Triton's fp-fusion default (3.10 turns contraction off)
    k = tl.reshape(tl.fma(kc, ks[None, :, None, :], kz[None, :, None, :]), (BLOCK_T, D))
    # norms as [w, g, b, a] (row r = 64 b + 16 w + 8 a + g, token tau(r) = 32 w + 16 b + 8 a + g): a thread's four
    # rows are one contiguous run of the staged copy (one 16-byte shared load instead of four)
    nw = tl.arange(0, 4)[:, None, None, None] * 32 + tl.arange(0, 8)[None, :, None, None]
    n4 = tl.load(
        norm_ptr + t0 + nw + tl.arange(0, 2)[None, None, :, None] * 16 + tl.arange(0, 2)[None, None, None, :] * 8
    )
    n = tl.reshape(tl.permute(n4, (2, 0, 3, 1)), (BLOCK_T,))
    s = tl.dot(k, qr) * (n * scale_log2)[:, None]
    if MASKED:  # the split's last, partial block (tokens past kv_len: padding or another sequence's stale codes)
        s = tl.where((t0 + tr < kv_len)[:, None], s, float("-inf"))
    return s


@triton.jit
def _values(
    vc_ptr, vs_ptr, vz_ptr, t0, kv_len, BLOCK_T: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr, ASM: tl.constexpr
):
    """V^T [D, 128] of one block (row r = channel sigma(r), column = token tau(col)), tl code order."""
    G: tl.constexpr = D // 32
    blk = t0 // 128
    sv = _slot(tl.arange(0, D), D // 64)
    vw = tl.load(vc_ptr + blk * (D * 8) + sv[:, None] * 8 + tl.arange(0, 8)[None, :])
    vc = tl.reshape(tl.permute(tl.reshape(_codes(vw, ASM), (D, 4, 2, 8, 2)), (0, 2, 3, 1, 4)), (D, BLOCK_T))
    p = tl.arange(0, BLOCK_T)
    ptok = t0 + _slot(2 * (p // 32) + p % 2 + 8 * ((p % 32) // 2), 2)
    gv = blk * (G * BLOCK_T) + tl.arange(0, G)[:, None] * BLOCK_T + p[None, :]
    if MASKED:  # scales past kv_len may be garbage (inf / NaN): a zero probability times NaN is NaN
        vmask = (ptok < kv_len)[None, :]
        vs = tl.load(vs_ptr + gv, mask=vmask, other=0.0)
        vz = tl.load(vz_ptr + gv, mask=vmask, other=0.0)
    else:
        vs = tl.load(vs_ptr + gv)
        vz = tl.load(vz_ptr + gv)
    vs = tl.reshape(tl.permute(tl.reshape(vs, (G, 4, 2, 8, 2)), (0, 2, 3, 1, 4)), (G, BLOCK_T))
    vz = tl.reshape(tl.permute(tl.reshape(vz, (G, 4, 2, 8, 2)), (0, 2, 3, 1, 4)), (G, BLOCK_T))
    if D == 128:  # V^T rows (mt, w, i): group w
        v = tl.fma(tl.reshape(vc, (2, 4, 16, BLOCK_T)), vs[None, :, None, :], vz[None, :, None, :])
    else:  # D == 64, rows (w // 2, w % 2, i): group w // 2
        v = tl.fma(tl.reshape(vc, (2, 2, 16, BLOCK_T)), vs[:, None, None, :], vz[:, None, None, :])
    return tl.reshape(v, (D, BLOCK_T))


@triton.jit
def _block_step(
    qr,
    kc_ptr,
    ks_ptr,
    kz_ptr,
    vc_ptr,
    vs_ptr,
    vz_ptr,
    norm_ptr,
    t0,
    kv_len,
    scale_log2,
    m,
    l,
    acct,
    BLOCK_T: tl.constexpr,
    D: tl.constexpr,
    MASKED: tl.constexpr,
    ASM: tl.constexpr,
):
    """One block, transposed: S^T [N, M] (log2 units), then V^T [D, N] built only after the softmax's cross-warp max
    (so that ptxas dequantizes it straight into the wgmma A registers the score product has freed); l [N, M] holds
    per-row partial sums (summed over the tokens once, after the loop)."""
    s = _scores(qr, kc_ptr, ks_ptr, kz_ptr, norm_ptr, t0, kv_len, scale_log2, BLOCK_T, D, MASKED, ASM)
    m_new = tl.maximum(m, tl.max(s, 0))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[None, :])
    l = l * alpha[None, :] + p
    vt = _values(vc_ptr, vs_ptr, vz_ptr, t0, kv_len, BLOCK_T, D, MASKED, ASM)
    acct = acct * alpha[None, :] + tl.dot(vt, p.to(vt.dtype))
    return m_new, l, acct


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
def _query_t(Q, HD, q_off, row_ok, M: tl.constexpr, D: tl.constexpr, ROTATE: tl.constexpr):
    """Q^T [D, M] in fp16 for a quantized split's score products: the query rows at q_off, rotated by Hd (ROTATE)."""
    d = tl.arange(0, D)
    if ROTATE:  # QR = Q Hd, 32 channels of Q at a time (registers), each as two TF32 products: Hd's high part
        # (10 mantissa bits, TF32-exact) and the rest; Q's bf16 / fp16 values are TF32-exact. Q's rows in M, as in
        # the window's products (the transposed form, Hd^T Q^T, faulted on sm_90 under Triton 3.6 at D = 64).
        qacc = tl.zeros((M, D), tl.float32)
        for c in tl.static_range(0, D, 32):
            dc = c + tl.arange(0, 32)
            qc = tl.load(Q + q_off[:, None] + dc[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
            hdc = tl.load(HD + dc[:, None] * D + d[None, :])  # Hd's rows c..c+31
            hi = (hdc.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
            qacc += tl.dot(qc, hi, input_precision=PRECISE) + tl.dot(qc, hdc - hi, input_precision=PRECISE)
        qt = tl.trans(qacc)
    else:
        qt = tl.load(Q + q_off[None, :] + d[:, None], mask=row_ok[None, :], other=0.0).to(tl.float32)  # Q^T
    return qt.to(tl.float16)


@triton.jit
def _quantized_split(
    qr,
    KC,
    KS,
    KZ,
    VC,
    VS,
    VZ,
    NORM,
    kbase,
    nbase,
    start,
    end,
    kv_len,
    scale_log2,
    M: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    ASM: tl.constexpr,
):
    """(m, l, O) [M], [M], [M, D] of the packed tokens [start, end) of one (batch, KV head): its whole blocks without
    masks, then its last partial block as one masked step. kbase: the row's first token in the packed arrays
    ((b * HKV + h) * T), nbase: the sequence's in the norms (b * T)."""
    kc, vc = KC + kbase * (D // 16), VC + kbase * (D // 16)
    ks, kz = KS + kbase // 32 * D, KZ + kbase // 32 * D
    vs, vz = VS + kbase * (D // 32), VZ + kbase * (D // 32)
    m = tl.full((M,), NEG_INIT, tl.float32)
    acct = tl.zeros((D, M), tl.float32)
    l2 = tl.zeros((BLOCK_T, M), tl.float32)
    full = start + tl.maximum(end - start, 0) // BLOCK_T * BLOCK_T
    for t0 in range(start, full, BLOCK_T):
        m, l2, acct = _block_step(
            qr, kc, ks, kz, vc, vs, vz, NORM + nbase, t0, kv_len, scale_log2, m, l2, acct, BLOCK_T, D, False, ASM
        )
    if full < end:
        m, l2, acct = _block_step(
            qr, kc, ks, kz, vc, vs, vz, NORM + nbase, full, kv_len, scale_log2, m, l2, acct, BLOCK_T, D, True, ASM
        )
    return m, tl.sum(l2, 0), tl.trans(acct)


@triton.jit
def _window_split(
    Q,
    q_off,
    row_ok,
    kr_base,
    vr_base,
    stride_rt,
    stride_vt,
    res_len,
    qtok,
    scale_log2,
    LQ: tl.constexpr,
    M: tl.constexpr,
    D: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """(m, l, O) of the full-precision window of one (batch, KV head): res_len tokens at kr_base / vr_base, the query
    rows at q_off (query token qtok of each row). The Lq new tokens are the window's last: query token i sees
    positions < res_len - LQ + 1 + i."""
    d = tl.arange(0, D)
    m = tl.full((M,), NEG_INIT, tl.float32)
    l = tl.zeros((M,), tl.float32)
    acc = tl.zeros((M, D), tl.float32)
    q = tl.load(Q + q_off[:, None] + d[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    limit = res_len - LQ + 1 + qtok
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
    return m, l, acc


@triton.jit
def decode_split_kernel(
    Q,
    HD,
    KC,
    KS,
    KZ,
    VC,
    VS,
    VZ,
    NORM,
    KR,
    VR,
    KV_LEN,
    RES_LEN,
    PO,
    PML,
    T,
    Tr,
    num_splits,
    split_tokens,
    scale_log2,
    stride_rb,
    stride_rh,
    stride_rt,
    stride_vb,
    stride_vh,
    stride_vt,
    HKV: tl.constexpr,
    GROUP: tl.constexpr,
    LQ: tl.constexpr,
    M: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_R: tl.constexpr,
    ROTATE: tl.constexpr,
    ASM: tl.constexpr = True,
):
    """Partial attention of one split. Q: [B, Hq, LQ, D] (the window's dtype); HD: the fp32 [D, D] rotation of the
    keys (ROTATE: a quantized split rotates its query by it, QR = Q @ Hd, in fp32 then fp16).

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
    if split < num_splits:
        kv_len = tl.load(KV_LEN + b)
        start = split * split_tokens
        end = tl.minimum(start + split_tokens, kv_len)
        qr = _query_t(Q, HD, q_off, row_ok, M, D, ROTATE)
        kbase = (b * HKV + h).to(tl.int64) * T
        nbase = b.to(tl.int64) * T
        m, l, acc = _quantized_split(
            qr, KC, KS, KZ, VC, VS, VZ, NORM, kbase, nbase, start, end, kv_len, scale_log2, M, D, BLOCK_T, ASM
        )
    else:
        kr = KR + b.to(tl.int64) * stride_rb + h * stride_rh
        vr = VR + b.to(tl.int64) * stride_vb + h * stride_vh
        res_len = tl.load(RES_LEN + b)
        m, l, acc = _window_split(
            Q, q_off, row_ok, kr, vr, stride_rt, stride_vt, res_len, r // GROUP, scale_log2, LQ, M, D, BLOCK_R
        )
    out = (bh * (num_splits + 1) + split).to(tl.int64)
    # a quantized split's columns are in sigma's channel order (quant.packed.tl_maps)
    d = tl.arange(0, D)
    col = tl.where(split < num_splits, _slot(d, D // 64), d)
    tl.store(PO + out * M * D + r[:, None] * D + col[None, :], acc)
    tl.store(PML + out * 2 * M + r, m)
    tl.store(PML + out * 2 * M + M + r, l)


@triton.jit
def combine_kernel(
    PO,
    PML,
    HD,
    OUT,
    num_splits,
    HKV: tl.constexpr,
    GROUP: tl.constexpr,
    LQ: tl.constexpr,
    M: tl.constexpr,
    D: tl.constexpr,
    NS: tl.constexpr,
    ROTATE_OUT: tl.constexpr,
):
    """Merge the splits of one query row by log-sum-exp: program (b, h, r) for the GROUP * LQ real rows of M;
    out = (O_q @ Hd + O_r) / L into OUT [B, Hq, LQ, D] (O_q as it is without ROTATE_OUT: the model's weights carry
    V's rotation). Online over chunks of NS splits whose loads ([NS] of m and l, [NS, D] of O) are all in flight at
    once: one round of L2 latency per chunk. (One program per (b, h) looping over the splits one at a time pays a
    round per split, a large share of a batch-1 step of many splits: docs/PERFORMANCE.md, The Triton decode.)"""
    pid = tl.program_id(0)
    bh = pid // (GROUP * LQ)
    r = pid % (GROUP * LQ)
    d = tl.arange(0, D)
    c = tl.arange(0, NS)
    base = bh.to(tl.int64) * (num_splits + 1)
    m_q = tl.max(tl.full((NS,), NEG_INIT, tl.float32), 0)
    l_q = tl.sum(tl.zeros((NS,), tl.float32), 0)
    o_q = tl.zeros((D,), tl.float32)
    for s0 in range(0, num_splits, NS):
        sp = base + s0 + c
        ok = s0 + c < num_splits
        ms = tl.load(PML + sp * 2 * M + r, mask=ok, other=NEG_INIT)
        ls = tl.load(PML + sp * 2 * M + M + r, mask=ok, other=0.0)
        os_ = tl.load(PO + sp[:, None] * M * D + r * D + d[None, :], mask=ok[:, None], other=0.0)
        m_new = tl.maximum(m_q, tl.max(ms, 0))
        alpha = tl.exp2(m_q - m_new)
        w = tl.exp2(ms - m_new)
        l_q = l_q * alpha + tl.sum(w * ls, 0)
        o_q = o_q * alpha + tl.sum(w[:, None] * os_, 0)
        m_q = m_new
    win = base + num_splits
    m_r = tl.load(PML + win * 2 * M + r)
    l_r = tl.load(PML + win * 2 * M + M + r)
    o_r = tl.load(PO + win * M * D + r * D + d)
    m_tot = tl.maximum(m_q, m_r)
    w_q = tl.exp2(m_q - m_tot)
    w_r = tl.exp2(m_r - m_tot)
    if ROTATE_OUT:  # o_q @ Hd as row 0 of a 16-row tile (the tensor core's least M), TF32 as the old [M, D] product
        rows16 = tl.arange(0, 16)
        tile = tl.where((rows16 == 0)[:, None], o_q[None, :], 0.0)
        hd = tl.load(HD + d[:, None] * D + d[None, :])
        o_q = tl.sum(tl.dot(tile, hd, input_precision=PRECISE), 0)
    out = (w_q * o_q + w_r * o_r) / (w_q * l_q + w_r * l_r)
    b = bh // HKV
    h = bh % HKV
    o_off = ((b * HKV + h) * GROUP + r % GROUP) * LQ * D + (r // GROUP) * D
    tl.store(OUT + o_off + d, out.to(OUT.dtype.element_ty))
