"""A left-padded batch stores each sequence as it would be stored alone (quant/rows.py): greedy tokens of every
row equal its batch-1 tokens for every method on the reference path, and on the kernel path (Triton, interpreted
on the CPU) for OScaR and BF16's fixed buffers."""

from __future__ import annotations

import pytest
import torch
import transformers

import quant
from quant.engine import FixedStepRows
from quant.kernels import KernelOptions
from quant.rows import RowsLayer, left_pads
from tests.kernels.traits_for_tests import ALL

PAD = 0


def tiny_model():
    cfg = transformers.Qwen3Config(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        pad_token_id=PAD,
        eos_token_id=1,
        bos_token_id=2,
    )
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(cfg).eval()


PROMPTS = [torch.randint(3, 96, (n,), generator=torch.Generator().manual_seed(n)) for n in (140, 61)]
# Windows of 125, 124 and 61 tokens after the prompt: the first two rows flush at decode steps 3 and 4, the third
# at none of the 8; the fourth row packed nothing (its 40 tokens stay in the window).
STAGGERED = [torch.randint(3, 96, (n,), generator=torch.Generator().manual_seed(n)) for n in (253, 124, 189, 40)]


def greedy(model, method, prompts, kernels, new=8, fixed_shape=False):
    """New tokens [B, new] of a left-padded batch of `prompts` with a fresh cache of `method`. fixed_shape: take the
    fixed-shape decode steps on the CPU with the torch backend (the kernels' cache update, the reference attention)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :], mask[b, width - len(p) :] = p, 1
    # RotateKV calibrates on text through a tokenizer this tiny model lacks; its sinks and rotation still apply
    overrides = {"calibrate": False} if method == "rotatekv" else {}
    prep = quant.prepare_model(model, quant.get_method(method, **overrides), kernels, ALL)
    cache = prep.make_cache()
    if fixed_shape:
        from quant.kernels.hf_decode import register

        model.set_attn_implementation(register())
        cache.state.fast_decode = True
    cache.set_padding(mask)
    try:
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=mask,
                past_key_values=cache,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=PAD,
            )
    finally:
        prep.undo()
        model.set_attn_implementation("sdpa")
    return out[:, width:], cache


@pytest.mark.parametrize("method", quant.list_methods())
def test_padded_batch_gives_each_prompt_its_batch1_tokens(method):
    model = tiny_model()
    torch_path = KernelOptions(backend="torch")
    batched, cache = greedy(model, method, PROMPTS, torch_path)
    assert all(isinstance(layer, RowsLayer) for layer in cache.layers)
    for b, prompt in enumerate(PROMPTS):
        alone, single = greedy(model, method, [prompt], torch_path)
        assert torch.equal(batched[b], alone[0]), (method, b)
        # the same codes and windows, pads never stored
        assert cache.row(b).nbytes() == single.nbytes() and cache.row(b).get_seq_length() == single.get_seq_length()
    model.set_attn_implementation("sdpa")


@pytest.mark.parametrize("method", ["oscar", "bf16"])
def test_padded_batch_on_the_kernel_path(method):
    model = tiny_model()
    triton = KernelOptions(backend="triton")
    batched, cache = greedy(model, method, STAGGERED, triton)
    assert cache.state.fast_decode and cache.layers[0].stacked is not None
    assert isinstance(cache.layers[0], FixedStepRows)
    for b, prompt in enumerate(STAGGERED):
        alone, _ = greedy(model, method, [prompt], triton)
        assert torch.equal(batched[b], alone[0]), (method, b)
    model.set_attn_implementation("sdpa")


@pytest.mark.parametrize("method", ["oscar", "bf16"])
def test_padded_batch_decodes_as_one_stacked_layer(method):
    """On the fixed-shape path the rows move into one layer of batch B with per-sequence lengths (one attention
    launch per layer), each row flushing at its own step: the same tokens and the same stored bytes as alone."""
    model = tiny_model()
    torch_path = KernelOptions(backend="torch")
    batched, cache = greedy(model, method, STAGGERED, torch_path, fixed_shape=True)
    layer = cache.layers[0]
    assert isinstance(layer, RowsLayer) and layer.stacked is not None and layer.stacked.batch == len(STAGGERED)
    for b, prompt in enumerate(STAGGERED):
        alone, single = greedy(model, method, [prompt], torch_path, fixed_shape=True)
        assert torch.equal(batched[b], alone[0]), (method, b)
        assert cache.row(b).nbytes() == single.nbytes() and cache.row(b).get_seq_length() == single.get_seq_length()
        if method == "oscar":  # the same codes, the flushed blocks included
            mine, its = cache.row(b).layers[1], single.layers[1]
            for a, c in ((mine.k_q, its.k_q), (mine.v_q, its.v_q)):
                assert (a is None) == (c is None) and (a is None or torch.equal(a.codes, c.codes))
            torch.testing.assert_close(mine.k_res, its.k_res)  # the batched model's K: float32 rounding apart
    model.set_attn_implementation("sdpa")


def test_stacked_layer_graph_protocol():
    """The stacked layer's steps are the same device work each time (graph_ready, an unchanged graph_key across
    flushes) and its host state restores after a failed capture."""
    cfg = tiny_model().config
    cache = quant.make_cache("oscar", config=cfg, kernels=KernelOptions(backend="torch"))
    cache.state.fast_decode = True
    lengths = (130, 254)
    width = max(lengths)
    mask = torch.zeros(2, width, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, width - n :] = 1
    cache.set_padding(mask)
    layer = cache.layers[0]
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(2, 2, width, 64, generator=g)
    layer.update(kv, kv)
    step = torch.randn(2, 2, 1, 64, generator=g)
    assert not layer.graph_ready()  # the first step stacks the rows: eager
    layer.update(step, step)
    key = layer.graph_key()
    assert layer.graph_ready() and layer.graph_variant() == (True,)  # the next step fills row 1's window
    saved = layer.host_state()
    layer.update(step, step)  # row 1's window (127 + 1) fills: it flushes on the device, in place
    assert layer.stacked._n == [128, 256] and layer.stacked._w == [4, 0]
    assert layer.graph_key() == key and layer.graph_ready() and layer.graph_variant() == (False,)
    layer.set_host_state(saved)
    assert layer.stacked._n == [128, 128] and layer.stacked._w == [3, 127] and layer.graph_variant() == (True,)


def test_left_padding_only():
    assert left_pads(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])) == [2, 0]
    with pytest.raises(ValueError, match="left-padded.*padding_side='left'"):
        left_pads(torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]))
