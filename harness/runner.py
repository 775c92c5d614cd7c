"""The runner of one (model, method): answers batches of requests (tasks/contract.py), each with its own cost.

It owns what a method needs of the model for the whole run: the model prepared for the method (quant.prepare_model:
the values' rotation folded into the weights, the attention hook, the layer kernels; undone on `close`), the kernel
options, a fresh cache per batch and the CUDA graphs of its decode steps (quant.engine.decode_graphs).

    with Runner(adapter, method, kernels, traits) as runner:
        responses = runner.run([Generate(prompt, 128), ...])

Generate: the prompts are built one by one by the adapter (its processor, on the path it was tested on), collated
left-padded (harness/models/batching.py) and answered in one greedy `generate`; the cache stores each sequence
without its padding (quant/rows.py), so each answer is the prompt's batch-1 answer. With the run's RunPrefills, a
prompt's prefill that an earlier method ran is replayed into this method's cache (harness/prefill_store.py).
Score: the texts are tokenized, cut to context + scored tokens and scored together (harness/scoring.py); every row
has the same length, so there is no padding. A batch that fails runs again one request at a time, so a failure is
one request's (its response carries the error), never the batch's.
"""

from __future__ import annotations

import contextlib
import time
import traceback

import torch

from harness.models.base import cache_argument, graph_steps, token_digest
from harness.models.batching import collate, prefill_rows, row_tokens
from harness.models.cost import RowBytes, generation_cost, latency, measure
from quant.invariant import BatchInvariant
from tasks.contract import Generate, Likelihood, Request, Response, Score


class Runner:
    """Answers requests for `adapter`'s model with `method`'s cache (None: the model's own DynamicCache, the
    reference). `prefills`: the exact prompt forwards shared by the runners of one model (harness.scoring.Prefills;
    a harness.prefill_store.RunPrefills shares the prompts of Generate requests too)."""

    def __init__(self, adapter, method, kernels=None, traits=None, prefills=None):
        import quant
        from quant import invariant
        from quant.kernels.options import KernelOptions
        from quant.traits import NONE

        self.adapter, self.method = adapter, method
        self.kernels = invariant.resolve(kernels or KernelOptions(), adapter.generator)
        self.traits = NONE if traits is None else traits
        self.prefills = prefills
        self.prompts = getattr(prefills, "prompts", None)  # harness.prefill_store.PromptPrefills, or None
        self.prepared = quant.prepare_model(adapter.generator, method, self.kernels, self.traits)

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def close(self) -> None:
        """Give the model back as it was loaded (weights, attention implementation, layer kernels)."""
        if self.prepared is not None:
            self.prepared.undo()
            self.prepared = None

    # ------------------------------------------------------------------------------------------------ requests
    def run(self, requests: list[Request]) -> list[Response]:
        """One response per request, in order. Requests of one kind and one setting share a model call; a call that
        fails is retried one request at a time, and a request that fails alone gets a response with its error."""
        out: list[Response | None] = [None] * len(requests)
        for group in _groups(requests):
            batch = [requests[i] for i in group]
            try:
                answers = self._call(batch)
            except Exception as exc:  # noqa: BLE001 - one bad request must not end a run; retried alone below
                if len(batch) == 1:
                    answers = [Response.failed(_describe(exc, batch[0]))]
                else:
                    answers = [self.run([r])[0] for r in batch]
            for i, answer in zip(group, answers):
                out[i] = answer
        return out

    def _call(self, batch: list[Request]) -> list[Response]:
        if isinstance(batch[0], Generate):
            return self.generate(batch)
        if isinstance(batch[0], Score):
            return self.score(batch)
        if isinstance(batch[0], Likelihood):
            return self.likelihood(batch)
        raise TypeError(f"unknown request {type(batch[0]).__name__}; tasks/contract.py lists the kinds")

    def make_cache(self, inputs, rows: bool = False):
        """A fresh cache for the prompt batch `inputs`: every prompt position's modality and the batch's padding set
        (None for the reference DynamicCache). `rows`: each sequence in layers of its own even without padding (the
        batch-invariant prefill writes them one by one)."""
        if self.method is None:
            return None
        custom = getattr(self.adapter, "make_cache", None)
        if custom is not None:  # a family with caches of its own shape (Whisper: self- and cross-attention)
            return custom(self.prepared, inputs)
        cache = self.prepared.make_cache(config=self.adapter.text_config, tokenizer=self.adapter.tokenizer)
        cache.set_modalities(self.adapter.tags(inputs).to(self.adapter.device))
        if "attention_mask" in inputs:
            cache.set_padding(inputs["attention_mask"], rows=rows)
        return cache

    # ------------------------------------------------------------------------------------------------ generate
    def generate(self, batch: list[Generate]) -> list[Response]:
        """Greedy answers of `batch` (one token budget) in one left-padded generate."""
        from quant.engine import decode_graphs

        adapter = self.adapter
        start = time.perf_counter()
        features = [adapter.build_inputs(r.prompt) for r in batch]
        pad = adapter.pad_token_id
        inputs = collate(features, pad).to(device=adapter.device, dtype=adapter.model.dtype)
        invariant = self.kernels.batch_invariant and self.method is not None
        cache = self.make_cache(inputs, rows=invariant)
        shared = self._prompt_share()
        decoder = []
        with measure(adapter.device, cache, lambda: decoder[0] if decoder else None) as (clock, figures):
            with torch.inference_mode(), decode_graphs(adapter.generator, cache) as graphs:
                decoder.append(graphs)  # None when the steps run eagerly
                steps = contextlib.nullcontext()
                if invariant:
                    clock.begin()
                    prefill_rows(adapter, cache, features, shared.row if shared else None)
                    inputs = {k: inputs[k] for k in ("input_ids", "attention_mask")}
                    steps = BatchInvariant()
                ends = adapter.eos_token_ids | stop_ids(adapter.tokenizer, batch[0].stop)
                row_bytes = RowBytes(cache, len(batch), ends)
                clock.on_token = row_bytes.on_token if cache is not None else None
                first = shared.first_forward(cache, features) if shared and not invariant else contextlib.nullcontext()
                with steps, first:
                    out = adapter.generator.generate(
                        **inputs,
                        **cache_argument(cache),
                        **stopping(batch[0], ends),
                        do_sample=False,
                        max_new_tokens=batch[0].max_new_tokens,
                        streamer=clock,
                        pad_token_id=pad,
                    )
        new = out[:, inputs["input_ids"].shape[1] :]
        share = (time.perf_counter() - start) / len(batch)
        reused = shared.reused if shared else [False] * len(batch)
        if shared:
            shared.commit()  # after the timing: keeping a prefill (a spill to disk) is not this method's time
        responses = []
        for b, (feature, tokens) in enumerate(zip(features, row_tokens(new, ends))):
            kv_bytes = row_bytes.of(b)
            cost = {**generation_cost(figures, len(tokens), kv_bytes), "batch": len(batch)}
            cost.update(latency(figures, new.shape[1] - 1))
            cost["kernel_steps"] = min(cost.get("kernel_steps") or 0, cost["decode_steps"])  # a row that ended early
            cost["prefill_reused"] = int(reused[b])  # 1: another method ran this prompt's prefill (its time is theirs)
            responses.append(
                Response(
                    text=adapter.decode(tokens),
                    tokens=[int(t) for t in tokens.tolist()],
                    tokens_sha1=token_digest(tokens),
                    input_tokens=int(feature["input_ids"].shape[1]),
                    new_tokens=len(tokens),
                    modality_tokens=adapter.count_modalities(feature),
                    kv_bytes=kv_bytes,
                    wall_s=share,
                    graph_steps=graph_steps(cache),
                    cost=cost,
                    details={"prefill_reused": reused[b]},
                )
            )
        return responses

    def _prompt_share(self):
        """The run's kept prompt prefills for one generate call (harness/prefill_store.py), or None where this model
        and method prefill every prompt themselves."""
        from harness.prefill_store import PromptShare, shares

        if self.prompts is None or not shares(self.adapter, self.method):
            return None
        return PromptShare(self.prompts, self.adapter.generator, self.kernels)

    # ------------------------------------------------------------------------------------------------ score
    def score(self, batch: list[Score]) -> list[Response]:
        """Teacher-forced NLL of each text's scored tokens (harness/scoring.py), with each token's KL to BF16 and top-1
        agreement where the run shares a store (self.prefills); a text with too few tokens gets an error response, the
        others are scored together."""
        from harness.scoring import divergence_for, request_ids, score_batch
        from quant.cache import per_sequence

        adapter = self.adapter
        start = time.perf_counter()
        rows, out = [], [None] * len(batch)
        bos = _leading_bos(adapter.tokenizer)
        for i, request in enumerate(batch):
            ids, where = request_ids(adapter.tokenizer, request)  # the text's tokens, or a window of a token stream
            need = request.context + request.scored
            if ids.shape[1] < need:
                out[i] = Response.failed(f"only {ids.shape[1]} tokens in {where}, need {need} (context + scored)")
            else:
                ids = ids[:, :need]
                rows.append((i, ids if bos is None else torch.cat([torch.full((1, 1), bos, dtype=ids.dtype), ids], 1)))
        if rows:
            context = batch[rows[0][0]].context + (bos is not None)
            ids = torch.cat([r[1] for r in rows]).to(adapter.device)
            with torch.no_grad():
                aside = time.perf_counter()
                divergence = divergence_for(self, ids, context)  # a BF16 pass first where none is kept
                start += time.perf_counter() - aside
                cache = self.make_cache({"input_ids": ids[:, :context]})
                nll, reused = score_batch(adapter.model, cache, self.method, ids, context, self.prefills, divergence)
            kv = cache.nbytes()
            per_row = per_sequence(kv, len(rows))
            measured = divergence.seconds if divergence is not None else 0.0  # the KL's time is not the method's
            share = (time.perf_counter() - start - measured) / len(rows)
            for b, ((i, _), row_nll) in enumerate(zip(rows, nll.tolist())):
                request = batch[i]
                out[i] = Response(
                    nll_sum=row_nll,
                    scored=request.scored,
                    wall_s=share,
                    modality_tokens={"text": request.context + request.scored},
                    kv_bytes=per_row,
                    cost={"batch": len(rows)},
                    details={
                        "bits_per_element": kv["bits_per_element"],
                        "window": self.method.window,
                        "prefill_reused": reused,
                        **(divergence.row(b) if divergence is not None else {}),
                    },
                )
        return out

    # ------------------------------------------------------------------------------------------------ likelihood
    def likelihood(self, batch: list[Likelihood]) -> list[Response]:
        """Teacher-forced NLL of each request's target after its prompt, one request at a time (each alone: its own
        cache, no padding)."""
        return [self._likelihood(request) for request in batch]

    def _likelihood(self, request: Likelihood) -> Response:
        """The prompt's forward through a fresh cache of the method, then each target token (the tokenizer's, no
        special tokens) as its own one-token decode step: token i is scored on the logits of the step before it (the
        first on the prompt's last position), so every scored token after the first attends over the cache as
        stored. NLL summed in float64. The adapter may name the forward's keywords (`forward_inputs(inputs)`,
        `step_inputs(tokens, first_output)`: Whisper's features and decoder ids); by default the prompt's inputs and
        then `input_ids`."""
        adapter = self.adapter
        start = time.perf_counter()
        target = adapter.tokenizer(request.target, add_special_tokens=False, return_tensors="pt").input_ids
        if target.shape[1] == 0:
            return Response.failed(f"the target {request.target!r} has no tokens")
        inputs = adapter.build_inputs(request.prompt).to(device=adapter.device, dtype=adapter.model.dtype)
        target = target.to(adapter.device)
        cache = self.make_cache(inputs)
        model_inputs = getattr(adapter, "forward_inputs", lambda x: dict(x))(inputs)
        step = getattr(adapter, "step_inputs", lambda tokens, first: {"input_ids": tokens})
        nll = torch.zeros((), dtype=torch.float64, device=adapter.device)
        with torch.inference_mode():
            first = adapter.generator(**model_inputs, **cache_argument(cache), use_cache=True)
            cache = _output_cache(first) if cache is None else cache  # the reference: the model's own cache
            logits = first.logits[:, -1]
            for i in range(target.shape[1]):
                token = target[:, i : i + 1]
                nll -= torch.log_softmax(logits.double(), -1).gather(-1, token)[0, 0]
                if i + 1 < target.shape[1]:
                    out = adapter.generator(**step(token, first), **cache_argument(cache), use_cache=True)
                    logits = out.logits[:, -1]
        kv = cache.nbytes() if hasattr(cache, "nbytes") else {}
        return Response(
            nll_sum=float(nll),
            scored=int(target.shape[1]),
            input_tokens=int(inputs["input_ids"].shape[1]),
            modality_tokens=adapter.count_modalities(inputs),
            kv_bytes=kv,
            wall_s=time.perf_counter() - start,
            cost={"batch": 1, "decode_steps": int(target.shape[1]) - 1},
            details={"bits_per_element": kv.get("bits_per_element"), "window": getattr(self.method, "window", None)},
        )


def stop_ids(tokenizer, stop: tuple[str, ...]) -> set[int]:
    """The token ids that end an answer besides the model's end tokens: the last id of each stop text as the tokenizer
    encodes it alone (LongBench's samsum takes `encode("\\n")[-1]`: a SentencePiece tokenizer puts a word-start piece
    before it)."""
    out = set()
    for text in stop:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise ValueError(f"stop text {text!r} has no tokens in this tokenizer")
        out.add(int(ids[-1]))
    return out


def stopping(request: Generate, ends: set[int]) -> dict:
    """generate()'s keywords for a request's stop texts and least length; none when it has neither, so a model's own
    generation config (Whisper's) decides as before."""
    out = {}
    if request.stop:
        out["eos_token_id"] = sorted(ends)
    if request.min_new_tokens:
        out["min_new_tokens"] = request.min_new_tokens
    return out


def _output_cache(output):
    """The cache a forward returned (`cache` from transformers 5.24 on, `past_key_values` before)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def _leading_bos(tokenizer) -> int | None:
    """The token id a model expects before any text (its tokenizer adds it: Gemma's <bos>), else None. A scored window
    starts with it, as the model's own tokenization of the text would; it is context, never scored."""
    if getattr(tokenizer, "add_bos_token", False) and tokenizer.bos_token_id is not None:
        return int(tokenizer.bos_token_id)
    return None


def _groups(requests: list[Request]) -> list[list[int]]:
    """Indices of the requests that can share one model call: same kind and same setting (token budget; context
    and scored length), in order of first appearance."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(requests):
        if isinstance(r, Generate):
            key = (type(r).__name__, r.max_new_tokens, r.stop, r.min_new_tokens)
        elif isinstance(r, Score):
            key = (type(r).__name__, r.context, r.scored)
        else:  # Likelihood: answered one request at a time, whatever its lengths
            key = (type(r).__name__,)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _describe(exc: BaseException, request: Request) -> str:
    """A failed request's error text: what failed, the exception and where it was raised."""
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" (at {where.filename}:{where.lineno})" if where else ""
    what = "generation" if isinstance(request, Generate) else "scoring"
    return f"{what} failed: {type(exc).__name__}: {exc}{at}"


def run_batches(runner: Runner, requests: list[Request], batch_size: int) -> list[Response]:
    """`requests` answered `batch_size` at a time (the order kept)."""
    out: list[Response] = []
    for i in range(0, len(requests), batch_size):
        out += runner.run(requests[i : i + batch_size])
    return out


def answer(adapter, prompts, method, max_new_tokens: int = 128, kernels=None) -> list[Response]:
    """One-off greedy answers of `prompts` (a list, answered as one batch) with `method` (a config or a preset name),
    for notebooks and tests: a runner made for the call and closed after, so the model is left as it was."""
    import quant
    from harness.models import traits_of

    method = quant.get_method(method) if isinstance(method, str) else method
    with Runner(adapter, method, kernels, traits_of(adapter.spec.name)) as runner:
        return runner.run([Generate(p, max_new_tokens) for p in prompts])
