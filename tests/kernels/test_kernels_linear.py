"""The decode-time GEMV kernel (quant/kernels/fused_linear.py, csrc/include/oscar_gemv.cuh) against float64, and
fuse_linears on a tiny Qwen3.

Rule for the kernel (GPU): its error against float64 is at most 2x the error of torch's own GEMM (cuBLAS, same
dtypes) against float64, plus a tiny floor. Without a GPU the patching and the fallbacks are checked: a CPU model
must come out bit-identical, since every patched layer takes torch's path there.
"""

from __future__ import annotations

import copy
import importlib
import inspect

import pytest
import torch
import torch.nn.functional as F

from quant.kernels import fused_linear
from tests.kernels.traits_for_tests import ALL


def tiny_qwen3(layers: int = 2):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=128,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).eval()


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).norm() / ref.norm())


def test_allow_listed_mlps_have_the_standard_forward():
    for qualified in ALL.mlp:
        module, _, name = qualified.rpartition(".")
        src = inspect.getsource(getattr(importlib.import_module(module), name).forward)
        assert "self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))" in src, qualified


def test_allow_listed_attentions_project_one_input_in_order():
    for qualified in ALL.attention:
        module, _, name = qualified.rpartition(".")
        src = inspect.getsource(getattr(importlib.import_module(module), name).forward)
        calls = [src.find(f"self.{p}_proj(hidden_states)") for p in "qkv"]
        assert -1 < calls[0] < calls[1] < calls[2], qualified
        assert "hidden_states =" not in src[calls[0] : calls[2]], f"{qualified}: input reassigned in between"


def test_supported_refuses_what_the_kernel_does_not_take():
    w = torch.randn(16, 32, dtype=torch.bfloat16)
    assert not fused_linear.supported(torch.randn(1, 32, dtype=torch.bfloat16), w)  # CPU
    with pytest.raises(ValueError, match="CUDA fp16/bf16"):
        fused_linear.linear(torch.randn(1, 32, dtype=torch.bfloat16), w)
    if torch.cuda.is_available():
        wc = w.cuda()
        x = torch.randn(2, 32, device="cuda", dtype=torch.bfloat16)
        assert fused_linear.supported(x, wc)
        assert not fused_linear.supported(x.float(), wc)  # dtype
        assert not fused_linear.supported(x[:, :30], wc[:, :30].contiguous())  # K % 8
        assert not fused_linear.supported(torch.randn(9, 32, device="cuda", dtype=torch.bfloat16), wc)  # > 8 tokens
        assert not fused_linear.supported(x, wc.t().contiguous().t())  # non-contiguous weight
        with torch.enable_grad():
            assert not fused_linear.supported(x, wc.clone().requires_grad_())  # autograd


def test_rows_per_cta(monkeypatch):
    import quant.kernels.common as common

    monkeypatch.setattr(common, "num_sms", lambda device: 132)
    fused_linear._default_rows.cache_clear()  # cached per shape and device
    dev = torch.device("cuda")
    assert fused_linear.rows_per_cta(4096, dev) == 4  # 1024 CTAs
    assert fused_linear.rows_per_cta(1024, dev) == 1  # k/v of Qwen3-8B: spread over every SM
    assert fused_linear.rows_per_cta(2048, dev) == 2
    monkeypatch.setattr(fused_linear, "FORCED_ROWS", 2)
    assert fused_linear.rows_per_cta(4096, dev) == 2
    fused_linear._default_rows.cache_clear()  # leave no entry computed with the fake SM count


def test_fuse_linears_counts_idempotent_and_cpu_unchanged():
    model, class_forward = tiny_qwen3(), torch.nn.Linear.forward
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
        counts = fused_linear.fuse_linears(model, ALL)
        after = model(ids).logits
    assert counts == {"linear": 2 * 4 + 1, "mlp": 2, "qkv": 2}  # o, gate, up, down per layer, lm_head; MLPs; q/k/v
    assert torch.equal(before, after)  # CPU: torch's path everywhere
    assert fused_linear.fuse_linears(model, ALL) == {"linear": 0, "mlp": 0, "qkv": 0}
    assert torch.nn.Linear.forward is class_forward and "forward" in vars(model.lm_head)  # instances only
    clone = copy.deepcopy(model)
    assert clone.lm_head.forward.__self__ is clone.lm_head  # the copy multiplies by its own weights
    assert clone.model.layers[0].mlp.forward.__self__ is clone.model.layers[0].mlp
    attn = clone.model.layers[0].self_attn
    assert attn.q_proj.oscar_qkv[0] is attn.k_proj and attn.k_proj.oscar_stash[0] is attn.q_proj.oscar_qkv[2]


def test_fuse_linears_leaves_hooked_and_other_modules_alone():
    class Hooked(torch.nn.Linear):  # a subclass: maybe quantized, its forward is its own
        pass

    hooked = torch.nn.Linear(8, 8)
    hooked.forward = lambda x: x  # what accelerate's hooks do: an instance forward
    gelu_mlp = tiny_qwen3(1).model.layers[0].mlp
    gelu_mlp.act_fn = torch.nn.GELU()
    model = torch.nn.ModuleList([hooked, Hooked(8, 8), gelu_mlp])
    counts = fused_linear.fuse_linears(model, ALL)
    assert counts == {"linear": 3, "mlp": 0, "qkv": 0}  # only gelu_mlp's three plain Linears
    assert "forward" not in vars(model[1]) and "forward" not in vars(gelu_mlp)


def test_a_failed_build_falls_back_with_one_warning(monkeypatch):
    from quant.kernels.cuda import loader

    def broken():
        raise RuntimeError("nvcc not found")

    monkeypatch.setattr(loader, "load_layers", broken)
    monkeypatch.setattr(loader, "_LAYERS_FAILED", [])
    with pytest.warns(UserWarning, match="did not build.*fused_linear=off"):
        assert fused_linear._kernel_ready() is False
    assert fused_linear._kernel_ready() is False  # remembered, no second warning or build


@pytest.mark.cuda_kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,n,k", [(1, 1, 8), (3, 1000, 136), (8, 4099, 4096), (5, 257, 12296), (2, 1024, 4096)])
@pytest.mark.parametrize("rows", [1, 2, 4])
def test_gemv_matches_float64(dtype, m, n, k, rows):
    g = torch.Generator().manual_seed(m * n + k + rows)
    x_wide = torch.randn(m, k + 8, generator=g).to(dtype).cuda()
    x = x_wide[:, 8:]  # a view: row stride k + 8, offset 16 bytes
    w = (torch.randn(n, k, generator=g) * k**-0.5).to(dtype).cuda()
    bias = torch.randn(n, generator=g).to(dtype).cuda() if n % 2 else None
    out = fused_linear.linear(x, w, bias, rows=rows)
    ref = x.double() @ w.double().t() + (0 if bias is None else bias.double())
    assert out.shape == (m, n) and out.dtype == dtype and torch.isfinite(out).all()
    err, budget = rel(out, ref), rel(F.linear(x, w, bias), ref)
    assert err <= 2 * budget + 1e-7, f"kernel error {err:.2e} > 2 x cuBLAS error {budget:.2e}"


@pytest.mark.cuda_kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,n,k,rows", [(1, 12288, 4096, 4), (4, 300, 520, 1), (7, 999, 1024, 2)])
def test_silu_mul_matches_float64(dtype, m, n, k, rows):
    g = torch.Generator().manual_seed(m + n + k)
    x = torch.randn(1, m, k, generator=g).to(dtype).cuda()  # [B, L, K] as a model passes it
    wg, wu = ((torch.randn(n, k, generator=g) * 2 * k**-0.5).to(dtype).cuda() for _ in range(2))
    out = fused_linear.silu_mul(x, wg, wu, rows=rows)
    xd = x.double()
    ref = F.silu(xd @ wg.double().t()) * (xd @ wu.double().t())
    assert out.shape == (1, m, n) and out.dtype == dtype
    err, budget = rel(out, ref), rel(F.silu(F.linear(x, wg)) * F.linear(x, wu), ref)
    assert err <= 2 * budget + 1e-7, f"kernel error {err:.2e} > 2 x torch error {budget:.2e}"


@pytest.mark.cuda_kernels
@pytest.mark.parametrize("m", [1, 2, 5])
def test_one_launch_of_three_weights_equals_three_launches(m):
    # each output's sum is the same threads' partial sums reduced in the same order, whatever the CTA's rows or
    # segment: bit-identical to separate calls
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, 520, generator=g).to(torch.bfloat16).cuda()
    ws = [(torch.randn(n, 520, generator=g) / 23).to(torch.bfloat16).cuda() for n in (300, 77, 77)]
    bs = [None, torch.randn(77, generator=g).to(torch.bfloat16).cuda(), None]
    together = fused_linear.linears(x, ws, bs)
    for out, w, b in zip(together, ws, bs):
        assert torch.equal(out, fused_linear.linear(x, w, b))
        assert rel(out, x.double() @ w.double().t() + (0 if b is None else b.double())) < 1e-2


@pytest.mark.cuda_kernels
def test_gemv_replays_in_a_cuda_graph():
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16) / 64
    fused_linear.linear(x, w)  # build and warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_linear.linear(x, w)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fused_linear.linear(x, w))


@pytest.mark.cuda_kernels
def test_fused_model_decode_matches_on_cuda():
    model = tiny_qwen3(3).to("cuda", torch.bfloat16)
    ids = torch.randint(0, 128, (2, 17), device="cuda")
    with torch.no_grad():
        before = model(ids).logits
        ref = model.generate(ids, max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True)
        assert fused_linear.fuse_linears(model, ALL) == {"linear": 3 * 4 + 1, "mlp": 3, "qkv": 3}
        after = model(ids).logits  # a prefill: torch's path, unchanged
        out = model.generate(ids, max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True)
    assert torch.equal(before, after)
    for a, b in zip(ref.logits, out.logits):  # decode steps of 2 tokens: the kernel's path
        assert rel(b.float(), a.double()) < 2e-2


@pytest.mark.cuda_kernels
def test_fused_qwen2_with_qkv_bias_matches_on_cuda():
    # Qwen2's q/k/v carry biases: the three-segment launch adds each its own
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=128,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # transformers zero-inits biases: make them count
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_()
        ids = torch.randint(0, 128, (1, 11), device="cuda")
        ref = model.generate(ids, max_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True)
        assert fused_linear.fuse_linears(model, ALL) == {"linear": 2 * 4 + 1, "mlp": 2, "qkv": 2}
        out = model.generate(ids, max_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True)
    for a, b in zip(ref.logits, out.logits):
        assert rel(b.float(), a.double()) < 2e-2
