"""BF16 decode attention whose sums do not depend on the batch: the batch-invariant mode's attention over BF16's
fixed-shape buffers (quant.kernels.hf_decode.DenseStep).

BF16's fixed steps attend over buffers [B, Hkv, capacity, D] holding each sequence's tokens at its start, `lengths[b]`
of them. SDPA over those buffers with a length mask sums over the batch's capacity in an order its kernel picks for
the whole launch, so a sequence's output moves with the other sequences' lengths (quant/invariant.py). Here every
sequence is cut into splits of SPLIT tokens from its first token: a split past the sequence's length is empty, and
the splits of a (sequence, KV head) merge one after the other in order, so the empty ones add exact zeros and each
sequence's output is the same whatever the capacity, the batch and the other lengths. The launch's shape stays that
of the buffers, so CUDA graphs replay it.

    out = dense_decode(query [B, Hq, 1, D], k, v, lengths, scaling)

One program attends one split of one (sequence, KV head) for its Hq / Hkv query heads (padded to the 16 rows of a
tensor-core tile), in blocks of BLOCK_N keys with an online softmax in float32; a second kernel merges the splits'
partials by log-sum-exp, in split order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SPLIT = 1024  # tokens a split: a row's splits depend on its own length only
BLOCK_N = 64  # keys a block inside a split
ROWS = 16  # query rows of a program's tile (the GQA group, padded)


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, len_ptr, po_ptr, pm_ptr, pl_ptr, scaling,
    kv_heads, splits, group,
    sq_b, sq_h, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n,
    D: tl.constexpr, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """Split `program_id(0)` of row (sequence, KV head) `program_id(1)`: its partial output (unnormalized, float32),
    running max and sum, at [row, split]."""
    split, row = tl.program_id(0), tl.program_id(1)
    b, h = row // kv_heads, row % kv_heads
    n = tl.load(len_ptr + b)
    r = tl.arange(0, ROWS)
    d = tl.arange(0, D)
    out = (row * splits + split).to(tl.int64)
    start = split * SPLIT
    if start >= n:  # past this sequence's tokens: an empty partial, merged as exact zeros
        tl.store(pm_ptr + out * ROWS + r, tl.full([ROWS], float("-inf"), tl.float32))
        tl.store(pl_ptr + out * ROWS + r, tl.zeros([ROWS], tl.float32))
        tl.store(po_ptr + (out * ROWS + r[:, None]) * D + d[None, :], tl.zeros([ROWS, D], tl.float32))
        return
    heads = h * group + r
    q = tl.load(
        q_ptr + b.to(tl.int64) * sq_b + heads[:, None] * sq_h + d[None, :], mask=(r < group)[:, None], other=0.0
    )
    m = tl.full([ROWS], float("-inf"), tl.float32)
    s_sum = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    k_base = k_ptr + b.to(tl.int64) * sk_b + h.to(tl.int64) * sk_h
    v_base = v_ptr + b.to(tl.int64) * sv_b + h.to(tl.int64) * sv_h
    for off in range(0, SPLIT, BLOCK_N):
        j = start + off + tl.arange(0, BLOCK_N)
        valid = j < n
        kb = tl.load(k_base + j[:, None].to(tl.int64) * sk_n + d[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(kb)) * scaling
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))  # finite: the first block of a split holds a token
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        s_sum = s_sum * alpha + tl.sum(p, 1)
        vb = tl.load(v_base + j[:, None].to(tl.int64) * sv_n + d[None, :], mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
        m = m_new
    tl.store(pm_ptr + out * ROWS + r, m)
    tl.store(pl_ptr + out * ROWS + r, s_sum)
    tl.store(po_ptr + (out * ROWS + r[:, None]) * D + d[None, :], acc)


@triton.jit
def _merge_kernel(
    po_ptr, pm_ptr, pl_ptr, o_ptr, kv_heads, splits, group, so_b, so_h,
    D: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """Row `program_id(0)`'s splits merged in split order: out = sum_s 2^.. o_s / sum_s .. l_s."""
    row = tl.program_id(0)
    b, h = row // kv_heads, row % kv_heads
    r = tl.arange(0, ROWS)
    d = tl.arange(0, D)
    base = (row * splits).to(tl.int64)
    big = tl.full([ROWS], float("-inf"), tl.float32)
    for s in range(0, splits):
        big = tl.maximum(big, tl.load(pm_ptr + (base + s) * ROWS + r))
    total = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    for s in range(0, splits):
        w = tl.exp(tl.load(pm_ptr + (base + s) * ROWS + r) - big)  # an empty split: exp(-inf) = 0
        total += w * tl.load(pl_ptr + (base + s) * ROWS + r)
        acc += w[:, None] * tl.load(po_ptr + ((base + s) * ROWS + r[:, None]) * D + d[None, :])
    heads = h * group + r
    out = acc / total[:, None]
    tl.store(
        o_ptr + b.to(tl.int64) * so_b + heads[:, None] * so_h + d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=(r < group)[:, None],
    )


def dense_decode(
    query: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    scaling: float,
    split: int = SPLIT,
    block_n: int = BLOCK_N,
    num_warps: int = 4,
    num_stages: int | None = None,
):
    """query [B, Hq, 1, D] over k, v [B, Hkv, capacity, D] (each sequence's `lengths[b]` tokens first; int32 [B] on the
    device, at least 1) -> [B, Hq, 1, D] in query's dtype. Hq / Hkv <= 16; D a power of two >= 16. split, block_n,
    num_warps, num_stages: the launch's tuning (a multiple of block_n; one value for every batch keeps the
    invariance)."""
    b, hq, lq, d = query.shape
    hkv, cap = k.shape[1], k.shape[2]
    group = hq // hkv
    if lq != 1 or group * hkv != hq or group > ROWS or d & (d - 1) or d < 16:
        raise ValueError(
            f"dense_decode takes one query token, Hq / Hkv <= {ROWS} and a power-of-two head dim >= 16; got query "
            f"{tuple(query.shape)} over {hkv} KV heads"
        )
    k, v = k.to(query.dtype), v.to(query.dtype)
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        k, v = k.contiguous(), v.contiguous()
    q = query[:, :, 0]
    if q.stride(-1) != 1:
        q = q.contiguous()
    splits = max(1, -(-cap // split))
    rows = b * hkv
    part_o = torch.empty(rows * splits * ROWS * d, dtype=torch.float32, device=query.device)
    part_m = torch.empty(rows * splits * ROWS, dtype=torch.float32, device=query.device)
    part_l = torch.empty_like(part_m)
    _split_kernel[(splits, rows)](
        q, k, v, lengths, part_o, part_m, part_l, float(scaling),
        hkv, splits, group,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        D=d, SPLIT=split, BLOCK_N=block_n, ROWS=ROWS, num_warps=num_warps,
        **({} if num_stages is None else {"num_stages": num_stages}),
    )  # fmt: skip
    out = torch.empty(b, hq, d, dtype=query.dtype, device=query.device)
    _merge_kernel[(rows,)](
        part_o, part_m, part_l, out, hkv, splits, group, out.stride(0), out.stride(1), D=d, ROWS=ROWS
    )
    return out[:, :, None]
