"""KL(BF16 || method) and top-1 agreement of every scored perplexity token (harness/scoring.Divergence).

On a tiny random Llama (byte tokens, its output head scaled so the distributions are peaked): the eval loop's kl,
kl_p99 and top1 equal a float64 computation made here from the model's own logits (the reference: one plain forward
of the unprepared model over the window); BF16 is its own reference (0 and 1 exactly); a folding method (OScaR) is
measured against the unfolded model, whether BF16 ran first or the method runs alone (then a BF16 pass runs first:
the states it keeps equal the BF16 run's bit for bit). The KL's slices and its float32 log-softmax agree with float64
on awkward logits; the soft cap of Gemma's config is applied, and a model whose logits are scaled otherwise is
refused.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

import quant
from harness import run
from harness import scoring as S
from harness.models import traits_of
from harness.models.base import ModelSpec
from harness.models.synthetic import byte_tokenizer, seeded_model
from harness.models.text.adapter import TextAdapter
from harness.models.text.synthetic import TINY_TEXT
from harness.report import tables as T
from harness.runner import Runner
from quant import fold
from tasks.ppl import PerplexityTask

CONTEXT, SCORED = 160, 48  # byte tokens: the prompt passes OScaR's and KIVI's 128-token window
TRAITS = traits_of("smollm2-135m")  # the text family's: a Llama's attention folds


def tiny_adapter(scale: float = 60.0) -> TextAdapter:
    from transformers import LlamaConfig, LlamaForCausalLM

    model = seeded_model(LlamaForCausalLM, LlamaConfig(**TINY_TEXT), spread_norms=True)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)  # logits a few units apart: peaked distributions, no near-ties
    tokenizer = byte_tokenizer("<eos>", "<pad>", {})
    return TextAdapter(ModelSpec("tiny-text", "random:tiny-text", "text", "ppl"), model, tokenizer)


@pytest.fixture(scope="module")
def adapter():
    return tiny_adapter()


@pytest.fixture(scope="module")
def task():
    return PerplexityTask(context=CONTEXT, continuation=SCORED, batch=2)


def evaluate(adapter, task, quant_names: str, out) -> dict[str, dict]:
    results = run.evaluate(
        "smollm2-135m", quant_names, task=task, limit=3, out=str(out / "{method}.json"), adapter=adapter
    )
    return {r["method"]["name"]: r for r in results}


def window_ids(adapter, task, item) -> torch.Tensor:
    ids, _ = S.request_ids(adapter.tokenizer, task.requests(item)[0])
    return ids


def direct(adapter, method, ids: torch.Tensor) -> tuple[list[float], int]:
    """(KL per scored token, top-1 agreements) in float64 from the logits themselves: the method's as its runner
    scores the window (model prepared for it, the same forwards), BF16's from one forward of the unprepared model."""
    model = adapter.model
    with torch.no_grad():
        reference = model(input_ids=ids[:, :-1], use_cache=False).logits[0, CONTEXT - 1 :].double()
        with Runner(adapter, method, traits=TRAITS) as runner:
            assert fold.is_folded(model) == method.folds_values
            cache = runner.make_cache({"input_ids": ids[:, :CONTEXT]})
            out = [model(input_ids=ids[:, :CONTEXT], past_key_values=cache, use_cache=True).logits[0, -1:]]
            cache.state.decode_chunks = True
            for first, stop in S.chunks(method, CONTEXT, ids.shape[1] - 1):
                out.append(model(input_ids=ids[:, first:stop], past_key_values=cache, use_cache=True).logits[0])
    logits = torch.cat(out).double()
    logp, logq = torch.log_softmax(reference, -1), torch.log_softmax(logits, -1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    return kl.tolist(), int((reference.argmax(-1) == logits.argmax(-1)).sum())


@pytest.fixture(scope="module")
def together(adapter, task, tmp_path_factory):
    """The eval loop's results of BF16, KIVI and OScaR over three windows, BF16 first."""
    return evaluate(adapter, task, "bf16,kivi,oscar", tmp_path_factory.mktemp("together"))


def test_kl_and_top1_equal_a_float64_computation(adapter, task, together):
    results = together
    items = task.load(None, 3)
    for name in ("kivi", "oscar"):
        result, method = results[name], quant.get_method(name)
        all_kl = []
        for item, sample in zip(items, result["samples"]):
            kl, top1 = direct(adapter, method, window_ids(adapter, task, item))
            scores = sample["scores"]
            assert scores["top1_hits"] == top1, (name, item["id"])
            assert scores["kl_sum"] == pytest.approx(sum(kl), abs=1e-5)
            assert np.allclose(sample["kl_tokens"], kl, rtol=6e-4, atol=1e-6), (name, item["id"])
            all_kl += kl
        metrics = result["metrics"]
        n = len(items) * SCORED
        assert metrics["kl"]["value"] == pytest.approx(sum(all_kl) / n, abs=1e-7)
        assert metrics["kl_p99"]["value"] == pytest.approx(float(np.quantile(all_kl, 0.99)), rel=1e-3)
        assert metrics["top1"]["value"] == sum(s["scores"]["top1_hits"] for s in result["samples"]) / n
        assert metrics["kl"]["higher_is_better"] is False and metrics["top1"]["higher_is_better"] is True
        assert metrics["kl"]["ci_low"] <= metrics["kl"]["value"] <= metrics["kl"]["ci_high"]
        assert 0.01 < metrics["kl"]["value"] and 0.2 < metrics["top1"]["value"] < 1  # the 2-bit cache does differ
    bf16 = results["bf16"]["metrics"]
    assert (bf16["kl"]["value"], bf16["kl_p99"]["value"], bf16["top1"]["value"]) == (0.0, 0.0, 1.0)
    assert (bf16["kl"]["ci_low"], bf16["kl"]["ci_high"], bf16["top1"]["ci_low"]) == (0.0, 0.0, 1.0)
    assert "BF16" in results["bf16"]["task"]["settings"]["reference"]


def test_a_method_run_alone_is_measured_against_the_same_bf16(adapter, task, together, tmp_path):
    """Run alone (no BF16 run before it), OScaR's windows get a BF16 pass first, on the unfolded model: the same
    figures as when BF16 ran first."""
    alone = evaluate(adapter, task, "oscar", tmp_path)["oscar"]["samples"]
    for a, b in zip(together["oscar"]["samples"], alone):
        assert (a["scores"]["kl_sum"], a["scores"]["top1_hits"], a["kl_tokens"]) == (
            b["scores"]["kl_sum"],
            b["scores"]["top1_hits"],
            b["kl_tokens"],
        )
        assert a["scores"]["nll_sum"] == b["scores"]["nll_sum"]
    assert not fold.is_folded(adapter.model)


def test_the_ppl_table_shows_kl_p99_and_top1_and_tests_them_paired(together):
    runs = [copy.deepcopy(together[name]) for name in ("bf16", "kivi", "oscar")]
    for r in runs:
        r["model"]["replica"] = False  # a table of trained weights shows the metrics
        r["_path"] = f"results/runs/ppl/tiny-text/{r['method']['name']}.json"
    table = T.result_table(("ppl", "official", "tiny-text"), runs)
    assert table.header[2:6] == ["ppl ↓ (95% CI)", "kl ↓ (95% CI)", "kl_p99 ↓ (95% CI)", "top1 ↑ (95% CI)"]
    kl = [T.fmt(r["metrics"]["kl"]["value"]) for r in runs]
    assert [row[3].split()[0] for row in table.rows] == kl and kl[0] == "0"
    paired = T.paired_table("ppl · tiny-text", runs)
    tests = [f"{m} vs {ref}" for m in ("ppl", "kl", "kl_p99", "top1") for ref in ("bf16", "oscar")]
    assert paired.header == ["method", *tests]
    kivi = dict(zip(paired.header, paired.rows[1]))
    assert kivi["kl vs bf16"].startswith(f"{runs[1]['metrics']['kl']['value']:+.3g} (")
    for name in ("kl", "kl_p99", "top1"):  # a BF16 result of older code, without them: their columns stay in place
        del runs[0]["metrics"][name]
    table = T.result_table(("ppl", "official", "tiny-text"), runs)
    assert table.header[2:7] == ["ppl ↓ (95% CI)", "kl ↓ (95% CI)", "kl_p99 ↓ (95% CI)", "top1 ↑ (95% CI)", "items"]
    assert table.rows[0][3:6] == ["–", "–", "–"] and table.rows[1][3].split()[0] == kl[1]


def test_the_kept_reference_is_the_unfolded_bf16_run_bit_for_bit(adapter, task):
    requests = [task.requests(item)[0] for item in task.load(None, 2)]
    original = {k: v.clone() for k, v in adapter.model.state_dict().items()}
    kept = {}
    for name in ("bf16", "oscar"):  # BF16's own run; OScaR alone, whose runner runs the BF16 pass
        store = S.Prefills()
        with Runner(adapter, quant.get_method(name), traits=TRAITS, prefills=store) as runner:
            responses = runner.run(requests)
            assert fold.is_folded(adapter.model) == (name == "oscar")  # prepared for OScaR again after the pass
        assert all(r.error is None and len(r.details["kl_tokens"]) == SCORED for r in responses)
        kept[name] = store.references
    assert kept["bf16"].keys() == kept["oscar"].keys() and len(kept["bf16"]) == 2
    assert all(torch.equal(kept["bf16"][k], kept["oscar"][k]) for k in kept["bf16"])
    assert all(torch.equal(v, original[k]) for k, v in adapter.model.state_dict().items())  # weights given back
    # the check can tell: the folded model's final hidden states differ from the unfolded ones in their last bits
    ids = window_ids(adapter, task, task.load(None, 1)[0])
    with torch.no_grad(), S.final_hidden(adapter.model) as seen:
        adapter.model(input_ids=ids, use_cache=False)
        fold.set_folded(adapter.model, True, TRAITS)
        try:
            adapter.model(input_ids=ids, use_cache=False)
        finally:
            fold.set_folded(adapter.model, False)
    assert not torch.equal(seen[0], seen[1]) and torch.allclose(seen[0], seen[1], atol=1e-4)


def reference_kl(logits: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    logp, logq = torch.log_softmax(ref.double(), -1), torch.log_softmax(logits.double(), -1)
    p = logp.exp()
    return torch.where(p > 0, p * (logp - logq), 0.0).sum(-1)


@pytest.mark.parametrize("kind", ["ordinary", "near", "peaked", "large", "masked", "bf16"])
def test_the_kl_of_float32_slices_is_within_1e_5_nats_of_float64(kind, monkeypatch):
    """Within 1e-5 nats and 1e-6 of the value (float32's relative precision, for KL of tens of nats), far inside the
    1e-3 nats an approximation may cost."""
    g = torch.Generator().manual_seed(3)
    n, v = 40, 5000
    ref = torch.randn(n, v, generator=g) * 3
    noise = torch.randn(n, v, generator=g)
    logits = {
        "ordinary": ref + noise,
        "near": ref + 1e-4 * noise,  # KL ~ 1e-9: what float32 rounding must not swamp
        "peaked": ref * 30 + noise,  # one token holds almost all the mass
        "large": ref + 1000.0 + noise,  # large offsets: the log-softmax must subtract its max
        "masked": (ref + noise).index_fill(1, torch.arange(0, v, 21), -math.inf),  # tokens the method rules out
        "bf16": (ref + 0.05 * noise).bfloat16(),
    }[kind]
    if kind == "masked":  # BF16 rules them out and more: those terms are 0, the KL finite
        ref = ref.index_fill(1, torch.arange(0, v, 7), -math.inf)
    want = reference_kl(logits, ref).clamp_min(0)
    monkeypatch.setattr(S, "KL_ELEMENTS", 3 * v)  # slices of 3 rows: the last one short
    kl, same = S.kl_top1(logits, lambda s, e: ref[s:e])
    assert kl.dtype == torch.float64 and kl.shape == (n,) and (kl >= 0).all()
    assert ((kl - want).abs() <= 1e-5 + 1e-6 * want).all(), (kl - want).abs().max()
    assert torch.equal(same, logits.float().argmax(-1) == ref.argmax(-1))
    monkeypatch.setattr(S, "KL_ELEMENTS", 1 << 30)  # one slice: each row's sum is the same
    whole, _ = S.kl_top1(logits, lambda s, e: ref[s:e])
    assert torch.equal(whole, kl)


def test_masking_a_token_bf16_likes_gives_an_infinite_kl():
    ref = torch.tensor([[2.0, 1.0, 0.0]])
    kl, _ = S.kl_top1(torch.tensor([[-math.inf, 1.0, 0.0]]), lambda s, e: ref[s:e])
    assert kl.item() == math.inf


def test_the_soft_cap_of_the_config_is_applied():
    """Gemma's final_logit_softcapping: the recomputed logits are the model's own."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        final_logit_softcapping=3.0,
    )
    model = seeded_model(Gemma3ForCausalLM, config)
    with torch.no_grad():
        model.lm_head.weight.mul_(50)  # logits past the cap: capping changes them
        ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
        with S.final_hidden(model) as seen:
            logits = model(input_ids=ids, use_cache=False).logits
        again = S.output_logits(model, seen[0])
        S.check_head(model, seen[0], logits)
        uncapped = model.lm_head(seen[0])
    assert torch.equal(again, logits) and logits.abs().max() <= 3.0 < uncapped.abs().max()


def test_a_model_whose_logits_are_scaled_otherwise_is_refused():
    """Granite divides its logits by `logits_scaling`: BF16's distribution recomputed from the head would be another."""
    from transformers import GraniteConfig, GraniteForCausalLM

    config = GraniteConfig(**{**TINY_TEXT, "logits_scaling": 8.0})
    model = seeded_model(GraniteForCausalLM, config)
    with torch.no_grad():
        model.lm_head.weight.mul_(60)
        ids = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(0))
        with S.final_hidden(model) as seen:
            logits = model(input_ids=ids, use_cache=False).logits
        with pytest.raises(ValueError, match="GraniteForCausalLM: its logits are not its output head"):
            S.check_head(model, seen[0], logits)
