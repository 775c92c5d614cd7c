"""A left-padded batch stores each sequence as it would be stored alone (quant/rows.py): greedy tokens of every
row equal its batch-1 tokens for every method on the reference path, and on the kernel path (Triton, interpreted
on the CPU) for OScaR and BF16's fixed buffers."""
from __future__ import annotations

import pytest
import torch
import transformers

import quant
from quant.kernels import KernelOptions
from quant.rows import RowsLayer, left_pads

PAD = 0


def tiny_model():
    cfg = transformers.Qwen3Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   max_position_embeddings=1024, pad_token_id=PAD, eos_token_id=1, bos_token_id=2)
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(cfg).eval()


PROMPTS = [torch.randint(3, 96, (n,), generator=torch.Generator().manual_seed(n)) for n in (140, 61)]


def greedy(model, method, prompts, kernels, new=8):
    """New tokens [B, new] of a left-padded batch of `prompts` with a fresh cache of `method`."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):], mask[b, width - len(p):] = p, 1
    # RotateKV calibrates on text through a tokenizer this tiny model lacks; its sinks and rotation still apply
    overrides = {"calibrate": False} if method == "rotatekv" else {}
    cache = quant.make_cache(method, model, kernels=kernels, **overrides)
    cache.set_padding(mask)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, pad_token_id=PAD)
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
    batched, cache = greedy(model, method, PROMPTS, triton)
    assert cache.state.fast_decode
    for b, prompt in enumerate(PROMPTS):
        alone, _ = greedy(model, method, [prompt], triton)
        assert torch.equal(batched[b], alone[0]), (method, b)
    model.set_attn_implementation("sdpa")


def test_left_padding_only():
    assert left_pads(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])) == [2, 0]
    with pytest.raises(ValueError, match="left-padded.*padding_side='left'"):
        left_pads(torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]))
