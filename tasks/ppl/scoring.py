"""Teacher-forced scoring of a batch of windows through a quantized cache.

Each scored token must attend over the cache as its own decode step would. Feeding one token per forward does
that for any method but costs one forward per token; a method states how many tokens from a cache position on
may go in one forward and still see exactly that (MethodConfig.exact_chunk), with the cache answering every
chunk as decode steps are answered (quant.methods.base.CacheState.decode_chunks: over everything as stored after
the chunk, the causal mask hiding the later tokens).
"""
from __future__ import annotations

import torch

MAX_CHUNK = 256  # tokens per forward when a method allows any chunk (bounds the logits' memory)


def chunks(method, start: int, end: int) -> list[tuple[int, int]]:
    """[(first, last + 1)] cache positions of the forwards that feed tokens start .. end - 1."""
    out, pos = [], start
    while pos < end:
        n = max(1, min(method.exact_chunk(pos), MAX_CHUNK, end - pos))
        out.append((pos, pos + n))
        pos += n
    return out


def nll_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum over positions of -log p(target): logits [B, S, V], targets [B, S] -> float64 [B]."""
    logp = torch.log_softmax(logits.float(), -1)
    return -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).double().sum(-1)


def score_batch(adapter, method, ids: torch.Tensor, context: int):
    """Prefill ids[:, :context] into a fresh cache, then score ids[:, context:] by teacher forcing.

    ids: LongTensor [B, L] (rows of equal length, no padding). Returns (NLL sums float64 [B], the cache)."""
    model = adapter.model
    cache = adapter.make_cache(method, torch.zeros_like(ids[:, :context]))
    logits = model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    nll = nll_of(logits[:, -1:], ids[:, context:context + 1])
    cache.state.decode_chunks = True
    for first, stop in chunks(method, context, ids.shape[1] - 1):
        logits = model(input_ids=ids[:, first:stop], past_key_values=cache, use_cache=True).logits
        nll += nll_of(logits, ids[:, first + 1:stop + 1])
    return nll, cache
