"""Triton RMSNorm against float64 and against transformers' own Qwen3RMSNorm; fuse_rms_norms on a tiny Qwen3.

On a machine without a GPU the kernel runs under the Triton interpreter (TRITON_INTERPRET=1, set before
triton is imported). Rule: the kernel's error against float64 is at most 2x the error of transformers'
module (same input and output dtypes) against float64, plus a tiny floor for cases where both are exact.
"""

from __future__ import annotations

import inspect
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")

from quant.kernels import triton_norm  # noqa: E402
from tests.kernels.traits_for_tests import ALL  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6


def hf_norm(n: int, weight: torch.Tensor):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    norm = Qwen3RMSNorm(n, eps=EPS).to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm


def norm_f64(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The formula in float64, no intermediate rounding: weight * x / sqrt(mean(x^2) + eps)."""
    h = x.double()
    return weight.double() * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)


def max_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    return (a.double() - ref).abs().max().item()


def inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(shape, generator=g)).to(dtype)
    w = (1 + 0.5 * torch.randn(shape[-1], generator=g)).to(dtype)
    return x.to(DEV), w.to(DEV)


def check(x: torch.Tensor, w: torch.Tensor):
    out = triton_norm.rms_norm(x, w, EPS)
    with torch.no_grad():
        hf = hf_norm(x.shape[-1], w)(x)
    assert out.shape == hf.shape and out.dtype == hf.dtype and torch.isfinite(out).all()
    ref = norm_f64(x, w)
    err, budget = max_error(out, ref), max_error(hf, ref)
    assert err <= 2 * budget + 1e-12, f"kernel error {err:.2e} > 2 x transformers error {budget:.2e}"
    return out, hf


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n", [64, 100, 128, 4096])
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_rms_norm_matches_transformers(n, rows, dtype):
    x, w = inputs((rows, n), dtype, seed=n * 31 + rows)
    out, hf = check(x, w)
    if dtype != torch.float32:  # one rounding per step, like torch: nearly every element agrees bit for bit
        assert (out != hf).float().mean().item() < 0.02


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rms_norm_head_views(dtype):
    # q_norm's input: [B, T, H, D] heads of a projection. A slice of a fused q|k|v row cannot collapse to
    # one row stride (copied); a slice of each row of a wider [rows, 2D] buffer can (strided rows).
    b, t, h, d = 2, 3, 4, 64
    qkv, _ = inputs((b, t, (h + 2) * d), dtype, seed=5)
    _, w = inputs((1, d), dtype, seed=4)
    q = qkv[..., : h * d].view(b, t, h, d)
    assert not q.is_contiguous()
    check(q, w)
    wide, _ = inputs((17, 2 * d), dtype, seed=6)
    check(wide[:, d:], w)
    check(wide[:, d:].view(17, 1, d).transpose(0, 1), w)  # [1, 17, D]: leading strides of any order


def test_rms_norm_mixed_dtypes_and_zero_rows():
    # A float32 weight on bf16 activations (a model loaded with dtype=auto for its norms): fp32 out, as torch.
    x, _ = inputs((3, 100), torch.bfloat16, seed=7)
    _, w = inputs((3, 100), torch.float32, seed=8)
    check(x, w)
    check(torch.zeros(2, 64, dtype=torch.bfloat16, device=DEV), w[:64].to(torch.bfloat16))
    empty = triton_norm.rms_norm(torch.empty(0, 4, 64, device=DEV), w[:64], EPS)
    assert empty.shape == (0, 4, 64)


def test_rms_norm_rejects_bad_shapes():
    with pytest.raises(ValueError, match="weight"):
        triton_norm.rms_norm(torch.ones(2, 64, device=DEV), torch.ones(32, device=DEV), EPS)
    with pytest.raises(ValueError, match="dtypes"):
        triton_norm.rms_norm(torch.ones(2, 64, dtype=torch.float64, device=DEV), torch.ones(64, device=DEV), EPS)


def test_launch_config_depends_on_n_only():
    assert triton_norm.launch_config(128) == (128, 16, 4)
    assert triton_norm.launch_config(100) == (128, 16, 4)
    assert triton_norm.launch_config(4096) == (4096, 1, 8)
    assert triton_norm.launch_config(16384) == (16384, 1, 16)


def test_allow_list_forwards_match_qwen3():
    # Every listed class must compute what the kernel does: its forward is Qwen3RMSNorm's, verbatim.
    import importlib

    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    reference = inspect.getsource(Qwen3RMSNorm.forward)
    assert "self.weight * hidden_states.to(input_dtype)" in reference
    for qualified in sorted(ALL.norm):
        module, _, name = qualified.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        assert inspect.getsource(cls.forward) == reference, qualified


def tiny_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).eval()


def test_fuse_rms_norms_counts_and_cpu_fallback():
    import copy

    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    class_forward, model = Qwen3RMSNorm.forward, tiny_qwen3()
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
        assert triton_norm.fuse_rms_norms(model, ALL) == 3 * 4 + 1  # per layer: input, post-attention, q, k; final
        after = model(ids).logits
    assert torch.equal(before, after)  # CPU: every norm takes the class's own forward
    assert triton_norm.fuse_rms_norms(model, ALL) == 0  # already patched
    assert Qwen3RMSNorm.forward is class_forward and "forward" in vars(model.model.norm)  # instance only
    clone = copy.deepcopy(model)
    assert clone.model.norm.forward.__self__ is clone.model.norm  # the copy normalizes with its own weight


def test_registry_load_leaves_cpu_models_alone():
    from quant.kernels import patch_model

    model = tiny_qwen3()
    assert patch_model(model, None, ALL).counts == {}  # quant.prepare_model: patched only when the weights are on CUDA
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_fuse_rms_norms_skips_gemma_and_unlisted():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    class MyRMSNorm(torch.nn.Module):  # right name, right attributes, unknown forward
        def __init__(self):
            super().__init__()
            self.weight, self.variance_epsilon = torch.nn.Parameter(torch.ones(8)), 1e-6

    model = torch.nn.Sequential(GemmaRMSNorm(8), MyRMSNorm())
    assert triton_norm.fuse_rms_norms(model, ALL) == 0


@pytest.mark.gpu
def test_fused_model_matches_on_cuda():
    model = tiny_qwen3().to(device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 128, (2, 9), device="cuda")
    with torch.no_grad():
        before = model(ids).logits
        triton_norm.fuse_rms_norms(model, ALL)
        after = model(ids).logits
    # norms agree to a few bf16 roundings; through 3 layers the logits stay within bf16 noise
    assert ((after.float() - before.float()).norm() / before.float().norm()).item() < 1e-2
