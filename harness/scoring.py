"""Teacher-forced scoring of a batch of windows through a quantized cache (the runner's Score requests).

Each scored token must attend over the cache as its own decode step would. Feeding one token per forward does
that for any method but costs one forward per token; a method states how many tokens from a cache position on
may go in one forward and still see exactly that (MethodConfig.exact_chunk), with the cache answering every
chunk as decode steps are answered (quant.methods.base.CacheState.decode_chunks: over everything as stored after
the chunk, the causal mask hiding the later tokens).

The prompt attends with exact K/V whatever the method (a cache quantizes the prompt only when it stores it), so its
forward is the same for every method of a run: `Prefills` runs it once per batch of windows and model state (the
values' rotation folded in or not) and hands each method's cache the exact K/V its own prefill would have stored.
"""

from __future__ import annotations

import hashlib
import weakref

import torch

MAX_CHUNK = 256  # tokens per forward when a method allows any chunk (bounds the logits' memory)
PREFILL_BYTES = 2 << 30  # the exact prompts' K/V kept for the next methods of a run; past this, each method prefills


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


class Prefills:
    """The exact prefill of each batch of prompts: the first scored token's NLL (float64 [B]) and every layer's K/V as
    the model hands them to its cache, kept for the other methods of a run (at most PREFILL_BYTES of K/V).

    Kept for one model object at a time (another model drops them), keyed by whether the values' rotation is folded
    into its weights (quant/fold.py: folded weights give other V, rounded otherwise) and the prompt tokens with the
    first scored one, so a hit is the same forward."""

    def __init__(self, max_bytes: int = PREFILL_BYTES):
        self.max_bytes, self.bytes = max_bytes, 0
        self._kept: dict[tuple, tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]] = {}
        self._model = None  # weakref to the model the kept forwards ran on
        self.reused = False  # whether the last get() found its forward kept (its time then went to an earlier method)

    @staticmethod
    def shares(method) -> bool:
        """A method with a `prepare` hook (RotateKV: hooks that watch the prompt's forward) prefills itself."""
        return getattr(method, "prepare", None) is None

    def get(self, model, ids: torch.Tensor, context: int):
        """(nll [B], [(K, V)] per layer) of ids[:, :context] scored on ids[:, context] (run now if not kept)."""
        import quant
        from quant import fold

        if self._model is None or self._model() is not model:
            self._kept, self.bytes, self._model = {}, 0, weakref.ref(model)
        key = (
            fold.is_folded(model),
            ids.device.type,
            context,
            hashlib.sha1(ids[:, : context + 1].cpu().numpy().tobytes()).hexdigest(),
        )
        self.reused = key in self._kept
        if self.reused:
            return self._kept[key]
        # a BF16 cache keeps the very tensors the layers hand it (their memory layout too: a token norm summed over
        # another layout rounds differently); made from the config, so the model's weights stay as they are
        plain = quant.make_cache(quant.get_method("bf16"), config=model.config)
        logits = model(input_ids=ids[:, :context], past_key_values=plain, use_cache=True, logits_to_keep=1).logits
        kv = [(layer.keys, layer.values) for layer in plain.layers]
        out = nll_of(logits[:, -1:], ids[:, context : context + 1]), kv
        size = sum(k.nbytes + v.nbytes for k, v in kv)
        if self.bytes + size <= self.max_bytes:
            self._kept[key] = out
            self.bytes += size
        return out


def score_batch(model, cache, method, ids: torch.Tensor, context: int, prefills: Prefills | None = None):
    """Prefill ids[:, :context] into `cache` (fresh, made for `method` on `model` as prepared for it), then score
    ids[:, context:] by teacher forcing.

    ids: LongTensor [B, L] (rows of equal length, no padding). `prefills`: the run's exact prompts (see Prefills);
    None, or a method that prefills itself: the prompt goes through the model into this cache.
    Returns (NLL sums float64 [B], whether the prompt's forward was an earlier method's)."""
    reused = False
    if prefills is not None and Prefills.shares(method):
        nll, kv = prefills.get(model, ids, context)
        reused = prefills.reused
        nll = nll.clone()
        for i, (k, v) in enumerate(kv):  # what the prompt's forward hands each layer, stored by the method (copies:
            cache.update(k.clone(), v.clone(), i)  # the next methods read the kept ones; clone keeps the strides)
    else:
        logits = model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        nll = nll_of(logits[:, -1:], ids[:, context : context + 1])
    cache.state.decode_chunks = True
    for first, stop in chunks(method, context, ids.shape[1] - 1):
        logits = model(input_ids=ids[:, first:stop], past_key_values=cache, use_cache=True).logits
        nll += nll_of(logits, ids[:, first + 1 : stop + 1])
    return nll, reused


def per_sequence(kv: dict, rows: int) -> dict:
    """A batch's cache bytes (quant.cache.QuantizedKVCache.nbytes) per sequence: every row holds as many tokens."""
    out = {}
    for key, value in kv.items():
        if isinstance(value, dict):
            out[key] = per_sequence(value, rows)
        elif isinstance(value, list):
            out[key] = [x // rows for x in value]
        else:
            out[key] = value // rows if isinstance(value, int) else value
    return out
