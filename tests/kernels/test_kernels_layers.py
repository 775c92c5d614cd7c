"""The CUDA RMSNorm and RoPE (csrc/include/oscar_rmsnorm.cuh, oscar_rope.cuh; launched by quant.kernels.cuda) against
transformers' own modules and float64, and the dispatch that puts them under patched models in place of Triton's.

Same rules as the Triton kernels' tests (tests/kernels/test_kernels_norm.py, test_kernels_rope.py): the norm's error
against float64 is at most 2x transformers' own; RoPE gives transformers' bits. The layout checks that decide between
the CUDA and Triton kernels run on the CPU too.
"""

from __future__ import annotations

import pytest
import torch

from quant.kernels import cuda as kcuda
from tests.kernels.traits_for_tests import ALL

DEV = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6


def inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(shape, generator=g)).to(dtype)
    w = (1 + 0.5 * torch.randn(shape[-1], generator=g)).to(dtype)
    return x.to(DEV), w.to(DEV)


def hf_norm_out(x, w):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    norm = Qwen3RMSNorm(x.shape[-1], eps=EPS).to(device=w.device, dtype=w.dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
        return norm(x)


def err64(a, x, w):
    h = x.double()
    ref = w.double() * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return (a.double() - ref).abs().max().item()


def check_norm(x, w):
    out, hf = kcuda.rms_norm(x, w, EPS), hf_norm_out(x, w)
    assert out.shape == hf.shape and out.dtype == hf.dtype and out.is_contiguous() and torch.isfinite(out).all()
    assert err64(out, x, w) <= 2 * err64(hf, x, w) + 1e-12
    assert (out != hf).float().mean().item() < 0.02  # one rounding per step: nearly every element agrees bit for bit
    return out


def test_norm_layout_check():  # runs on the CPU: the check alone, no launch
    x = torch.zeros(4, 3, 128, dtype=torch.bfloat16)
    w = torch.ones(128, dtype=torch.bfloat16)
    assert kcuda.rms_norm_rows(x, w).shape == (12, 128)
    assert kcuda.rms_norm_rows(x[..., :64], w[:64]).stride() == (128, 1)  # strided rows
    assert kcuda.rms_norm_rows(x[:, :2], w) is None  # leading dims that do not collapse to one row stride
    assert kcuda.rms_norm_rows(torch.zeros(2, 256, dtype=torch.bfloat16)[:, 128:], w).stride() == (256, 1)
    assert kcuda.rms_norm_rows(torch.zeros(3, 100, dtype=torch.bfloat16), torch.ones(100, dtype=torch.bfloat16)) is None
    assert kcuda.rms_norm_rows(x, w.float()) is None  # mixed dtypes: the Triton kernel's case
    assert kcuda.rms_norm_rows(x.float(), w.float()) is None
    # 16-byte aligned rows only
    assert kcuda.rms_norm_rows(torch.zeros(2, 136, dtype=torch.bfloat16)[:, 4:132], w) is None


def test_rope_layout_check():
    q = torch.zeros(1, 4, 3, 128, dtype=torch.bfloat16)
    cos = torch.zeros(1, 3, 128, dtype=torch.bfloat16)
    assert kcuda.rope_takes(q, q[:, :2], cos, cos)
    assert not kcuda.rope_takes(q[..., :36], q[:, :2, :, :36], cos[..., :36], cos[..., :36])  # D % 8
    odd = torch.zeros(1, 3, 4, 130, dtype=torch.bfloat16)[..., 2:].transpose(1, 2)  # rows 2 elements off
    assert not kcuda.rope_takes(odd, odd, cos, cos)


@pytest.mark.cuda_kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "rows,n",
    [(1, 8), (3, 64), (17, 128), (5, 136), (2, 1000), (1, 4096), (33, 4096), (3, 5120), (2, 16384), (300, 128)],
)
def test_cuda_rms_norm_matches_transformers(rows, n, dtype):
    x, w = inputs((rows, n), dtype, seed=rows * 7 + n)
    check_norm(x, w)


@pytest.mark.cuda_kernels
def test_cuda_rms_norm_views_and_edge_rows():
    x, w = inputs((2, 3, 8, 128), torch.bfloat16, seed=3)
    check_norm(x, w)  # q_norm's [B, L, H, D]
    wide, _ = inputs((17, 256), torch.bfloat16, seed=4)
    check_norm(wide[:, 128:], w)  # strided rows
    check_norm(wide[:, 128:].view(17, 1, 128).transpose(0, 1), w)
    zeros = kcuda.rms_norm(torch.zeros(2, 64, dtype=torch.bfloat16, device="cuda"), w[:64], EPS)
    assert torch.equal(zeros, torch.zeros_like(zeros))  # rsqrt(eps) * 0
    assert kcuda.rms_norm(torch.empty(0, 4, 128, dtype=torch.bfloat16, device="cuda"), w, EPS).shape == (0, 4, 128)
    with pytest.raises(ValueError, match="N % 8"):
        kcuda.rms_norm(x[..., :100], w[:100], EPS)


@pytest.mark.cuda_kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "b,hq,hk,length,d,layout,cos_batch",
    [
        (3, 8, 2, 1, 128, "blhd", None),  # a decode step, GQA 4, transposed views
        (2, 4, 4, 37, 64, "bhld", None),  # a prefill of odd length
        (2, 6, 3, 5, 80, "blhd", 1),  # head_dim 80, cos shared by the batch
        (1, 32, 8, 3, 128, "bhld", None),  # Qwen3-8B heads
        (1, 40, 8, 1, 128, "blhd", None),  # 48 heads x 16 items: several rounds of the CTA's threads
    ],
)
def test_cuda_rope_gives_transformers_bits(dtype, b, hq, hk, length, d, layout, cos_batch):
    from tests.kernels.test_kernels_rope import hf_rope
    from tests.kernels.test_kernels_rope import inputs as rope_inputs

    q, k, cos, sin = rope_inputs(b, hq, hk, length, d, dtype, seed=b + d + length, layout=layout, cos_batch=cos_batch)
    assert kcuda.rope_takes(q, k, cos, sin)
    oq, ok = kcuda.rope(q, k, cos, sin)
    rq, rk = hf_rope()(q, k, cos, sin)
    same_layout = lambda a, r: all(n == 1 or x == y for n, x, y in zip(a.shape, a.stride(), r.stride()))  # noqa: E731
    assert same_layout(oq, rq) and same_layout(ok, rk)  # the input's layout, as torch's elementwise ops keep it
    assert torch.equal(oq, rq) and torch.equal(ok, rk)
    assert not torch.equal(oq, q)


@pytest.mark.cuda_kernels
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_patched_models_take_the_chosen_kernels(monkeypatch, backend):
    """KernelOptions.layer_kernels picks the kernels under patched norms and RoPE; logits stay within bf16 noise of
    transformers' and the greedy tokens of a short decode are the same."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.models.qwen3 import modeling_qwen3

    from quant.kernels import triton_norm, triton_rope

    monkeypatch.setattr(modeling_qwen3, "apply_rotary_pos_emb", modeling_qwen3.apply_rotary_pos_emb)  # restored after
    calls = {"cuda": 0, "triton": 0}
    for mod, name, kind in (
        (kcuda, "rope", "cuda"),
        (triton_rope, "rope", "triton"),
        (triton_norm, "rms_norm", "triton"),
    ):
        real = getattr(mod, name)
        monkeypatch.setattr(
            mod, name, lambda *a, _real=real, _kind=kind: calls.__setitem__(_kind, calls[_kind] + 1) or _real(*a)
        )
    real_load = kcuda.load_layers

    class Counting:  # counts the C++ norm launches of the patched forwards
        def __init__(self, mod):
            self.mod = mod

        def __getattr__(self, name):
            if name == "rms_norm":
                calls["cuda"] += 1
            return getattr(self.mod, name)

    monkeypatch.setattr(kcuda.loader, "load_layers", lambda: Counting(real_load()))  # where rms_norm looks
    cfg = Qwen3Config(
        vocab_size=128,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, 128, (1, 20), device="cuda")
    with torch.no_grad():
        before = model(ids).logits
        ref = model.generate(ids, max_new_tokens=6, do_sample=False)
        triton_norm.fuse_rms_norms(model, ALL, cuda_launch=backend == "cuda")
        triton_rope.fuse_rotary(model, ALL, cuda_launch=backend == "cuda")
        after = model(ids).logits
        out = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert ((after.float() - before.float()).norm() / before.float().norm()).item() < 1e-2
    assert torch.equal(out, ref)
    other = "triton" if backend == "cuda" else "cuda"
    assert calls[backend] > 0 and calls[other] == 0, calls
