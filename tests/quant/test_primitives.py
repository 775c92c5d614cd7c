"""Bit packing round trips and the quantizer against a float64 reference of its formula."""

import math

import pytest
import torch

from quant.primitives import (
    asym_dequantize,
    asym_quantize,
    codes_per_word,
    hadamard,
    lloyd_max_normal,
    pack_bitstream,
    pack_codes,
    random_orthogonal,
    unpack_bitstream,
    unpack_codes,
)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("dim", [-1, -2])
def test_pack_unpack_bit_exact(bits, dim):
    g = torch.Generator().manual_seed(bits)
    per = codes_per_word(bits)
    shape = [2, 3, 5, 7]
    shape[dim] = per * 3
    codes = torch.randint(0, 2**bits, shape, generator=g, dtype=torch.uint8)
    words = pack_codes(codes, bits, dim)
    assert words.dtype == torch.int32 and words.shape[dim] == 3
    assert torch.equal(unpack_codes(words, bits, dim), codes)


def test_pack_layout_is_little_endian_within_word():
    codes = torch.tensor([[1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3]], dtype=torch.uint8)
    word = pack_codes(codes, 2, -1).item() & 0xFFFFFFFF
    assert word == 1 | (2 << 2) | (3 << 4) | (3 << 30)


def test_pack_rejects_ragged_length():
    with pytest.raises(ValueError, match="multiple of 16"):
        pack_codes(torch.zeros(1, 17, dtype=torch.uint8), 2, -1)


@pytest.mark.parametrize("bits,n", [(3, 32), (3, 16), (3, 7), (2, 96), (2, 5)])
def test_bitstream_round_trip(bits, n):
    codes = torch.randint(0, 2**bits, (4, n), dtype=torch.uint8)
    words = pack_bitstream(codes, bits)
    assert words.shape[-1] == math.ceil(n * bits / 32)
    assert torch.equal(unpack_bitstream(words, bits, n), codes)


@pytest.mark.parametrize("bits,clip", [(2, 1.0), (2, 0.95), (3, 0.8), (4, 1.0)])
def test_asym_quantize_matches_float64_formula(bits, clip):
    x = torch.randn(6, 33, 32, dtype=torch.float64) * 3 + 0.5
    codes, scale, zero = asym_quantize(x, bits, dim=-1, clip=clip)
    hi, lo = x.amax(-1, keepdim=True) * clip, x.amin(-1, keepdim=True) * clip
    s_ref = ((hi - lo) / (2**bits - 1)).to(torch.float16).double()
    z_ref = lo.to(torch.float16).double()
    q_ref = torch.round((x - z_ref) / s_ref).clamp(0, 2**bits - 1)
    assert torch.equal(scale.double(), s_ref) and torch.equal(zero.double(), z_ref)
    assert (codes.double() - q_ref).abs().max() <= 1  # float32 vs float64 rounding at exact .5 ties
    assert (codes.double() != q_ref).double().mean() < 1e-3
    x_hat = asym_dequantize(codes, scale, zero).double()
    inside = (x >= lo) & (x <= hi)
    assert ((x_hat - x).abs()[inside] <= s_ref.expand_as(x)[inside] / 2 + 1e-3).all()


@pytest.mark.parametrize("bits", [2, 4])
def test_integer_zero_point_is_a_whole_number_of_steps(bits):
    """OScaR's framework: z = round(-min / s), q = clamp(round(x / s) + z), x_hat = s * (q - z); stored as -s * z."""
    x = torch.randn(6, 33, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(bits)) * 3 + 0.5
    codes, scale, zero = asym_quantize(x, bits, dim=-1, zero_point="integer")
    s = ((x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)) / (2**bits - 1)).to(torch.float16).double()
    z = torch.round(-x.amin(-1, keepdim=True) / s)
    assert torch.equal(scale.double(), s)
    assert torch.allclose(zero.double(), (-s * z).half().double())  # the offset, rounded to fp16 as stored
    # the codes are those of the stored offset; they equal round(x / s) + z but where fp16 moved a tie
    q_stored = torch.round((x - zero.double()) / s).clamp(0, 2**bits - 1)
    assert (codes.double() != q_stored).double().mean() < 1e-3  # float32 vs float64 ties only
    q_ref = (torch.round(x / s) + z).clamp(0, 2**bits - 1)
    assert (codes.double() != q_ref).double().mean() < 1e-2
    x_hat = asym_dequantize(codes, scale, zero).double()
    same = codes.double() == q_ref
    assert ((x_hat - s * (q_ref - z)).abs()[same] < 1e-2 * s.expand_as(x)[same]).all()  # s * (q - z) up to fp16
    assert ((x_hat - x).abs() <= s).all()  # the grid moved by at most half a step: error within one step
    float_codes, _, float_zero = asym_quantize(x, bits, dim=-1)
    assert not torch.equal(zero, float_zero)
    with pytest.raises(ValueError, match="zero_point"):
        asym_quantize(x, bits, dim=-1, zero_point="int")


def test_constant_group_does_not_divide_by_zero():
    x = torch.full((2, 32), 1.25)
    codes, scale, zero = asym_quantize(x, 2, dim=-1)
    assert (scale > 0).all() and (codes == 0).all()  # the guard survives the fp16 cast: no 0/0
    assert torch.allclose(asym_dequantize(codes, scale, zero), x, atol=1e-3)


@pytest.mark.parametrize("d", [16, 64, 128])
def test_hadamard_is_symmetric_orthonormal_sylvester(d):
    h = hadamard(d, dtype=torch.float64)
    assert torch.allclose(h, h.T)
    assert torch.allclose(h @ h, torch.eye(d, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(h[0], torch.full((d,), 1 / math.sqrt(d), dtype=torch.float64))
    assert torch.allclose(h[1, :2], torch.tensor([1, -1], dtype=torch.float64) / math.sqrt(d))


def test_hadamard_rejects_non_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        hadamard(96)


def test_random_orthogonal_is_orthogonal_and_seeded():
    q = random_orthogonal(64, seed=3, dtype=torch.float64)
    assert torch.allclose(q @ q.T, torch.eye(64, dtype=torch.float64), atol=1e-10)
    assert torch.equal(q, random_orthogonal(64, seed=3, dtype=torch.float64))
    assert not torch.equal(q, random_orthogonal(64, seed=4, dtype=torch.float64))


def test_lloyd_max_known_centroids():
    c2 = lloyd_max_normal(2)
    assert c2[2] == pytest.approx(0.4528, abs=1e-3) and c2[3] == pytest.approx(1.5104, abs=1e-3)
    c3 = lloyd_max_normal(3)
    assert [round(v, 3) for v in c3[4:]] == pytest.approx([0.245, 0.756, 1.344, 2.152], abs=2e-3)
