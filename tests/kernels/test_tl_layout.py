"""The "tl" code order (quant/packed.py), what the Triton decode (quant/kernels/triton_decode.py) reads: a permutation
inside each 128-token block that keeps every tensor's shape, so that each thread of the kernel's wgmma tiles finds its
codes and scales contiguous. Checked here against its definition, word by word, and for exact round trips."""

from __future__ import annotations

import pytest
import torch

from quant.kernels.reference import random_packed_kv
from quant.packed import TL_BLOCK, tl_maps, tl_row


def test_a_warps_rows_are_one_group():
    # tau = tl_row(., 2): warp w holds rows 16w..16w+15 of each of the two 64-row tiles; they must be the 32 tokens
    # of one quantization group, so that a thread needs one group's scales.
    tau = tl_row(torch.arange(TL_BLOCK), 2)
    assert sorted(tau.tolist()) == list(range(TL_BLOCK))
    for w in range(4):
        rows = torch.cat([torch.arange(16 * w, 16 * w + 16), torch.arange(64 + 16 * w, 64 + 16 * w + 16)])
        assert sorted(tau[rows].tolist()) == list(range(32 * w, 32 * w + 32))


@pytest.mark.parametrize("d", [64, 128])
def test_words_and_scales_hold_what_the_order_defines(d):
    kv = random_packed_kv(1, 2, 256, 3, d, seed=d)
    k, v = kv.k.to_order("tl"), kv.v.to_order("tl")
    assert k.codes.shape == kv.k.codes.shape and v.scale.shape == kv.v.scale.shape  # shapes kept
    kn, vn = kv.k.unpacked(), kv.v.unpacked()  # natural codes [B, H, T, D]
    tau = tl_row(torch.arange(TL_BLOCK), 2)
    kw = k.codes.reshape(1, 2, 256, d // 16)  # a token's D/16 words
    vw = v.codes.reshape(1, 2, 2, d, 8)  # per block, a channel's 8 words
    g = torch.Generator().manual_seed(d)
    for _ in range(64):
        h, t, c, jj, half = (int(torch.randint(n, (1,), generator=g)) for n in (2, 256, 4, 8, 2))
        hh = int(torch.randint(d // 64, (1,), generator=g))
        word = int(kw[0, h, t, c * (d // 64) + hh]) & 0xFFFFFFFF
        assert (word >> (2 * jj + 16 * half)) & 3 == int(kn[0, h, t, 2 * c + half + 8 * jj + 64 * hh])
        blk, ch, two = int(torch.randint(2, (1,), generator=g)), int(torch.randint(d, (1,), generator=g)), hh % 2
        word = int(vw[0, h, blk, ch, 2 * c + two]) & 0xFFFFFFFF
        tok = 128 * blk + int(tau[64 * two + 8 * jj + 2 * c + half])
        assert (word >> (2 * jj + 16 * half)) & 3 == int(vn[0, h, tok, ch])
        kk = int(torch.randint(d // 8, (1,), generator=g))
        assert k.scale[0, h, t // 32, (d // 4) * c + 2 * kk + half] == kv.k.scale[0, h, t // 32, 2 * c + half + 8 * kk]
        kk, grp = int(torch.randint(16, (1,), generator=g)), int(torch.randint(d // 32, (1,), generator=g))
        vs = v.scale.reshape(1, 2, 2, d // 32, TL_BLOCK)
        tok = 128 * blk + int(tau[2 * c + half + 8 * kk])
        assert vs[0, h, blk, grp, 32 * c + 2 * kk + half] == kv.v.scale[0, h, tok, grp]


@pytest.mark.parametrize("d", [64, 128])
def test_round_trips_are_exact(d):
    kv = random_packed_kv(2, 3, 384, 5, d, seed=d + 1)
    for q in (kv.k, kv.v):
        tl = q.to_order("tl")
        assert torch.equal(tl.unpacked(), q.unpacked()) and torch.equal(tl.dequantize(), q.dequantize())
        assert torch.equal(tl.to_order("natural").codes, q.codes) and torch.equal(tl.to_order("natural").scale, q.scale)
        assert torch.equal(tl.to_order("frag").codes, q.to_order("frag").codes)  # by way of the natural order
    kslot, kpos, vslot, vpos = tl_maps(d)
    assert sorted(kslot.reshape(-1).tolist()) == list(range(d)) and sorted(kpos.tolist()) == list(range(d))
    assert sorted(vslot.reshape(-1).tolist()) == list(range(128)) and sorted(vpos.tolist()) == list(range(128))


def test_partial_blocks_are_padded_not_laid_out():
    kv = random_packed_kv(1, 1, 96, 2, 64, seed=3)
    with pytest.raises(ValueError, match="whole 128-token blocks, got 96 tokens: pad them first"):
        kv.k.to_order("tl")
    padded = kv.k.pad_tokens(TL_BLOCK)
    assert padded.num_tokens == 128 and torch.equal(padded.dequantize()[:, :, :96], kv.k.dequantize())
    assert torch.equal(padded.to_order("tl").unpacked()[:, :, :96], kv.k.unpacked())
    assert kv.v.pad_tokens(TL_BLOCK).num_tokens == 128


def test_the_torch_reference_reads_a_kernel_ordered_cache_cut_to_its_valid_tokens():
    # quant.kernels.valid_part cuts a cache at capacity to its valid tokens for the torch backend: a kernel's order
    # permutes inside blocks, so it converts to the natural order before cutting (a cut tl block would be garbage).
    import dataclasses

    from quant.kernels import decode_attention

    kv = random_packed_kv(1, 2, 256, 4, 64, seed=9)
    tl = dataclasses.replace(kv, k=kv.k.to_order("tl"), v=kv.v.to_order("tl"))
    q = torch.randn(1, 8, 1, 64, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    want = decode_attention(q, kv, 0.125, backend="torch", kv_lens=[192])
    assert torch.equal(decode_attention(q, tl, 0.125, backend="torch", kv_lens=[192]), want)
    with pytest.raises(ValueError, match="whole 32-token groups, got kv_lens 200"):
        decode_attention(q, tl, 0.125, backend="torch", kv_lens=[200])
