"""The decode engine (quant/engine/): every layer class that declares the fixed-step protocol (OScaR and BF16, single
sequences and a padded batch's stacked rows) runs through it on the CPU (torch reference attention) and stores and
attends what the eager path does; quant.prepare_model is one call, undone exactly; quant/kernels/ imports nothing
above it."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch
import transformers

import quant
from quant import engine, fold
from quant.engine import FixedStepLayer, StepKV
from quant.kernels import KernelOptions, decode_attention
from quant.kernels.hf_decode import DenseStep, PackedStep, dense_step_attention
from tests.kernels.traits_for_tests import ALL

HKV, HQ, D = 2, 4, 64
SCALE = D**-0.5


def config(layers=1):
    return transformers.Qwen3Config(
        vocab_size=96,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=HQ,
        num_key_value_heads=HKV,
        head_dim=D,
        max_position_embeddings=1024,
    )


def declared() -> set[type]:
    out, todo = set(), [FixedStepLayer]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("quant."):
                out.add(sub)
            todo.append(sub)
    return out


def test_the_engine_declares_the_protocol_once_for_oscar_and_bf16():
    assert declared() == {
        engine.OScaRStepLayer,
        engine.OScaRRows,
        engine.BF16StepLayer,
        engine.BF16Rows,
        engine.FixedStepRows,
        engine.StacksRows,
    }
    for name in ("oscar", "bf16"):
        assert isinstance(quant.make_cache(name, config=config()).layers[0], engine.StacksRows)
    for name in ("kivi", "turboquant"):
        assert not isinstance(quant.make_cache(name, config=config()).layers[0], FixedStepLayer)
    assert not isinstance(
        quant.make_cache(quant.get_method("oscar", bits=3), config=config()).layers[0], FixedStepLayer
    )  # no kernel decode: the method's own layer


def same_host_state(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.data_ptr() == b.data_ptr()
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_host_state(x, y) for x, y in zip(a, b))
    return a == b


def attend(q: torch.Tensor, out, lengths: list[int] | None = None) -> torch.Tensor:
    """Attention of q [B, HQ, 1, D] over what an update returned: a fixed step, or dense K/V (rows right-aligned over
    their `lengths` when given: a padded batch's eager path)."""
    if isinstance(out, StepKV):
        step = out.step
        if isinstance(step, PackedStep):
            return decode_attention(q, step.kv, SCALE, backend="torch", kv_lens=step.kv_lens, res_lens=step.res_lens)
        assert isinstance(step, DenseStep)
        return dense_step_attention(q, step, SCALE)
    k, v = out
    rows = []
    for b in range(q.shape[0]):
        n = k.shape[-2] if lengths is None else lengths[b]
        kb, vb = (x[b : b + 1, :, x.shape[-2] - n :].repeat_interleave(HQ // HKV, 1).to(q.dtype) for x in (k, v))
        rows.append(torch.nn.functional.scaled_dot_product_attention(q[b : b + 1], kb, vb, scale=SCALE))
    return torch.cat(rows)


@pytest.mark.parametrize("method", ["oscar", "bf16"])
@pytest.mark.parametrize("lengths", [(120,), (121, 70)], ids=["single", "stacked-rows"])
def test_fixed_step_layers_follow_the_protocol_and_the_eager_path(method, lengths):
    g = torch.Generator().manual_seed(len(lengths))
    kernels = KernelOptions(backend="torch")
    fixed, eager = (quant.make_cache(method, config=config(), kernels=kernels) for _ in range(2))
    fixed.state.fast_decode = True  # the fixed-shape steps, driven by hand on the CPU
    width = max(lengths)
    if len(lengths) > 1:
        mask = torch.zeros(len(lengths), width, dtype=torch.long)
        for b, n in enumerate(lengths):
            mask[b, width - n :] = 1
        fixed.set_padding(mask)
        eager.set_padding(mask)
    layer, ref = fixed.layers[0], eager.layers[0]
    assert isinstance(layer, FixedStepLayer)
    prompt = tuple(torch.randn(len(lengths), HKV, width, D, generator=g) for _ in range(2))
    layer.update(*prompt)
    ref.update(*prompt)
    rows = [n for n in lengths]
    replayed = 0
    for _ in range(24):  # OScaR: the first row's window fills at its 128th token, a step packs it
        k, v = (torch.randn(len(lengths), HKV, 1, D, generator=g) for _ in range(2))
        q = torch.randn(len(lengths), HQ, 1, D, generator=g)
        ready = layer.graph_ready()
        if ready:  # what a replay does: the device work ran, the host advances from where it was
            key, variant, saved = layer.graph_key(), layer.graph_variant(), layer.host_state()
        out = layer.update(k, v)
        assert isinstance(out, StepKV) and out.value is None and isinstance(out.step, (PackedStep, DenseStep))
        if ready:
            after = layer.host_state()
            layer.set_host_state(saved)
            assert same_host_state(layer.host_state(), saved)
            layer.advance_host()
            assert same_host_state(layer.host_state(), after), (method, lengths)
            assert layer.graph_key() == key or not layer.graph_ready()  # a step moves no buffer it is bound to
            hash(variant)
            replayed += 1
        rows = [n + 1 for n in rows]
        got = attend(q, out)
        want = attend(q, ref.update(k, v), rows if len(lengths) > 1 else None)
        torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    assert replayed >= 20
    assert len(lengths) == 1 or layer.stacked is not None  # a padded batch decoded as one stacked layer
    assert fixed.nbytes() == eager.nbytes()
    for b in range(len(lengths)):
        # one sequence: the cache is its row
        mine, its = ((c if len(lengths) == 1 else c.row(b)).layers[0] for c in (fixed, eager))
        assert mine.seen == its.seen == lengths[b] + 24
        if method == "oscar":  # the same codes and windows
            assert (mine.k_q is None) == (its.k_q is None) == (lengths[b] + 24 < 128)
            assert mine.k_q is None or torch.equal(mine.k_q.codes, its.k_q.codes)
            assert mine.norms is None or torch.equal(mine.norms, its.norms)
            assert torch.equal(mine.k_res, its.k_res) and torch.equal(mine.v_res, its.v_res)
        else:
            assert torch.equal(mine.keys, its.keys) and torch.equal(mine.values, its.values)


def tiny_llama():
    cfg = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=128,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        attention_bias=True,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def snapshot(model):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        {name: dict(vars(m)) for name, m in model.named_modules()},
        model.config._attn_implementation,
    )


def assert_restored(model, snap):
    weights, attrs, attn = snap
    after = model.state_dict()
    assert all(torch.equal(after[k], v) and after[k].dtype == v.dtype for k, v in weights.items())
    for name, m in model.named_modules():
        assert set(vars(m)) == set(attrs[name]), name
        assert not m._forward_hooks and not m._forward_pre_hooks
    assert model.config._attn_implementation == attn


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_prepare_model_and_undo_restore_the_model_exactly(backend):
    model = tiny_llama()
    snap = snapshot(model)
    kernels = KernelOptions(backend=backend)
    for method in ("bf16", "oscar", "kivi", "oscar"):  # one loaded model, methods one after another
        prep = quant.prepare_model(model, method, kernels, ALL)
        assert prep.values_folded == (method == "oscar") == fold.is_folded(model)
        fast = backend != "torch" and method in ("bf16", "oscar")
        assert prep.fast_decode == fast
        assert model.config._attn_implementation == ("oscar_packed" if fast else snap[2])
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        cache = prep.make_cache()
        assert cache.state.fast_decode == fast and cache.state.values_folded == prep.values_folded
        with torch.no_grad():
            model(torch.randint(0, 96, (1, 20)), past_key_values=cache, use_cache=True)
        assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())  # caches change no weight
        prep.undo()
        prep.undo()  # a second undo does nothing
        assert_restored(model, snap)
        with pytest.raises(ValueError, match="undone"):
            prep.make_cache()


def test_layer_kernels_are_patched_per_model_and_undone(monkeypatch):
    """The layer kernels' patches (instance forwards, RoPE hooks) come off with the undo, on a model whose parameters
    claim CUDA (the patch itself runs no kernel)."""
    pytest.importorskip("triton")
    from transformers.models.llama import modeling_llama

    import quant.kernels as kernels_pkg

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", modeling_llama.apply_rotary_pos_emb)
    original = modeling_llama.apply_rotary_pos_emb
    model = tiny_llama()
    snap = snapshot(model)
    with pytest.MonkeyPatch.context() as cuda:  # patch_model patches CUDA models only
        cuda.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
        patches = kernels_pkg.patch_model(model, KernelOptions(), ALL)
    assert patches.counts == {"rope": 1, "linear": 2 * 4 + 1, "mlp": 2, "qkv": 2, "norm": 2 * 2 + 1}
    assert modeling_llama.apply_rotary_pos_emb.oscar_original is original
    assert "forward" in vars(model.model.norm) and "forward" in vars(model.lm_head)
    patches.undo()
    assert modeling_llama.apply_rotary_pos_emb is original
    assert_restored(model, snap)


def test_make_cache_leaves_the_model_alone():
    model = tiny_llama()
    snap = snapshot(model)
    for method in ("bf16", "kivi", quant.get_method("oscar", value_rotation="online")):
        quant.make_cache(method, model, kernels=KernelOptions(backend="triton"))
    assert_restored(model, snap)
    assert not quant.make_cache("bf16", model, kernels=KernelOptions(backend="triton")).state.fast_decode


def test_kernels_import_nothing_above_them():
    root = pathlib.Path(quant.__file__).parent / "kernels"
    above = ("quant.methods", "quant.engine", "quant.rows", "quant.cache", "quant.prepare", "quant.fold")
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n == m or n.startswith(m + ".") for n in names for m in above), (path.name, names)
