"""Teacher-forced scoring of a batch of windows through a quantized cache (the runner's Score requests).

Each scored token must attend over the cache as its own decode step would. Feeding one token per forward does
that for any method but costs one forward per token; a method states how many tokens from a cache position on
may go in one forward and still see exactly that (MethodConfig.exact_chunk), with the cache answering every
chunk as decode steps are answered (quant.methods.base.CacheState.decode_chunks: over everything as stored after
the chunk, the causal mask hiding the later tokens).

The prompt attends with exact K/V whatever the method (a cache quantizes the prompt only when it stores it), so its
forward is the same for every method of a run: `Prefills` runs it once per batch of windows and model state (the
values' rotation folded in or not) and hands each method's cache the exact K/V its own prefill would have stored.

Distance to BF16 (`Divergence`): for every scored token, KL(BF16 || method) in nats over the whole vocabulary and
whether the two argmaxes agree. The reference is the BF16 method's run of the same window (the exact cache, the
unfolded model). The BF16 run keeps its final hidden states (after the last norm) of the scored positions in the
run's `Prefills` (a few MB a window, never logits), and a later method recomputes BF16's logits from them with the
output head. Where none are kept (a method run alone, or resumed after the BF16 result was written), a BF16 pass
over the window runs first, on the model as the BF16 method prepares it (the values' rotation not folded in).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import weakref

import torch

MAX_CHUNK = 256  # tokens per forward when a method allows any chunk (bounds the logits' memory)
PREFILL_BYTES = 2 << 30  # the exact prompts' K/V kept for the next methods of a run; past this, each method prefills
REFERENCE_BYTES = 1 << 30  # BF16's final hidden states kept for the next methods; past this, each method recomputes
KL_ELEMENTS = 1 << 23  # tokens x vocabulary entries per slice of the KL computation (bounds its memory)


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


# ------------------------------------------------------------------------------------------------ token windows
_STREAM: list = []  # [(weakref to a tokenizer, SHA-1 of a text, its token ids)]: the last stream tokenized


def stream_ids(tokenizer, text: str) -> torch.Tensor:
    """The token ids [N] of `text` (no special tokens), tokenized once for the windows of a run that cut it."""
    key = hashlib.sha1(text.encode()).hexdigest()
    if _STREAM and _STREAM[0][0]() is tokenizer and _STREAM[0][1] == key:
        return _STREAM[0][2]
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[0]
    _STREAM[:] = [(weakref.ref(tokenizer), key, ids)]
    return ids


def request_ids(tokenizer, request) -> tuple[torch.Tensor, str]:
    """([1, n] token ids of a Score request, what they were cut from: the words of a too-short request's error).

    A request with a `window` (tasks.ppl.StreamWindow) is window `window` of its text's tokens: [w * L, (w + 1) * L)
    with L = context + scored, so every window is exactly L tokens of the model's own tokenization of the stream.
    Otherwise the text's own tokens."""
    window = getattr(request, "window", None)
    if window is None:
        return tokenizer(request.text, return_tensors="pt", add_special_tokens=False).input_ids, (
            f"{len(request.text)} characters"
        )
    stream = stream_ids(tokenizer, request.text)
    size = request.context + request.scored
    where = f"window {window} of a stream of {len(stream)} tokens ({len(request.text)} characters)"
    return stream[window * size : (window + 1) * size].unsqueeze(0), where


# ------------------------------------------------------------------------------------------------ BF16's distribution
@contextlib.contextmanager
def final_hidden(model):
    """Within: the inputs of the model's output head, one tensor per call (the final hidden states after the last
    norm, at the positions whose logits the forward computes)."""
    seen: list[torch.Tensor] = []
    handle = model.get_output_embeddings().register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        yield seen
    finally:
        handle.remove()


def output_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """The logits the model computes from final hidden states: its output head, then the soft cap of the config's
    final_logit_softcapping where it has one (Gemma's), as the causal LM's forward applies them."""
    logits = model.get_output_embeddings()(hidden)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    cap = getattr(config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def kl_top1(logits: torch.Tensor, reference) -> tuple[torch.Tensor, torch.Tensor]:
    """(KL(reference || method) in nats per row, float64 [N]; whether the argmaxes agree, bool [N]).

    logits: the method's [N, V]; reference(s, e): the reference's logits of rows s .. e - 1. Over the whole
    vocabulary, in slices of KL_ELEMENTS: float32 log-softmax, each row's sum in float64. A row's KL is at least 0
    (a sum just below it is rounding)."""
    n, v = logits.shape
    step = max(1, KL_ELEMENTS // v)
    kl, same = [], []
    for s in range(0, n, step):
        e = min(n, s + step)
        ref = reference(s, e)
        logq = torch.log_softmax(logits[s:e].float(), -1)
        logp = torch.log_softmax(ref.float(), -1)
        p = logp.exp()
        terms = torch.where(p > 0, p * (logp - logq), torch.zeros((), dtype=p.dtype, device=p.device))
        kl.append(terms.double().sum(-1).clamp_min(0))
        same.append(logits[s:e].argmax(-1) == ref.argmax(-1))
    return torch.cat(kl), torch.cat(same)


def is_reference(method) -> bool:
    """Whether `method` is the BF16 preset, whose distribution every other method is measured against."""
    import quant

    return method is not None and method == quant.get_method("bf16")


class Divergence:
    """KL(BF16 || method) and top-1 agreement of each scored token of a batch of windows, fed chunk by chunk.

    reference: [B, scored, H] final hidden states of the BF16 run of the same rows; None when this run is BF16's own
    (its logits are then the reference: KL 0, top-1 1). measure: compute them (off for a BF16 pass run only to keep
    its states); keep: collect this run's final hidden states (the BF16 run's, kept for the later methods)."""

    def __init__(self, model, reference: torch.Tensor | None = None, measure: bool = True, keep: bool = False):
        self.model, self.reference, self.measure, self.keep = model, reference, measure, keep
        self.kl: list[torch.Tensor] = []
        self.top1: list[torch.Tensor] = []
        self.hidden: list[torch.Tensor] = []
        self.at = 0  # scored positions fed so far
        self.seconds = 0.0  # time spent here (not the method's: the runner leaves it out of wall_s)

    def add(self, logits: torch.Tensor, hidden: torch.Tensor) -> None:
        """The next n scored positions: logits [B, n, V] and the final hidden states [B, n, H] they came from."""
        start = time.perf_counter()
        b, n, v = logits.shape
        if self.keep:
            if self.at == 0:
                check_head(self.model, hidden, logits)
            self.hidden.append(hidden.detach().clone())
        if self.measure:
            flat = logits.reshape(b * n, v)
            if self.reference is None:
                kl, same = kl_top1(flat, lambda s, e: flat[s:e])
            else:
                h = self.reference[:, self.at : self.at + n].reshape(b * n, -1)
                kl, same = kl_top1(flat, lambda s, e: output_logits(self.model, h[s:e]))
            self.kl.append(kl.view(b, n))
            self.top1.append(same.view(b, n))
        self.at += n
        self.seconds += time.perf_counter() - start

    def states(self) -> torch.Tensor:
        """This run's final hidden states of the scored positions, [B, scored, H]."""
        return torch.cat(self.hidden, 1)

    def row(self, b: int) -> dict:
        """Row b's figures for its response: kl_sum (float64 sum over its scored tokens), top1 (tokens whose argmax
        is BF16's) and kl_tokens (each token's KL to 4 significant digits: the 99th percentile's input)."""
        if not self.measure:
            return {}
        kl = torch.cat([k[b] for k in self.kl]).cpu()
        return {
            "kl_sum": float(kl.sum()),
            "top1": int(torch.cat([t[b] for t in self.top1]).sum()),
            "kl_tokens": [float(f"{x:.4g}") for x in kl.tolist()],
        }


def check_head(model, hidden: torch.Tensor, logits: torch.Tensor) -> None:
    """ValueError when the model's logits are not `output_logits` of its final hidden states (a family that scales
    them otherwise): BF16's logits recomputed that way would be another distribution."""
    again = output_logits(model, hidden[:, :1]).float()
    if not torch.allclose(again, logits[:, :1].float(), rtol=0.02, atol=0.02):
        raise ValueError(
            f"{type(model).__name__}: its logits are not its output head (and final_logit_softcapping) applied to "
            "its final hidden states, which is how the KL to BF16 recomputes them (harness/scoring.output_logits); "
            "teach output_logits this model's final transform"
        )


def divergence_for(runner, ids: torch.Tensor, context: int) -> Divergence | None:
    """How `runner`'s batch `ids` is measured against BF16: None without a run store (runner.prefills) or method;
    BF16 itself against its own logits (its states kept for the later methods); any other method against the kept
    BF16 states of its rows, computed first by `reference_pass` for the rows that have none."""
    store, model = runner.prefills, runner.adapter.model
    if store is None or runner.method is None:
        return None
    if is_reference(runner.method):
        return Divergence(model, keep=True)
    states = store.references_of(model, ids, context)
    missing = [b for b, s in enumerate(states) if s is None]
    if missing:
        for b, s in zip(missing, reference_pass(runner, ids[missing], context)):
            states[b] = s
    return Divergence(model, torch.stack(states))


def reference_pass(runner, ids: torch.Tensor, context: int) -> torch.Tensor:
    """BF16's final hidden states [B, scored, H] of the windows `ids`, as the BF16 method's run computes them: the
    runner's preparation is undone (the values' rotation taken out of the weights), the model prepared for BF16 and
    scored from the shared exact prefill, then prepared for the runner's method again (folding is restored from the
    same original weights, so it is the same model)."""
    import quant
    from harness.runner import Runner

    bf16 = quant.get_method("bf16")
    model = runner.adapter.model
    runner.prepared.undo()
    try:
        with Runner(runner.adapter, bf16, runner.kernels, runner.traits, runner.prefills) as ref:
            cache = ref.make_cache({"input_ids": ids[:, :context]})
            divergence = Divergence(model, measure=False, keep=True)
            score_batch(model, cache, bf16, ids, context, runner.prefills, divergence)
    finally:
        runner.prepared = quant.prepare_model(runner.adapter.generator, runner.method, runner.kernels, runner.traits)
    return divergence.states()


# ------------------------------------------------------------------------------------------------ shared prefills
def _row_key(row: torch.Tensor, context: int) -> str:
    return f"{context}:" + hashlib.sha1(row.cpu().numpy().tobytes()).hexdigest()


class Prefills:
    """The exact prefill of each batch of prompts: the logits and final hidden state of its last position and every
    layer's K/V as the model hands them to its cache, kept for the other methods of a run (at most PREFILL_BYTES of
    K/V); and BF16's final hidden states of each window's scored positions (`references_of`, at most
    REFERENCE_BYTES).

    Kept for one model object at a time (another model drops them), keyed by whether the values' rotation is folded
    into its weights (quant/fold.py: folded weights give other V, rounded otherwise) and the prompt tokens with the
    first scored one, so a hit is the same forward. BF16's states are keyed by the window's tokens alone: they are
    always the unfolded model's."""

    def __init__(self, max_bytes: int = PREFILL_BYTES):
        self.max_bytes, self.bytes = max_bytes, 0
        self._kept: dict[tuple, tuple] = {}
        self._model = None  # weakref to the model the kept forwards ran on
        self.reused = False  # whether the last get() found its forward kept (its time then went to an earlier method)
        self.references: dict[str, torch.Tensor] = {}
        self.reference_bytes = 0

    @staticmethod
    def shares(method) -> bool:
        """A method with a `prepare` hook (RotateKV: hooks that watch the prompt's forward) prefills itself."""
        return getattr(method, "prepare", None) is None

    def _for(self, model) -> None:
        """Drop what was kept for another model."""
        if self._model is None or self._model() is not model:
            self._kept, self.bytes, self._model = {}, 0, weakref.ref(model)
            self.references, self.reference_bytes = {}, 0

    def get(self, model, ids: torch.Tensor, context: int):
        """(logits [B, 1, V] and final hidden state [B, 1, H] of the prompt's last position, [(K, V)] per layer) of
        ids[:, :context] (run now if not kept)."""
        import quant
        from quant import fold

        self._for(model)
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
        with final_hidden(model) as seen:
            out = model(input_ids=ids[:, :context], past_key_values=plain, use_cache=True, logits_to_keep=1)
        kv = [(layer.keys, layer.values) for layer in plain.layers]
        kept = out.logits[:, -1:], seen[-1][:, -1:].clone(), kv
        size = sum(k.nbytes + v.nbytes for k, v in kv) + kept[0].nbytes + kept[1].nbytes
        if self.bytes + size <= self.max_bytes:
            self._kept[key] = kept
            self.bytes += size
        return kept

    def references_of(self, model, ids: torch.Tensor, context: int) -> list[torch.Tensor | None]:
        """BF16's kept final hidden states [scored, H] of each row of `ids` (None where none is kept)."""
        self._for(model)
        return [self.references.get(_row_key(row, context)) for row in ids]

    def keep_references(self, model, ids: torch.Tensor, context: int, states: torch.Tensor) -> None:
        """Keep BF16's final hidden states `states` [B, scored, H] of the rows of `ids` (while REFERENCE_BYTES
        allow)."""
        self._for(model)
        for row, state in zip(ids, states):
            key = _row_key(row, context)
            if key not in self.references and self.reference_bytes + state.nbytes <= REFERENCE_BYTES:
                self.references[key] = state.contiguous()
                self.reference_bytes += state.nbytes


def score_batch(
    model, cache, method, ids: torch.Tensor, context: int, prefills: Prefills | None = None, divergence=None
):
    """Prefill ids[:, :context] into `cache` (fresh, made for `method` on `model` as prepared for it), then score
    ids[:, context:] by teacher forcing.

    ids: LongTensor [B, L] (rows of equal length, no padding). `prefills`: the run's exact prompts (see Prefills);
    None, or a method that prefills itself: the prompt goes through the model into this cache. `divergence`: a
    Divergence fed every scored position's logits (its kept states go to `prefills`).
    Returns (NLL sums float64 [B], whether the prompt's forward was an earlier method's)."""
    reused = False
    if prefills is not None and Prefills.shares(method):
        logits, hidden, kv = prefills.get(model, ids, context)
        reused = prefills.reused
        for i, (k, v) in enumerate(kv):  # what the prompt's forward hands each layer, stored by the method (copies:
            cache.update(k.clone(), v.clone(), i)  # the next methods read the kept ones; clone keeps the strides)
    else:
        with final_hidden(model) as seen:
            logits = model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        logits, hidden = logits[:, -1:], seen[-1][:, -1:]
    nll = nll_of(logits, ids[:, context : context + 1])
    if divergence is not None:
        divergence.add(logits, hidden)
    cache.state.decode_chunks = True
    for first, stop in chunks(method, context, ids.shape[1] - 1):
        with final_hidden(model) as seen:
            logits = model(input_ids=ids[:, first:stop], past_key_values=cache, use_cache=True).logits
        nll += nll_of(logits, ids[:, first + 1 : stop + 1])
        if divergence is not None:
            divergence.add(logits, seen[-1])
    if divergence is not None and divergence.keep and prefills is not None:
        prefills.keep_references(model, ids, context, divergence.states())
    return nll, reused
