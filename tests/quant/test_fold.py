"""OScaR's offline value rotation (quant/fold.py): folding H into v_proj / o_proj keeps the model's function, is
undone bit for bit, follows the method of each cache made on a shared model, and gives the online rotation's
attention up to rounding."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import quant  # noqa: E402
from quant import fold  # noqa: E402
from quant.primitives import hadamard  # noqa: E402
from tests.kernels.traits_for_tests import ALL, prepared  # noqa: E402


def tiny(kind="qwen3", dtype=torch.float32, bias=False):
    common = dict(
        vocab_size=96,
        hidden_size=128,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    if kind == "qwen3":
        cfg = transformers.Qwen3Config(head_dim=64, **common)
        cls = transformers.Qwen3ForCausalLM
    elif kind == "qwen2":  # q/k/v biases: the value bias is rotated too
        cfg = transformers.Qwen2Config(**common)
        cls = transformers.Qwen2ForCausalLM
    else:
        cfg = transformers.LlamaConfig(head_dim=64, attention_bias=bias, **common)
        cls = transformers.LlamaForCausalLM
    torch.manual_seed(0)
    return cls(cfg).to(dtype).eval()


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind", ["qwen3", "qwen2", "llama"])
def test_folded_model_computes_the_same_function_and_restores_bit_for_bit(kind):
    model = tiny(kind, bias=True)
    ids = torch.randint(0, 96, (2, 40), generator=torch.Generator().manual_seed(1))
    before, plain = state(model), model(ids).logits
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(2))
    v_plain = model.model.layers[0].self_attn.v_proj(x)
    assert fold.set_folded(model, True, ALL) and fold.is_folded(model)
    assert fold.set_folded(model, True, ALL)  # already folded: nothing changes
    folded = model(ids).logits
    torch.testing.assert_close(folded, plain, rtol=0, atol=1e-5 * plain.abs().max().item())
    # each KV head's values come out rotated: v_h H (H symmetric)
    d = model.model.layers[0].self_attn.head_dim  # 64, or 32 for the Qwen2 (hidden / heads)
    v_folded = model.model.layers[0].self_attn.v_proj(x).view(3, 2, d)
    torch.testing.assert_close(v_folded, v_plain.view(3, 2, d) @ hadamard(d), rtol=0, atol=1e-5)
    assert not torch.equal(
        model.model.layers[1].self_attn.o_proj.weight, before["model.layers.1.self_attn.o_proj.weight"]
    )
    assert not fold.set_folded(model, False) and not fold.is_folded(model)
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())


def test_bf16_fold_stays_within_bf16_rounding():
    model = tiny("llama", torch.bfloat16)
    ids = torch.randint(0, 96, (1, 64), generator=torch.Generator().manual_seed(3))
    plain = model(ids).logits.float()
    fold.set_folded(model, True, ALL)
    folded = model(ids).logits.float()
    fold.set_folded(model, False)
    # folded weights are rounded to bf16 once: about one more bf16 rounding of v_proj / o_proj's outputs
    assert (folded - plain).norm() / plain.norm() < 2e-2


def test_prepared_models_follow_their_method_and_caches_never_change_the_model():
    model = tiny()
    before = state(model)
    with prepared(model, "oscar") as prep:
        assert prep.values_folded and fold.is_folded(model)
        oscar = prep.make_cache()
        assert oscar.state.values_folded
        assert quant.make_cache("oscar", model).state.values_folded  # the model as prepared: the same cache
        with pytest.raises(ValueError, match="undo"):
            quant.make_cache("kivi", model)  # another method on folded weights
        with pytest.raises(ValueError, match="already prepared"):
            quant.prepare_model(model, "kivi", None, ALL)
        assert fold.is_folded(model)  # making caches changed nothing
    assert not fold.is_folded(model)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    with pytest.raises(ValueError, match="quant.prepare_model"):
        quant.make_cache("oscar", model)  # offline rotation on a model not prepared for it
    kivi = quant.make_cache("kivi", model)  # nothing to fold: no preparation needed
    assert not kivi.state.values_folded and not fold.is_folded(model)
    with prepared(model, quant.get_method("oscar", value_rotation="online")) as prep:
        assert not prep.values_folded and not prep.make_cache().state.values_folded and not fold.is_folded(model)
    from harness.results import weight_hash

    loaded = weight_hash(model)
    with prepared(model, "oscar"):
        assert weight_hash(model) != loaded  # the folded weights, as they are while prepared
    assert not fold.is_folded(model) and weight_hash(model) == loaded  # undone: the loaded weights, bit for bit
    assert not quant.make_cache("oscar", config=model.config).state.values_folded  # nothing to fold: online


def test_offline_and_online_oscar_attend_alike():
    # The same cache policy with V's rotation in the weights (offline) or in the cache (online): the same attention
    # up to float rounding, across a 128-token flush and the decode steps after it.
    model = tiny()
    ids = torch.randint(0, 96, (1, 150), generator=torch.Generator().manual_seed(4))

    def run(method):
        with prepared(model, method) as prep, torch.no_grad():
            cache = prep.make_cache()
            out = model.generate(
                ids,
                past_key_values=cache,
                max_new_tokens=12,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
        layer = cache.layers[0]
        return torch.stack(out.logits), layer

    off, layer_off = run("oscar")
    on, layer_on = run(quant.get_method("oscar", value_rotation="online"))
    assert not layer_off._values_rotated and layer_on._values_rotated
    assert layer_off.v_q.num_tokens == 128
    # the offline cache holds the values it was given (already rotated): they dequantize to the online cache's
    torch.testing.assert_close(layer_off.dequantized()[1], layer_on.dequantized()[1] @ hadamard(64), rtol=0, atol=1e-4)
    torch.testing.assert_close(off, on, rtol=0, atol=1e-3 * on.abs().max().item())
    with prepared(model, quant.get_method("oscar", rotation="none")) as prep:
        assert not prep.make_cache().state.values_folded


def test_unfoldable_models_and_bad_settings_say_what_to_do():
    cfg = transformers.GPT2Config(vocab_size=64, n_embd=64, n_layer=2, n_head=2)
    gpt2 = transformers.GPT2LMHeadModel(cfg).eval()
    with pytest.raises(ValueError, match="value_rotation=online"):
        fold.set_folded(gpt2, True, ALL)
    with pytest.raises(ValueError, match="value_rotation=online"):
        quant.prepare_model(gpt2, "oscar", None, ALL)
    assert not fold.is_folded(gpt2) and "_oscar_prepared" not in gpt2.__dict__  # a failed preparation leaves nothing
    with pytest.raises(ValueError, match="ModelTraits"):
        fold.set_folded(tiny(), True)  # folding needs the family's traits
    with pytest.raises(ValueError, match="not among the classes"):
        fold.set_folded(tiny(), True, quant.traits.NONE)  # a class the traits do not list is refused
    quant.make_cache(quant.get_method("oscar", value_rotation="online"), gpt2)  # online needs no folding
    assert not fold.set_folded(gpt2, False)  # nothing folded: a no-op
    with pytest.raises(ValueError, match="'offline'.*'online'"):
        quant.get_method("oscar", value_rotation="folded")
