"""Pure quantization primitives: asymmetric min/max quantization, bit packing, Hadamard matrices,
random rotations and Lloyd-Max codebooks. No state, no method policy.
"""

from __future__ import annotations

import functools
import math
import sys

import torch

# Smallest scale: guards max == min (a constant group) against division by zero. 2**-24 is the
# smallest positive fp16 value, so the guard survives the cast to the stored fp16 scale.
MIN_SCALE = 2.0**-24


ZERO_POINTS = ("integer", "float")


def asym_quantize(
    x: torch.Tensor, bits: int, dim: int, clip: float = 1.0, scale_dtype=torch.float16, zero_point: str = "float"
):
    """Asymmetric min/max quantization along `dim` (the group axis, reduced).

    hi = clip * max, lo = clip * min, s = (hi - lo) / (2^B - 1). The zero point, by `zero_point`:
    - "float" (KIVI's own code): zero = lo, q = clamp(round((x - lo) / s), 0, 2^B - 1);
    - "integer" (OScaR's official framework and CUDA pack, QuaRot, RotateKV): z = round(-lo / s), an integer
      number of steps, so q = clamp(round(x / s) + z, 0, 2^B - 1) and x_hat = s * (q - z). Stored as the offset
      zero = -s * z, so both conventions dequantize as x_hat = q * s + zero (the kernels read one formula).
    The scale and zero are rounded to `scale_dtype` first, and codes are computed with the rounded values, so
    dequantization with the stored values is exactly what the codes mean.

    Returns (codes uint8 same shape as x, scale, zero) with scale/zero keeping `dim` as size 1.
    """
    if zero_point not in ZERO_POINTS:
        raise ValueError(f"zero_point must be one of {ZERO_POINTS}, got {zero_point!r}")
    xf = x.float()
    hi = xf.amax(dim=dim, keepdim=True) * clip
    lo = xf.amin(dim=dim, keepdim=True) * clip
    levels = 2**bits - 1
    scale = ((hi - lo) / levels).to(scale_dtype).clamp_min(MIN_SCALE)
    zero = lo.to(scale_dtype) if zero_point == "float" else integer_zero(lo, scale).to(scale_dtype)
    codes = torch.round((xf - zero.float()) / scale.float()).clamp_(0, levels).to(torch.uint8)
    return codes, scale, zero


def integer_zero(lo: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The offset -s * round(-lo / s) of an integer zero point, float32 (scale already rounded as stored)."""
    s = scale.float()
    return -s * torch.round(-lo.float() / s)


def asym_dequantize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """x_hat = q * s + zero, in float32 (broadcast over the group axis)."""
    return codes.float() * scale.float() + zero.float()


def codes_per_word(bits: int) -> int:
    """How many `bits`-wide codes fit in one int32 word (2 -> 16, 3 -> 10, 4 -> 8)."""
    if bits not in (1, 2, 3, 4, 8):
        raise ValueError(f"bits must be one of 1, 2, 3, 4, 8, got {bits}")
    return 32 // bits


def pack_codes(codes: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Pack unsigned codes along `dim` into int32 words: code i of a word sits at bits [i*B, (i+1)*B).

    The size of `dim` must be a multiple of 32 // bits. Output: int32, `dim` shrunk by that factor.
    """
    per = codes_per_word(bits)
    dim = dim % codes.dim()
    n = codes.shape[dim]
    if n % per:
        raise ValueError(f"cannot pack {n} codes of {bits} bits along dim {dim}: need a multiple of {per}")
    c = codes.movedim(dim, -1).to(torch.int64)
    c = c.reshape(*c.shape[:-1], n // per, per)
    shifts = torch.arange(per, device=codes.device, dtype=torch.int64) * bits
    words = (c << shifts).sum(-1)
    # Wrap to the int32 range (bit 31 set -> negative), keeping the bit pattern.
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    # contiguous: the kernels read the words as laid out (a moved-dim view cost the Triton decode a copy per call)
    return words.movedim(-1, dim).contiguous()


def unpack_codes(words: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Inverse of pack_codes: int32 words -> uint8 codes, `dim` grown by 32 // bits."""
    per = codes_per_word(bits)
    dim = dim % words.dim()
    w = words.movedim(dim, -1)
    # codes never straddle a byte: read bytes (little-endian) through a lookup table
    if 8 % bits == 0 and sys.byteorder == "little":
        table = _byte_table(bits, w.device)
        c = table[w.contiguous().view(torch.uint8).long()]
    else:
        shifts = torch.arange(per, device=words.device, dtype=torch.int32) * bits
        c = (w.unsqueeze(-1) >> shifts) & (2**bits - 1)  # arithmetic shift is fine: the mask drops sign bits
    return c.reshape(*w.shape[:-1], -1).to(torch.uint8).movedim(-1, dim)


def tensor_cache(maxsize: int):
    """functools.lru_cache for functions that return tensors (or tuples of them), made as normal tensors even when
    first asked for under torch.inference_mode: a cached inference tensor would break any later computation that
    autograd records."""

    def wrap(fn):
        @functools.lru_cache(maxsize=maxsize)
        @functools.wraps(fn)
        def cached(*args, **kwargs):
            with torch.inference_mode(False):
                return fn(*args, **kwargs)

        return cached

    return wrap


@tensor_cache(maxsize=16)
def _byte_table(bits: int, device) -> torch.Tensor:
    """[256, 8 // bits] uint8: the codes held by each byte value, lowest bits first."""
    per = 8 // bits
    b = torch.arange(256, dtype=torch.int32).unsqueeze(-1)
    return ((b >> (torch.arange(per, dtype=torch.int32) * bits)) & (2**bits - 1)).to(torch.uint8).to(device)


@tensor_cache(maxsize=16)
def _hadamard_cpu(d: int) -> torch.Tensor:
    if d < 1 or d & (d - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {d}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def hadamard(d: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """Normalized Sylvester Walsh-Hadamard matrix H_d / sqrt(d) in natural order (symmetric, H @ H = I).

    One tensor per (d, device, dtype), shared: read it, never write it. (A fresh copy to a GPU per call was a
    synchronous host-to-device copy: each layer of each row of a padded prefill waited for the GPU.)"""
    return _hadamard_on(d, torch.device("cpu" if device is None else device), dtype)


@tensor_cache(maxsize=64)
def _hadamard_on(d: int, device: torch.device, dtype) -> torch.Tensor:
    return _hadamard_cpu(d).to(device=device, dtype=dtype)


def random_orthogonal(d: int, seed: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """A fixed random orthogonal matrix: QR of a seeded standard Gaussian, signs fixed by diag(R)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(d, d, generator=g, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
    return q.to(device=device, dtype=dtype)


def _normal_pdf(x):
    return math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _normal_cdf(x):
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


@functools.lru_cache(maxsize=8)
def lloyd_max_normal(bits: int, iters: int = 500) -> tuple[float, ...]:
    """Lloyd-Max centroids of the standard normal N(0, 1) for 2^bits levels, ascending.

    Iterates: thresholds = midpoints of centroids; centroid = E[X | X in cell] =
    (pdf(a) - pdf(b)) / (cdf(b) - cdf(a)). 2 bits converge to +-0.4528, +-1.5104.
    """
    n = 2**bits
    c = [(-2.0 + 4.0 * (i + 0.5) / n) for i in range(n)]
    for _ in range(iters):
        t = [-math.inf] + [(c[i] + c[i + 1]) / 2 for i in range(n - 1)] + [math.inf]
        c = [
            ((_normal_pdf(t[i]) if t[i] > -math.inf else 0.0) - (_normal_pdf(t[i + 1]) if t[i + 1] < math.inf else 0.0))
            / (_normal_cdf(t[i + 1]) - _normal_cdf(t[i]))
            for i in range(n)
        ]
    return tuple(c)


def nearest_centroid(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Index of the nearest centroid (ascending 1-D tensor) for every element of x, as uint8."""
    mids = (centroids[1:] + centroids[:-1]) / 2
    return torch.bucketize(x.contiguous(), mids).to(torch.uint8)


def pack_bitstream(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack codes along the last dim as one dense bitstream (no bits wasted between codes):
    code i occupies stream bits [i*B, (i+1)*B), stream bit j lives in word j // 32 at bit j % 32.
    Output int32 [..., ceil(n*B / 32)]. Used where n*B is not a multiple of 32 // B codes (3-bit parts).
    """
    n = codes.shape[-1]
    shifts = torch.arange(bits, device=codes.device, dtype=torch.int64)
    stream = ((codes.to(torch.int64).unsqueeze(-1) >> shifts) & 1).reshape(*codes.shape[:-1], n * bits)
    pad = (-stream.shape[-1]) % 32
    stream = torch.nn.functional.pad(stream, (0, pad))
    stream = stream.reshape(*codes.shape[:-1], -1, 32)
    words = (stream << torch.arange(32, device=codes.device, dtype=torch.int64)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_bitstream(words: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of pack_bitstream: the first n codes, uint8 [..., n]."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    stream = (w.unsqueeze(-1) >> torch.arange(32, device=words.device, dtype=torch.int64)) & 1
    stream = stream.reshape(*words.shape[:-1], -1)[..., : n * bits].reshape(*words.shape[:-1], n, bits)
    weights = torch.arange(bits, device=words.device, dtype=torch.int64)
    return (stream << weights).sum(-1).to(torch.uint8)
