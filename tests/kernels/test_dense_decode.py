"""quant.kernels.triton_dense: BF16's batch-invariant decode attention, against a float64 reference on awkward
shapes (lengths off the block and split sizes, GQA groups of 1 to 7, a split past a short row), and the invariance
itself: a row alone, in a buffer of another capacity, gives the same bits. On the CPU under Triton's interpreter in
float32 and float16 (its bf16 casts are not the GPU's), in bfloat16 on a GPU."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from quant.kernels.triton_dense import SPLIT, dense_decode  # noqa: E402

CASES = [  # batch, query heads, KV heads, head dim, capacity, lengths
    (3, 8, 2, 64, SPLIT + 76, [1, SPLIT + 6, 500]),
    (2, 7, 1, 128, 70, [70, 3]),
    (1, 4, 4, 64, 2 * SPLIT, [2 * SPLIT]),
]


def reference(q, k, v, lengths, scale):
    b, hq, _, d = q.shape
    g = hq // k.shape[1]
    out = torch.zeros(b, hq, 1, d, dtype=torch.float64)
    for i in range(b):
        n = int(lengths[i])
        kk, vv = (x[i, :, :n].double().repeat_interleave(g, 0) for x in (k, v))
        out[i] = torch.softmax((q[i].double() @ kk.transpose(-1, -2)) * scale, -1) @ vv
    return out


def _dtypes():
    if torch.cuda.is_available():
        return [("cuda", torch.bfloat16, 2e-2)]
    return [("cpu", torch.float32, 1e-5), ("cpu", torch.float16, 3e-3)]


@pytest.mark.parametrize("device,dtype,tol", _dtypes())
@pytest.mark.parametrize("b,hq,hkv,d,cap,lengths", CASES)
def test_dense_decode_matches_float64_and_each_row_alone(device, dtype, tol, b, hq, hkv, d, cap, lengths):
    g = torch.Generator().manual_seed(cap + hq)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for h, n in ((hq, 1), (hkv, cap), (hkv, cap)))
    q, k, v = (x.to(device=device, dtype=dtype) for x in (q, k, v))
    lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    out = dense_decode(q, k, v, lens, d**-0.5)
    ref = reference(q.cpu(), k.cpu(), v.cpu(), lens.cpu(), d**-0.5)
    assert out.shape == q.shape and out.dtype == dtype
    assert (out.cpu().double() - ref).abs().max() / ref.abs().max() < tol
    for i, n in enumerate(lengths):  # alone, in a buffer of another capacity (and so another split count)
        k2, v2 = (torch.zeros(1, hkv, n + SPLIT + 5, d, device=device, dtype=dtype) for _ in range(2))
        k2[:, :, :n], v2[:, :, :n] = k[i : i + 1, :, :n], v[i : i + 1, :, :n]
        assert torch.equal(dense_decode(q[i : i + 1], k2, v2, lens[i : i + 1], d**-0.5), out[i : i + 1])


def test_dense_decode_refuses_what_it_cannot_take():
    q = torch.randn(1, 40, 1, 64)
    kv = torch.randn(1, 2, 8, 64)
    with pytest.raises(ValueError, match="Hq / Hkv <= 16"):
        dense_decode(q, kv, kv, torch.tensor([8], dtype=torch.int32), 0.125)
