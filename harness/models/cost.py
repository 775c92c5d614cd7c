"""What one `generate` call costs: prefill and decode time, decode steps on the kernel path, peak GPU memory.

`GenerationClock` is a transformers streamer: `generate` hands it the prompt before the prefill and each new token
after its step, and it stamps the time of each call after a device sync (the token's copy to the host), so
    prefill_s = first new token - prompt handed over        (prefill forward and the first token's choice)
    decode_s  = end of generation - first new token        (new_tokens - 1 decode steps)
The copy is one token per step; `generate` already syncs once per step for its stopping check.

`KernelSteps` counts the decode steps that took OScaR's kernel path: steps where the cache's first layer handed
the attention a packed state (quant.methods.oscar.OScaRLayer returns one only on that path) plus the steps
replayed as CUDA graphs (they run the same kernels without re-entering Python; quant.kernels.graph_decode).

`measure` wraps one generate call; the runner (harness/runner.py) gives each request of the call its cost record.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from quant.kernels.hf_decode import PackedStep


def on_kernels(step) -> bool:
    """Whether a layer's decode step hands the attention packed codes (a padded batch's too: quant/rows.py)."""
    return isinstance(step, PackedStep)


class GenerationClock:
    """A transformers streamer (put / end) that stamps the prompt hand-over, the first new token and the end."""

    def __init__(self):
        self.started = time.perf_counter()
        self.first: float | None = None
        self.finished: float | None = None
        self.calls = 0
        self._prompt_given = False
        self.on_token = None  # called with each step's new tokens [B] (on the host), before the next step runs

    def begin(self) -> None:
        """The prefill starts before `generate` (the batch-invariant mode prefills each prompt alone): stamp it now;
        generate's own hand-over of the prompt is then not a new token."""
        self.started, self.calls, self._prompt_given = time.perf_counter(), 1, True

    def put(self, value) -> None:
        now = time.perf_counter()
        if self._prompt_given:
            self._prompt_given = False
            return
        self.calls += 1
        if self.calls == 1:
            self.started = now  # the prompt, handed over before the prefill forward
            return
        if self.calls == 2:
            self.first = now  # the first new token, on the host after its step
        if self.on_token is not None:
            self.on_token(value)

    def end(self) -> None:
        if self.finished is None:
            self.finished = time.perf_counter()

    def times(self) -> tuple[float, float]:
        """(prefill_s, decode_s); without any new token the whole call counts as prefill."""
        self.end()
        if self.first is None:
            return self.finished - self.started, 0.0
        return self.first - self.started, self.finished - self.first


class KernelSteps:
    """Counts layer 0's packed (kernel-path) decode steps of `cache` while active; see the module docstring."""

    def __init__(self, cache):
        self.cache, self.count, self._layer, self._update = cache, 0, None, None

    def __enter__(self):
        layers = getattr(self.cache, "layers", None)
        if layers:
            self._layer = layers[0]
            self._update = self._layer.update

            def update(*args, **kwargs):
                out = self._update(*args, **kwargs)
                if on_kernels(out[0]):  # the fused kernels attend over the codes (BF16's DenseStep: no)
                    self.count += 1
                return out

            self._layer.update = update  # an instance attribute shadows the class's method for this call only
        return self

    def __exit__(self, *exc):
        if self._layer is not None:
            del self._layer.update
        return False


def cuda_in_use(device) -> bool:
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


@contextlib.contextmanager
def measure(device, cache, graphs=None):
    """Context around one generate call: yields (clock, figures): pass `streamer=clock` to generate; figures is filled
    on exit with prefill_s, decode_s, kernel_steps and peak_cuda_bytes (the allocator's peak during the call; None off
    CUDA).

    graphs: the GraphDecoder of the call, if any (its replayed steps count as kernel steps), or a callable
    returning it once generate has run.
    """
    cuda = cuda_in_use(device)
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    clock, figures = GenerationClock(), {}
    with KernelSteps(cache) as kernel:
        yield clock, figures
    if cuda:
        torch.cuda.synchronize(device)
    prefill, decode = clock.times()
    decoder = graphs() if callable(graphs) else graphs
    # replayed steps run the kernels of the step they captured: count them where that step was on the kernels
    kernel_cache = getattr(getattr(cache, "method", None), "kernel_decode", False)
    replayed = decoder.counts["replayed"] if decoder is not None and kernel_cache else 0
    figures.update(
        prefill_s=prefill,
        decode_s=decode,
        kernel_steps=kernel.count + replayed,
        peak_cuda_bytes=int(torch.cuda.max_memory_allocated(device)) if cuda else None,
    )


def generation_cost(figures: dict[str, Any], new_tokens: int, kv_bytes: dict[str, Any]) -> dict[str, Any]:
    """One generate call's cost record: figures of `measure` plus new tokens, decode steps and KV bytes."""
    return {
        **figures,
        "new_tokens": int(new_tokens),
        "decode_steps": max(int(new_tokens) - 1, 0),
        "kv_bytes": int(kv_bytes.get("total") or 0) if kv_bytes else 0,
        "calls": 1,
    }


def latency(figures: dict[str, Any], steps: int) -> dict[str, float | None]:
    """Time to first token (the call's prompt hand-over to its first new token: the prefill and the first step) and
    time per output token after it (the call's decode time over its `steps` decode steps: those of its longest row),
    as serving engines and lmms-eval report them per request. In a batch every row waits for the batch."""
    decode = figures.get("decode_s")
    return {
        "ttft_s": figures.get("prefill_s"),
        "tpot_s": decode / steps if decode is not None and steps > 0 else None,
    }


class RowBytes:
    """Each row's cache bytes as it would hold them alone: read when the row's end token is chosen (before a next
    step could store it), so the steps a batch runs on after a row ended never count; a row that runs to the token
    budget is read after generate. `on_token` goes to GenerationClock.on_token."""

    def __init__(self, cache, rows: int, ends: set[int]):
        self.cache, self.ends, self.ended = cache, ends, [None] * rows

    def on_token(self, tokens) -> None:
        for b, token in enumerate(tokens.reshape(-1).tolist()):
            if self.ended[b] is None and token in self.ends:
                self.ended[b] = self.cache.row(b).nbytes()

    def of(self, row: int) -> dict[str, Any]:
        if self.cache is None:
            return {}
        return self.ended[row] if self.ended[row] is not None else self.cache.row(row).nbytes()
