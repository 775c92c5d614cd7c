"""Triton split-KV decode attention over an OScaR packed cache (quant.packed.PackedKV layout).

One program per (split, batch * KV head). The query heads sharing a KV head (GQA) and the Lq query
tokens (speculative decoding) form the M rows of one tensor-core tile, so every loaded byte of codes
serves all of them. Quantized keys hold K_unit = (K @ Hd) / n_t, so for a quantized token j

    s_j = scaling * n_j * (q @ Hd) . (code_j * scale_g + zero_g)

and the values are V @ Hd: the quantized part accumulates P @ V_hat in the rotated basis. The last
program of each row handles the full-precision residual window (s_r = scaling * q . k_r, causal among
the Lq new tokens). A combine kernel, one program per query row, merges the splits by log-sum-exp and
rotates the quantized part back: out = (O_q @ Hd + O_r) / L.

Dequantization (_fp16_pairs) makes fp16 codes without int -> float conversions: two codes of a word at once are
masked into the mantissas of an fp16 pair (1024 + c), then 1024 is subtracted and the scale and zero applied with
packed fp16 arithmetic (one rounding, as c * scale + zero in fp32 then rounded). The pairs come out in a fixed
permuted order inside each 16 tokens (keys) or 16 channels (values), which the kernel carries through (_perm16).
Products are transposed (S^T = K Q^T, O^T = V^T P^T) so that the block's tokens fill the tensor core's M.
Measured on an H100 (quant/kernels/NOTES.md, runs 91-98): Qwen3 1 x 128K 365.6 -> 166.4 us (cuDNN 193.9), 16 x 32K
571.2 (cuDNN 702.2), with the one-wave split plan (plan_splits) at batch 1 and the query rotated in the kernel.
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
def _fp16_pairs(words):
    """int32 words [A, B] of 16 INT2 codes (code i at bits 2i) -> (lo, hi) fp16 [A, B, 8]:
    lo[a, b, j] = code j, hi[a, b, j] = code 8 + j. No int -> float conversion instructions: two codes at a time are
    masked into the mantissas of the fp16 pair 1024 + c (bits 0x6400 | c), split, and 1024 is subtracted (exact)."""
    shifts = tl.arange(0, 8) * 2
    y = ((words[:, :, None] >> shifts[None, None, :]) & 0x00030003) | 0x64006400
    lo = y.to(tl.int16).to(tl.float16, bitcast=True)
    hi = (y >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    return lo - 1024.0, hi - 1024.0


@triton.jit
def _halves(words, A: tl.constexpr, B: tl.constexpr):
    """int32 words [A, B // 2] holding fp16 pairs (memory order) -> fp16 [A, B]. Loading fp16 scales two to a 4-byte
    word lets Triton's pipeliner stage them with cp.async (2-byte loads stay synchronous, a stall per block)."""
    lo = words.to(tl.int16).to(tl.float16, bitcast=True)
    hi = (words >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    return tl.reshape(tl.join(lo, hi), (A, B))


@triton.jit
def _perm16(i):
    """The token (or channel) at tile row (or column) i of _fp16_pairs' order: 16 (i // 16) + 8 (i % 2) + (i % 16) // 2."""
    return (i // 16) * 16 + (i % 2) * 8 + (i % 16) // 2


@triton.jit
def _quantized_block(qr, kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr, norm_ptr, t0, kv_len, scale_log2,
                     BLOCK_T: tl.constexpr, D: tl.constexpr):
    """Scores [M, BLOCK_T] (log2 units, masked) and dequantized V [BLOCK_T, D] fp16 of one block.

    Pointers are at (b, h, token 0). Keys: codes [T/16, D], scale/zero [T/32, D].
    Values: codes [T, D/16], scale/zero [T, D/32]. Norms fp32 [T].
    Both come out permuted by _fp16_pairs' order: row i of the scores and of V holds token t0 + _perm16(i), and
    column c of V holds channel _perm16(c); the caller stores the output's columns back in channel order.
    Returns S^T [BLOCK_T, M] (qr comes as [D, M]) and V^T [D, BLOCK_T]: with the tokens in the M dimension the two
    products fill the tensor core's 64-row tiles (the 4-8 query rows alone would pad M = 16).
    """
    d = tl.arange(0, D)
    # Loads past kv_len are masked to 0: they may lie past the stored tokens (or be another head's), and
    # a masked score times a garbage (inf / NaN) value would still poison the sum.
    rows = t0 // 16 + tl.arange(0, BLOCK_T // 16)
    kw = tl.load(kc_ptr + rows[:, None] * D + d[None, :], mask=(rows * 16 < kv_len)[:, None], other=0)
    grp = t0 // 32 + tl.arange(0, BLOCK_T // 32)
    g = grp[:, None] * (D // 2) + tl.arange(0, D // 2)[None, :]
    gok = (grp * 32 < kv_len)[:, None]
    ks = _halves(tl.load(ks_ptr.to(tl.pointer_type(tl.int32)) + g, mask=gok, other=0), BLOCK_T // 32, D)
    kz = _halves(tl.load(kz_ptr.to(tl.pointer_type(tl.int32)) + g, mask=gok, other=0), BLOCK_T // 32, D)
    klo, khi = _fp16_pairs(kw)  # [R, D, 8]: token 16r + j (lo), 16r + 8 + j (hi) of channel d
    # [R, 8, 2, D] -> tile row 16r + 2j + h holds token 16r + 8h + j (_perm16); groups of 32 rows stay groups
    kcodes = tl.reshape(tl.permute(tl.join(klo, khi), (0, 2, 3, 1)), (BLOCK_T // 32, 32, D))
    k = tl.reshape(kcodes * ks[:, None, :] + kz[:, None, :], (BLOCK_T, D))
    t = t0 + _perm16(tl.arange(0, BLOCK_T))
    tok = t < kv_len
    n = tl.load(norm_ptr + t, mask=tok, other=0.0)
    s = tl.dot(k, qr) * (n * scale_log2)[:, None]
    s = tl.where(tok[:, None], s, float("-inf"))

    vw = tl.load(vc_ptr + t[:, None] * (D // 16) + tl.arange(0, D // 16)[None, :], mask=tok[:, None], other=0)
    gv = t[:, None] * (D // 64) + tl.arange(0, D // 64)[None, :]
    vs = _halves(tl.load(vs_ptr.to(tl.pointer_type(tl.int32)) + gv, mask=tok[:, None], other=0), BLOCK_T, D // 32)
    vz = _halves(tl.load(vz_ptr.to(tl.pointer_type(tl.int32)) + gv, mask=tok[:, None], other=0), BLOCK_T, D // 32)
    vlo, vhi = _fp16_pairs(vw)  # [T, D/16, 8]: channel 16w + j (lo), 16w + 8 + j (hi)
    vcodes = tl.reshape(tl.join(vlo, vhi), (BLOCK_T, D // 32, 32))  # column 16w + 2j + h
    v = tl.reshape(vcodes * vs[:, :, None] + vz[:, :, None], (BLOCK_T, D))
    return s, tl.trans(v)


@triton.jit
def _online_update_t(s, vt, m, l, acct):
    """The transposed step: s [N, M] log2-scaled scores S^T, vt [D, N], acct [D, M]."""
    m_new = tl.maximum(m, tl.max(s, 0))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[None, :])
    l = l * alpha + tl.sum(p, 0)
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
def decode_split_kernel(
    Q, HD, KC, KS, KZ, VC, VS, VZ, NORM, KR, VR, KV_LEN, RES_LEN, PO, PML,
    T, Tr, num_splits, split_tokens, scale_log2,
    stride_rb, stride_rh, stride_rt, stride_vb, stride_vh, stride_vt,
    HKV: tl.constexpr, GROUP: tl.constexpr, LQ: tl.constexpr, M: tl.constexpr, D: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, ROTATE: tl.constexpr,
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
    d = tl.arange(0, D)
    m = tl.full((M,), NEG_INIT, tl.float32)
    l = tl.zeros((M,), tl.float32)
    acc = tl.zeros((M, D), tl.float32)
    if split < num_splits:
        if ROTATE:  # QR = Q Hd, 32 channels of Q at a time (registers), each as two TF32 products: Hd's high part
            # (10 mantissa bits, TF32-exact) and the rest; Q's bf16 / fp16 values are TF32-exact. Q's rows in M, as in
            # the window's products (the transposed form, Hd^T Q^T, faulted on the H100 under Triton 3.6 at D = 64).
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
        qr = qt.to(tl.float16)
        acct = tl.zeros((D, M), tl.float32)
        kv_len = tl.load(KV_LEN + b)
        start = split * split_tokens
        end = tl.minimum(start + split_tokens, kv_len)
        kbase = (b * HKV + h).to(tl.int64) * T
        for t0 in range(start, end, BLOCK_T):
            s, v = _quantized_block(qr, KC + kbase // 16 * D, KS + kbase // 32 * D, KZ + kbase // 32 * D,
                                    VC + kbase * (D // 16), VS + kbase * (D // 32), VZ + kbase * (D // 32),
                                    NORM + b.to(tl.int64) * T, t0, kv_len, scale_log2, BLOCK_T, D)
            m, l, acct = _online_update_t(s, v, m, l, acct)
        acc = tl.trans(acct)
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
    # a quantized split's columns are in _fp16_pairs' channel order
    col = tl.where(split < num_splits, _perm16(d), d)
    tl.store(PO + out * M * D + r[:, None] * D + col[None, :], acc)
    tl.store(PML + out * 2 * M + r, m)
    tl.store(PML + out * 2 * M + M + r, l)


@triton.jit
def combine_kernel(PO, PML, HD, OUT, num_splits,
                   HKV: tl.constexpr, GROUP: tl.constexpr, LQ: tl.constexpr, M: tl.constexpr, D: tl.constexpr,
                   NS: tl.constexpr, ROTATE_OUT: tl.constexpr):
    """Merge the splits of one query row by log-sum-exp: program (b, h, r) for the GROUP * LQ real rows of M;
    out = (O_q @ Hd + O_r) / L into OUT [B, Hq, LQ, D] (O_q as it is without ROTATE_OUT: the model's weights carry
    V's rotation). Online over chunks of NS splits whose loads ([NS] of m and l, [NS, D] of O) are all in flight at
    once: one round of L2 latency per chunk. (One program per (b, h) looping over the splits one at a time took
    ~0.35 us a split on the H100: 12 us of Qwen3's 1 x 128K step, 24 of the thinker's, run 104.)"""
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


_PROGRAMS: dict = {}  # compiled launch configuration -> resident programs per SM (programs_per_sm)


def programs_per_sm(kernel, device) -> int:
    """Programs of a compiled Triton kernel resident on one SM at once: the least of what its registers (allocated per
    warp in units of 256), its shared memory (+1 KB the hardware reserves per block) and its warps allow."""
    import torch

    props = torch.cuda.get_device_properties(device)
    kernel._init_handles()  # loads the binary: n_regs is known from here on
    warps = kernel.metadata.num_warps
    per_warp = -(-max(kernel.n_regs, 1) * 32 // 256) * 256
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (per_warp * warps)
    by_smem = getattr(props, "shared_memory_per_multiprocessor", 233472) // (kernel.metadata.shared + 1024)
    by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (32 * warps)
    return max(1, min(by_regs, by_smem, by_threads, 32))


def plan_splits(tokens: int, rows: int, block: int, sms: int, programs: int, waves: float | None = None,
                min_blocks: int = 4) -> tuple[int, int]:
    """(split_tokens, splits) of the Triton decode. rows = B * Hkv; programs: resident programs per SM.

    waves=None: when at least 4 splits of each row fit one wave with the window's programs (rows * (splits + 1) <=
    sms * programs), exactly one wave of splits of >= min_blocks blocks (run 95, Qwen3 1 x 128K: 32 splits, 264
    programs on 132 SMs x 2, 168 us, where the 3-wave rule's 49 splits ran 1.5 waves in 220 us); else rows * splits ~
    3 x sms (common.choose_split, as before run 95). A given `waves` always takes the latter rule."""
    from quant.kernels.common import choose_split

    one_wave = sms * programs // max(rows, 1) - 1
    if waves is not None or one_wave < 4 or tokens == 0:
        return choose_split(tokens, rows, block, sms, 3 if waves is None else waves)
    splits = max(1, min(one_wave, -(-tokens // (min_blocks * block))))
    split_tokens = -(-tokens // (splits * block)) * block
    return split_tokens, -(-tokens // split_tokens)


def decode_attention(query, kv, scaling: float, kv_lens=None, res_lens=None, block_t: int | None = None,
                     split_tokens: int | None = None, num_warps: int = 4, num_stages: int | None = None,
                     waves: float | None = None, maxnreg: int | None = None):
    """OScaR decode attention with Triton. query [B, Hq, Lq, D] -> out [B, Hq, Lq, D] (query dtype).

    kv: quant.packed.PackedKV. kv_lens / res_lens: valid quantized / residual tokens per sequence
    (default: all stored). split_tokens: tokens per split (default: plan_splits, with `waves` and the compiled
    kernel's programs per SM).
    The launch's tuning: block_t (tokens per step of a split's loop; default 128, or the largest of 64 / 32 dividing
    a given split_tokens), num_warps, num_stages (Triton's software pipelining; None: its default), maxnreg (a
    register cap per thread, hence more programs per SM; None: the compiler's choice). Run 92 swept them.
    """
    import torch

    from quant.kernels.common import num_sms, padded_rows, prepare_decode

    x = prepare_decode(query, kv, kv_lens, res_lens, rotate_query=False)  # the kernel rotates the query
    m = padded_rows(x.group, x.lq)
    rows = x.batch * x.kv_heads
    if block_t is None:
        block_t = next((bt for bt in (128, 64) if split_tokens is None or split_tokens % bt == 0), 32)
    if block_t not in (32, 64, 128, 256):
        raise ValueError(f"block_t must be 32, 64, 128 or 256 (whole quantization groups, a power of two), got {block_t}")
    if split_tokens is not None and split_tokens % block_t:
        raise ValueError(f"split_tokens ({split_tokens}) must be a multiple of block_t ({block_t})")
    dev = query.device
    sl2 = float(scaling) * LOG2E
    options = dict(HKV=x.kv_heads, GROUP=x.group, LQ=x.lq, M=m, D=x.head_dim, BLOCK_T=block_t, BLOCK_R=32,
                   ROTATE=kv.hadamard is not None,
                   num_warps=num_warps, **({} if num_stages is None else {"num_stages": num_stages}),
                   **({} if maxnreg is None else {"maxnreg": maxnreg}))

    def args(splits, split_tokens, po, pml):
        return (x.q, x.hd, x.kc, x.ks, x.kz, x.vc, x.vs, x.vz, x.norms, x.k_res, x.v_res, x.kv_lens, x.res_lens, po,
                pml, x.tokens, x.residual, splits, split_tokens, sl2, x.k_res.stride(0), x.k_res.stride(1),
                x.k_res.stride(2), x.v_res.stride(0), x.v_res.stride(1), x.v_res.stride(2))

    if split_tokens is None:
        programs = 2  # the default launch's measured value (255 registers, 4 warps), where it cannot be read
        if dev.type == "cuda":
            key = (dev.index, x.q.dtype, x.k_res.dtype, tuple(sorted(options.items())))
            if key not in _PROGRAMS:  # compile without launching and read the binary's registers and shared memory
                scratch = torch.empty(1, dtype=torch.float32, device=dev)
                _PROGRAMS[key] = programs_per_sm(decode_split_kernel.warmup(*args(1, block_t, scratch, scratch),
                                                                            grid=(1,), **options), dev)
            programs = _PROGRAMS[key]
        split_tokens, splits = plan_splits(x.tokens, rows, block_t, num_sms(dev), programs, waves)
    else:
        splits = -(-x.tokens // split_tokens)
    po = torch.empty(rows, splits + 1, m, x.head_dim, dtype=torch.float32, device=dev)
    pml = torch.empty(rows, splits + 1, 2, m, dtype=torch.float32, device=dev)
    decode_split_kernel[(splits + 1, rows)](*args(splits, split_tokens, po, pml), **options)
    out = torch.empty(query.shape, dtype=query.dtype, device=dev)
    combine_kernel[(rows * x.group * x.lq,)](po, pml, x.hd, out, splits, HKV=x.kv_heads, GROUP=x.group, LQ=x.lq, M=m,
                                             D=x.head_dim, NS=min(64, triton.next_power_of_2(max(splits, 1))),
                                             ROTATE_OUT=kv.rotate_out, num_warps=4)
    return out
