"""quant/methods/oscar_guarded.py: OScaR whose key rotation is chosen per sequence, layer and KV head by rho. rho is
a float64 loop's on awkward shapes; the rule picks the rotation each known case calls for; the stored codes are
OScaR's reference pack of the keys in each head's chosen basis; a padded batch gives each sequence its choices and
tokens alone; the method generates through a prepared model and the runner, and refuses to decode undecided."""

from __future__ import annotations

import pytest
import torch
import transformers

import quant
from quant.diagnose import rho_terms
from quant.methods.base import LayerContext
from quant.methods.oscar_guarded import (
    HADAMARD,
    IDENTITY,
    MARGIN,
    PAIR,
    ROTATIONS,
    choices,
    choose,
    rho_by_rotation,
    rotation_bank,
)
from quant.methods.oscar_rope import pair_hadamard
from quant.packed import pack_reference
from quant.primitives import hadamard

VOCAB, KV_HEADS, D = 96, 2, 64


def tiny_qwen2(layers: int = 2):
    """Random Qwen2 with GQA (4 query heads on 2 KV heads of 64)."""
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(cfg).eval()


def online():
    return quant.get_method("oscar-guarded", value_rotation="online")  # no folded weights needed


def layer_of(heads: int = KV_HEADS, d: int = D):
    return online().make_layer(LayerContext(0, 1, heads, d))


# -- rho ------------------------------------------------------------------------------------------------------------
def rho_loop(q, k, group):
    """rho of each rotation by the definition, one term at a time in float64: q [Hq, S, D] (query head i reads KV head
    i // (Hq / Hkv)), k [Hkv, S, D]."""
    hq, hkv, d = q.shape[0], k.shape[0], k.shape[-1]
    out = torch.zeros(hkv, 3, dtype=torch.float64)
    for r, rot in enumerate((torch.eye(d), pair_hadamard(d), hadamard(d))):
        rot = rot.double()
        for h in range(hkv):
            total = 0.0
            keys = k[h].double() @ rot
            for g in range(k.shape[1] // group):  # whole groups only: the tail is left out
                rng = keys[g * group : (g + 1) * group].amax(0) - keys[g * group : (g + 1) * group].amin(0)
                for i in range(hq):
                    if i // (hq // hkv) != h:
                        continue
                    for t in range(q.shape[1]):
                        total += float(((q[i, t].double() @ rot) ** 2 * rng**2).sum())
            out[h, r] = total
    return out / out[:, :1]


@pytest.mark.parametrize("hq, hkv", [(4, 2), (6, 2), (3, 1)])
@pytest.mark.parametrize("chunk", [4096, 32])
def test_rho_is_the_definitions_sum(hq, hkv, chunk, monkeypatch):
    from quant.methods import oscar_guarded

    monkeypatch.setattr(oscar_guarded, "CHUNK", chunk)  # the chunked sums are the whole ones
    d, s = 16, 2 * 32 + 13  # a 13-token tail, left out
    g = torch.Generator().manual_seed(hq * 10 + hkv)
    q = torch.randn(hq, s, d, generator=g) * torch.linspace(0.2, 3, d)
    k = torch.randn(hkv, s, d, generator=g) * torch.linspace(4, 0.5, d)
    got = rho_by_rotation(q.reshape(hkv, -1, d), k)
    torch.testing.assert_close(got, rho_loop(q, k, 32), rtol=1e-10, atol=0)
    with_h, without = rho_terms(q.reshape(hkv, -1, d), k)  # the diagnosis's rho is the Hadamard's
    torch.testing.assert_close(got[:, HADAMARD], with_h / without, rtol=1e-10, atol=0)


def test_the_rule_keeps_oscar_unless_another_rotation_is_clearly_better():
    rho = torch.tensor(
        [
            [1.0, 0.99, 1.0],  # pair better by 1%: within the margin, OScaR's Hadamard
            [1.0, 0.90, 1.0],  # pair clearly better
            [1.0, 1.50, 1.20],  # no rotation best
            [1.0, 0.60, 0.30],  # the Hadamard best
            [float("nan")] * 3,  # no whole group: rho says nothing
            [1.0, 1.0, float("inf")],  # keys constant in every group
        ],
        dtype=torch.float64,
    )
    assert choose(rho).tolist() == [HADAMARD, PAIR, IDENTITY, HADAMARD, HADAMARD, HADAMARD]
    edge = torch.tensor([[1.0, 1.0, 1.0 + MARGIN / 2]], dtype=torch.float64)
    assert choose(edge).tolist() == [HADAMARD]
    bank = rotation_bank(8).double()
    for r in bank:  # every candidate is orthogonal, symmetric and its own inverse
        torch.testing.assert_close(r @ r, torch.eye(8, dtype=torch.float64))
        torch.testing.assert_close(r, r.T)


# -- known answers --------------------------------------------------------------------------------------------------
def rope_bias_keys(tokens: int, seed: int = 1) -> torch.Tensor:
    """[1, 1, S, D] keys that are mostly a constant on the fastest and slowest RoPE pairs turned by RoPE (a k_proj bias,
    as in Qwen2.5's layer 0), with small content (test_oscar_rope.py's)."""
    emb = tiny_qwen2(1).model.rotary_emb
    cos, sin = emb(torch.zeros(1), torch.arange(tokens).view(1, -1))
    g = torch.Generator().manual_seed(seed)
    bias = torch.zeros(D)
    bias[[0, D // 2]] = 60.0
    bias[[D // 2 - 1, D - 1]] = 100.0
    pre = bias + 0.5 * torch.randn(1, 1, tokens, D, generator=g)
    return pre * cos[0] + torch.cat([-pre[..., D // 2 :], pre[..., : D // 2]], -1) * sin[0]


def spiky_keys(tokens: int, seed: int = 2) -> torch.Tensor:
    """[1, 1, S, D] Gaussian keys where each token has one random channel off by +-20: every channel's group range is
    a spike's, which the Hadamard spreads thin over all channels."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, 1, tokens, D, generator=g)
    where = torch.randint(0, D, (1, 1, tokens, 1), generator=g)
    return k.scatter_add(-1, where, 20 * torch.randn(1, 1, tokens, 1, generator=g).sign())


def quiet_queries(tokens: int, seed: int = 3) -> torch.Tensor:
    """[1, 2, S, D] queries (two query heads per KV head) that read everything but the biased pairs' channels."""
    q = torch.randn(1, 2, tokens, D, generator=torch.Generator().manual_seed(seed))
    q[..., [0, D // 2 - 1, D // 2, D - 1]] = 0.0
    return q


def test_a_bias_turned_by_rope_keeps_its_swing_out_of_the_quiet_channels():
    tokens = 256
    layer = layer_of(heads=1)
    layer.update(rope_bias_keys(tokens), torch.randn(1, 1, tokens, D))
    layer.decide(quiet_queries(tokens))
    rho = layer.rotation_rho[0, 0]
    assert rho[HADAMARD] > 3 and rho[PAIR] < 1.5, rho  # the Hadamard spreads the swing into the quiet channels
    assert layer.rotation_code.tolist() == [[int(rho[:HADAMARD].argmin())]]
    assert layer.choices()["hadamard"] == 0


def test_spiky_keys_under_queries_on_every_channel_take_the_hadamard():
    tokens = 256
    layer = layer_of(heads=1)
    layer.update(spiky_keys(tokens), torch.randn(1, 1, tokens, D))
    layer.decide(torch.randn(1, 2, tokens, D, generator=torch.Generator().manual_seed(4)))
    rho = layer.rotation_rho[0, 0]
    assert rho[HADAMARD] < 0.5 and rho[PAIR] > 0.9, rho
    assert layer.rotation_code.tolist() == [[HADAMARD]] and layer.choices() == {"identity": 0, "pair": 0, "hadamard": 1}


def test_a_prompt_without_a_whole_group_keeps_oscars_rotation():
    layer = layer_of()
    layer.update(torch.randn(1, KV_HEADS, 31, D), torch.randn(1, KV_HEADS, 31, D))
    layer.decide(torch.randn(1, 4, 31, D))
    assert layer.rotation_code.tolist() == [[HADAMARD, HADAMARD]]


# -- storage --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tokens", [128 + 37, 3 * 128 + 5])
def test_stored_keys_are_oscars_reference_pack_in_each_heads_chosen_basis(tokens):
    first = 100  # a prompt, then tokens one by one: blocks flush at their own positions
    k = torch.cat([rope_bias_keys(tokens), spiky_keys(tokens)], 1)  # head 0: pair or none; head 1: the Hadamard
    v = torch.randn(1, KV_HEADS, tokens, D, generator=torch.Generator().manual_seed(tokens))
    q = torch.cat([quiet_queries(first), torch.randn(1, 2, first, D)], 1)
    layer = layer_of()
    layer.update(k[:, :, :first], v[:, :, :first])
    layer.decide(q)
    codes = layer.rotation_code[0].tolist()
    assert codes[0] != HADAMARD and codes[1] == HADAMARD, layer.rotation_rho
    for t in range(first, tokens):
        layer.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
    stored = layer.k_q.num_tokens
    assert stored == (tokens // 128) * 128 and layer.k_res.shape[-2] == tokens - stored
    rot = rotation_bank(D).double()[layer.rotation_code[0]]  # [H, D, D]
    keys = (k[:, :, :stored].double() @ rot).float()
    ref_k, ref_v, ref_norms = pack_reference(
        keys, v[:, :, :stored] @ hadamard(D), 2, 32, None, True, "integer", None, False
    )
    assert torch.equal(layer.k_q.codes, ref_k.codes) and torch.equal(layer.v_q.codes, ref_v.codes)
    torch.testing.assert_close(layer.norms, ref_norms)
    back = (ref_k.dequantize().double() * ref_norms.double()[:, None, :, None]) @ rot.mT
    got_k, got_v = layer.dequantized()
    torch.testing.assert_close(got_k.double(), back, rtol=1e-5, atol=2e-3)  # float32 products of keys ~100
    torch.testing.assert_close(got_v.double(), (ref_v.dequantize() @ hadamard(D)).double(), rtol=1e-5, atol=1e-5)
    oscar = quant.get_method("oscar", value_rotation="online").make_layer(LayerContext(0, 1, KV_HEADS, D))
    oscar.update(k, v)
    assert layer.nbytes() == oscar.nbytes()  # OScaR's bytes


def test_a_decode_step_before_any_choice_is_refused():
    layer = layer_of()
    layer.update(torch.randn(1, KV_HEADS, 40, D), torch.randn(1, KV_HEADS, 40, D))
    with pytest.raises(RuntimeError, match="was not prepared for oscar-guarded"):
        layer.update(torch.randn(1, KV_HEADS, 1, D), torch.randn(1, KV_HEADS, 1, D))


# -- through a model ------------------------------------------------------------------------------------------------
def test_a_model_must_be_prepared_and_is_given_back_as_it_was():
    model = tiny_qwen2()
    with pytest.raises(ValueError, match="prepare the model first"):
        quant.make_cache(online(), model=model)
    before = model.config._attn_implementation
    prepared = quant.prepare_model(model, online())
    prepared.make_cache()
    prepared.make_cache()  # a second cache switches nothing more
    assert model.config._attn_implementation == "oscar_guarded_" + before
    prepared.undo()
    assert model.config._attn_implementation == before
    whisper = transformers.WhisperConfig()
    assert "encoder-decoder" in online().cannot_run(type("M", (), {"config": whisper})())


def generate(model, ids, mask=None, new=8):
    """(tokens, cache) of a greedy generate through a fresh cache of the prepared model (`mask`: left padding)."""
    prepared = quant.prepare_model(model, online())
    try:
        cache = prepared.make_cache()
        if mask is not None:
            cache.set_padding(mask)
        out = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=new, do_sample=False)
    finally:
        prepared.undo()
    return out, cache


def test_a_left_padded_batch_gives_each_sequence_its_choices_and_tokens_alone():
    model = tiny_qwen2()
    # layer 0's first KV head gets a bias on its fastest RoPE pair: the rotation rho picks then depends on the prompt
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.bias[[0, D // 2]] = 4.0
    g = torch.Generator().manual_seed(5)
    long, short = torch.randint(0, VOCAB, (1, 300), generator=g), torch.randint(0, VOCAB, (1, 233), generator=g)
    ids = torch.cat([long, torch.cat([torch.zeros(1, 67, dtype=torch.long), short], 1)])
    mask = torch.ones_like(ids)
    mask[1, :67] = 0
    batch, cache = generate(model, ids, mask)
    per_row = []
    for b, alone_ids in enumerate((long, short)):
        single, alone = generate(model, alone_ids)
        assert torch.equal(batch[b, ids.shape[1] - alone_ids.shape[1] :], single[0])
        codes = [layer.rows[b].rotation_code for layer in cache.layers]
        assert all(torch.equal(c, layer.rotation_code) for c, layer in zip(codes, alone.layers))
        assert cache.row(b).nbytes()["parts"] == alone.nbytes()["parts"]
        per_row.append(torch.stack(codes))
    assert not torch.equal(per_row[0], per_row[1]), per_row  # the rows chose differently somewhere
    summary = choices(cache)
    assert [sum(s.values()) for s in summary] == [2 * KV_HEADS] * 2 and set(summary[0]) == set(ROTATIONS)


def test_a_tiny_model_generates_through_the_runner():
    from harness.models import tiny
    from harness.runner import answer
    from tasks.contract import Prompt

    adapter = tiny("llava")
    prompts = [Prompt("Describe the weather in three cities. " * 6), Prompt("Name a colour. " * 3)]
    batched = answer(adapter, prompts, "oscar-guarded", max_new_tokens=5)
    for prompt, got in zip(prompts, batched):
        [alone] = answer(adapter, [prompt], "oscar-guarded", max_new_tokens=5)
        assert got.new_tokens == alone.new_tokens == 5 and got.tokens_sha1 == alone.tokens_sha1
        [oscar] = answer(adapter, [prompt], "oscar", max_new_tokens=5)
        assert got.kv_bytes["total"] == oscar.kv_bytes["total"]  # OScaR's bytes: only the key rotation differs
    assert adapter.generator.config.get_text_config()._attn_implementation != "oscar_guarded_sdpa"  # given back


def test_an_unpadded_batch_chooses_per_sequence_in_one_layer():
    model = tiny_qwen2()
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.bias[[0, D // 2]] = 4.0
    ids = torch.randint(0, VOCAB, (2, 200), generator=torch.Generator().manual_seed(6))
    batch, cache = generate(model, ids, new=4)
    for b in range(2):
        single, alone = generate(model, ids[b : b + 1], new=4)
        assert torch.equal(batch[b], single[0])
        assert all(torch.equal(x.rotation_code[b], y.rotation_code[0]) for x, y in zip(cache.layers, alone.layers))
