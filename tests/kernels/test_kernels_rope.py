"""The Triton RoPE against transformers' apply_rotary_pos_emb, bit for bit; fuse_rotary on a tiny Qwen3.

Without a GPU the kernel runs under the Triton interpreter (TRITON_INTERPRET=1, set before triton is imported).
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")

from quant.kernels import triton_rope  # noqa: E402
from quant.kernels.patches import Patches  # noqa: E402
from tests.kernels.traits_for_tests import ALL, families  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def hf_rope(family: str = "qwen3"):
    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    fn = mod.apply_rotary_pos_emb
    return getattr(fn, "oscar_original", fn)


def inputs(b, hq, hk, length, d, dtype, seed, layout="bhld", cos_batch=None):
    """q/k with random values, cos/sin of real angles (positions x inverse frequencies, as transformers builds them);
    layout "blhd": q and k are transposed views of [B, L, H, D] tensors (what the attention modules pass)."""
    g = torch.Generator().manual_seed(seed)
    if layout == "blhd":
        q = (2 * torch.randn(b, length, hq, d, generator=g)).to(dtype).to(DEV).transpose(1, 2)
        k = (2 * torch.randn(b, length, hk, d, generator=g)).to(dtype).to(DEV).transpose(1, 2)
    else:
        q = (2 * torch.randn(b, hq, length, d, generator=g)).to(dtype).to(DEV)
        k = (2 * torch.randn(b, hk, length, d, generator=g)).to(dtype).to(DEV)
    cb = b if cos_batch is None else cos_batch
    pos = torch.randint(0, 200_000, (cb, length, 1), generator=g).double()
    inv = 1e6 ** (-torch.arange(0, d, 2).double() / d)
    ang = torch.cat([pos * inv, pos * inv], dim=-1)
    return q, k, ang.cos().to(dtype).to(DEV), ang.sin().to(dtype).to(DEV)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "b,hq,hk,length,d,layout,cos_batch",
    [
        (3, 8, 2, 1, 128, "blhd", None),  # a decode step, GQA 4, transposed views
        (2, 4, 4, 37, 64, "bhld", None),  # a prefill of odd length
        (2, 6, 3, 5, 80, "blhd", 1),  # head_dim 80 (a masked block), cos shared by the batch
        (1, 32, 8, 3, 128, "bhld", None),  # Qwen3-8B heads
    ],
)
def test_rope_gives_transformers_bits(dtype, b, hq, hk, length, d, layout, cos_batch):
    q, k, cos, sin = inputs(b, hq, hk, length, d, dtype, seed=b + d + length, layout=layout, cos_batch=cos_batch)
    oq, ok = triton_rope.rope(q, k, cos, sin)
    rq, rk = hf_rope()(q, k, cos, sin)
    assert oq.shape == rq.shape and oq.dtype == rq.dtype
    same_layout = lambda a, r: all(n == 1 or x == y for n, x, y in zip(a.shape, a.stride(), r.stride()))  # noqa: E731
    assert same_layout(oq, rq) and same_layout(ok, rk)  # torch's elementwise ops keep the input's layout
    assert torch.equal(oq, rq) and torch.equal(ok, rk)
    assert not torch.equal(oq, q)  # it did rotate


def test_every_allowed_family_is_the_same_formula():
    q, k, cos, sin = inputs(2, 4, 2, 3, 64, torch.bfloat16, seed=7)
    oq, ok = triton_rope.rope(q, k, cos, sin)
    for family in families(ALL.rope):
        rq, rk = hf_rope(family)(q, k, cos, sin)
        assert torch.equal(oq, rq) and torch.equal(ok, rk), family


def test_rope_rejects_what_it_does_not_take():
    q, k, cos, sin = inputs(1, 2, 2, 4, 64, torch.bfloat16, seed=1)
    assert triton_rope.supported(q, k, cos, sin)
    assert not triton_rope.supported(q.float(), k.float(), cos.float(), sin.float())  # fp32: transformers' own
    assert not triton_rope.supported(q, k, cos, sin, unsqueeze_dim=2)
    assert not triton_rope.supported(q, k[:, :, :3], cos, sin)
    with pytest.raises(ValueError, match="fp16/bf16"):
        triton_rope.rope(q.float(), k.float(), cos.float(), sin.float())


def test_fuse_rotary_patches_the_family_once_and_keeps_cpu_on_transformers(monkeypatch):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.models.qwen3 import modeling_qwen3

    monkeypatch.setattr(modeling_qwen3, "apply_rotary_pos_emb", modeling_qwen3.apply_rotary_pos_emb)  # restored after
    original = modeling_qwen3.apply_rotary_pos_emb
    cfg = Qwen3Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        before = model(ids).logits
    patches = Patches()
    assert triton_rope.fuse_rotary(model, ALL, patches=patches) == ["transformers.models.qwen3.modeling_qwen3"]
    assert modeling_qwen3.apply_rotary_pos_emb.oscar_original is original
    assert triton_rope.fuse_rotary(model, ALL, patches=patches) == []  # idempotent
    with torch.no_grad():
        after = model(ids).logits  # CPU tensors: transformers' own path
    assert torch.equal(before, after)
    patches.undo()  # the hooks go, and with the last patched model the dispatcher: transformers' function is back
    assert modeling_qwen3.apply_rotary_pos_emb is original
    assert not any(m._forward_hooks or m._forward_pre_hooks or "_oscar_rope_hooks" in vars(m) for m in model.modules())


def test_rope_choice_is_per_model_not_global(monkeypatch):
    """Two models of one family patched with different launches: each attention runs with its own model's choice,
    and a call outside any patched attention gets transformers' function."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.models.qwen3 import modeling_qwen3

    monkeypatch.setattr(modeling_qwen3, "apply_rotary_pos_emb", modeling_qwen3.apply_rotary_pos_emb)
    cfg = Qwen3Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    )
    a, b = Qwen3ForCausalLM(cfg).eval(), Qwen3ForCausalLM(cfg).eval()
    pa, pb = Patches(), Patches()
    triton_rope.fuse_rotary(a, ALL, cuda_launch=True, patches=pa)
    triton_rope.fuse_rotary(b, ALL, cuda_launch=False, patches=pb)
    seen = []
    for model in (a, b):
        attn = model.model.layers[0].self_attn
        attn.register_forward_pre_hook(lambda *_: seen.append(triton_rope._LAUNCH.get()))  # after the patch's own
    ids = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        a(ids), b(ids)
    assert seen == [True, False] and triton_rope._LAUNCH.get() is None
    pa.undo()
    assert modeling_qwen3.apply_rotary_pos_emb.oscar_original is not None  # b still uses the dispatcher
    pb.undo()
    assert not hasattr(modeling_qwen3.apply_rotary_pos_emb, "oscar_original")


@pytest.mark.gpu
def test_fused_rotary_model_logits_are_unchanged_on_gpu(monkeypatch):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.models.qwen3 import modeling_qwen3

    monkeypatch.setattr(modeling_qwen3, "apply_rotary_pos_emb", modeling_qwen3.apply_rotary_pos_emb)
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
    ids = torch.randint(0, 128, (2, 33), device="cuda")
    with torch.no_grad():
        before = model(ids).logits
        triton_rope.fuse_rotary(model, ALL)
        after = model(ids).logits
    assert torch.equal(before, after)
