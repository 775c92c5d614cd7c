"""The "frag" code order (quant/packed.py) against the tensor-core fragment reads of the CUDA decode kernel.

The kernel (csrc/include/oscar_decode.cuh) never unpacks codes to the natural layout: lane L = 4 g + c loads
its words and turns pair slot s of word w into an fp16 pair of subnormals by masking the pair inside an fp16
mantissa (bit p): key codes as (code_lo, code_hi) x 2^(p - 24), value codes as (code_lo, 3 - code_hi) x 2^(p - 24)
(the high half's, odd token's code mirrored); no offset either way. This test replays those reads on the CPU,
lane by lane, with the PTX m16n8k16 fragment layouts, and checks that the matrices they build are the natural K
(token rows) and V^T (channel rows) of the block, and that the same token map serves norms, value scales and P^T.
"""

from __future__ import annotations

import pytest
import torch

from quant.packed import frag_channel, frag_pack, frag_scales, frag_token, frag_unpack, quantize


def lane_words(words: torch.Tensor, lane: int, per_lane: int) -> list[int]:
    """The lane's words in the order it loads them (16-byte chunk j = w // 4 at position 32 j + lane)."""
    return [int(words[4 * (32 * (w // 4) + lane) + w % 4]) & 0xFFFFFFFF for w in range(per_lane)]


def slot_shift(d: int, slot: int) -> int:
    """The kernel's right shift of pair slot `slot`, csrc/include/oscar_common.cuh SlotMap: slots 0-3 stay where they
    are (bits 0, 2, 4, 6 of each half), slots 4-7 move down by 8 onto the same bits, for both head dims."""
    return 0 if slot < 4 else 8


def slot_pos(d: int, slot: int) -> int:
    """The mantissa bit p the field of `slot` lands on: as an fp16 subnormal, its code weighs 2^(p - 24)."""
    return 2 * slot - slot_shift(d, slot)


def subnormal_pair(x: int, pos: int) -> tuple[float, float]:
    """The two fp16 halves of the 32-bit `x`, in units of the subnormal 2^(pos - 24)."""
    halves = torch.tensor([x & 0xFFFF, x >> 16], dtype=torch.int32).to(torch.int16).view(torch.float16)
    unit = 2.0 ** (pos - 24)
    return float(halves[0]) / unit, float(halves[1]) / unit


def dequant_pair(word: int, slot: int, d: int) -> tuple[float, float]:
    """The kernel's shift + ONE LOP3 for key codes (code_slot<D, S, false>): x & mask, the fields S, S + 8 (bits 2S,
    16 + 2S) masked at mantissa bit p of each half as fp16 subnormals."""
    pos = slot_pos(d, slot)
    return subnormal_pair((word >> slot_shift(d, slot)) & (0x00030003 << pos), pos)


def value_pair(word: int, slot: int, d: int) -> tuple[float, float]:
    """The kernel's shift + ONE LOP3 for value codes (code_slot<D, S, true>): (x ^ flip) & mask, the fields masked
    in place at mantissa bit p as fp16 subnormals, the high half complemented."""
    pos = slot_pos(d, slot)
    x = word >> slot_shift(d, slot)
    return subnormal_pair((x ^ (0x00030000 << pos)) & (0x00030003 << pos), pos)


def test_slot_units():
    # One shift per word; units 2^(p - 24) by slot % 4, so a D = 64 fragment, which mixes slots S and S + 4, has
    # one unit, and no field reaches the exponent.
    for d in (64, 128):
        assert len({slot_shift(d, s) for s in range(8)} - {0}) == 1
        assert [slot_pos(d, s) for s in range(8)] == [0, 2, 4, 6] * 2


@pytest.mark.parametrize("d", [64, 128])
def test_key_fragments_are_the_block(d):
    codes = torch.randint(0, 4, (1, 1, 32, d), dtype=torch.uint8, generator=torch.Generator().manual_seed(d))
    words = frag_pack(codes, -2).reshape(-1)
    assert torch.equal(frag_unpack(frag_pack(codes, -2), -2), codes)
    per_lane = d // 16
    a = torch.full((2, per_lane, 16, 16), -1.0)  # [tile, k-step, row, k]
    for lane in range(32):
        g, c = lane // 4, lane % 4
        mine = lane_words(words, lane, per_lane)
        for mt in range(2):
            for ks in range(per_lane):
                for r in range(4):
                    f = (4 * mt + r) * per_lane + ks
                    lo, hi = dequant_pair(mine[f // 8], f % 8, d)
                    row, k = g + 8 * (r & 1), 2 * c + 8 * (r >> 1)
                    a[mt, ks, row, k], a[mt, ks, row, k + 1] = lo, hi
                    assert slot_pos(d, f % 8) == slot_pos(d, ks)  # one unit per k-step (its query's scale)
    natural = codes[0, 0].float()
    for mt in range(2):
        for ks in range(per_lane):
            for row in range(16):
                want = torch.stack([natural[frag_token(mt, row), frag_channel(ks, k)] for k in range(16)])
                assert torch.equal(a[mt, ks, row], want)
    # Every channel appears exactly once per k-step set, and lane c's channels are chunks 4 i + c.
    chans = sorted(frag_channel(ks, k) for ks in range(per_lane) for k in range(16))
    assert chans == list(range(d))
    for c in range(4):
        mine = sorted(frag_channel(ks, 2 * c + e + 8 * hi) for ks in range(per_lane) for e in (0, 1) for hi in (0, 1))
        assert mine == [8 * (4 * i + c) + x for i in range(d // 32) for x in range(8)]


@pytest.mark.parametrize("d", [64, 128])
def test_value_fragments_are_the_block(d):
    codes = torch.randint(0, 4, (1, 1, 32, d), dtype=torch.uint8, generator=torch.Generator().manual_seed(7 + d))
    words = frag_pack(codes, -1).reshape(-1)
    assert torch.equal(frag_unpack(frag_pack(codes, -1), -1), codes)
    per_lane = d // 16
    natural = codes[0, 0].float()
    for lane in range(32):
        g, c = lane // 4, lane % 4
        mine = lane_words(words, lane, per_lane)
        for kt in range(2):
            for mv in range(per_lane):
                for r in range(4):
                    f = (4 * kt + r) * per_lane + mv
                    lo, hi = value_pair(mine[f // 8], f % 8, d)
                    ch, k = 16 * mv + g + 8 * (r & 1), 2 * c + 8 * (r >> 1)
                    assert slot_pos(d, f % 8) == slot_pos(d, mv)  # one subnormal unit per channel tile
                    assert (lo, hi) == (natural[frag_token(kt, k), ch], 3 - natural[frag_token(kt, k + 1), ch])
                    # the high half is the odd token of a pair, the one whose P the decode negates
                    assert frag_token(kt, k) % 2 == 0 and frag_token(kt, k + 1) == frag_token(kt, k) + 1


def test_token_map_serves_norms_scales_and_p():
    assert sorted(frag_token(t, r) for t in range(2) for r in range(16)) == list(range(32))
    for g in range(8):  # S^T rows g, g + 8 of both tiles: the kernel's norm offsets
        base = 8 * (g >> 1) + (g & 1)
        assert [frag_token(0, g), frag_token(0, g + 8), frag_token(1, g), frag_token(1, g + 8)] == [
            base,
            base + 2,
            base + 4,
            base + 6,
        ]
    for c in range(4):  # P^T B fragments (k = 2c, 2c+1 | 2c+8, 2c+9 of step kt) = value-scale chunk c, pairs
        got = [frag_token(kt, 2 * c + 8 * hi + e) for kt in range(2) for hi in range(2) for e in range(2)]
        assert got == list(range(8 * c, 8 * c + 8))


def test_frag_order_roundtrip_and_semantics():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 96, 64, generator=g)
    for axis in (-2, -1):
        q = quantize(x, 2, 32, axis)
        f = q.to_order("frag")
        assert f.order == "frag" and f.codes.shape == q.codes.shape and f.scale.shape == q.scale.shape
        assert torch.equal(f.dequantize(), q.dequantize())
        assert torch.equal(f.to_order("natural").codes, q.codes)
        # contiguous in either order, as the kernels read them: a view here would cost the Triton decode a
        # transposing copy inside every call (33 MB at 1 x 128K)
        for t in (q, f, f.to_order("natural")):
            assert all(x.is_contiguous() for x in (t.codes, t.scale, t.zero)), (axis, t.order)
        both = q.cat(f)  # appending converts the other side to self's order
        assert both.order == "natural" and torch.equal(both.dequantize()[..., 96:, :], q.dequantize())
    s = torch.randn(1, 2, 64, 4)
    assert torch.equal(frag_scales(frag_scales(s), inverse=True), s)
    assert torch.equal(frag_scales(s)[0, 0, :32].reshape(-1), s[0, 0, :32].t().reshape(-1))
