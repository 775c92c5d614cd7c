"""The contract between tasks and models: what a task asks (requests) and what it gets back (responses).

A task never calls a model. It turns an item into requests and scores the responses (tasks/base.py); the eval loop
(harness/run.py) collects the requests of many items and hands them, a batch at a time, to the runner of one
(model, method) (harness/runner.py), which answers each with its own cost. This module sits below both: tasks and
harness import it, it imports neither.

Three kinds of request:
- `Generate`: a prompt (text, images, audio clips) and a token budget; answered greedily.
- `Score`: a text whose first `context` tokens are the prompt and whose next `scored` tokens are scored by teacher
  forcing, each attending over the quantized cache as its own decode step would (perplexity).
- `Likelihood`: a prompt and a target answer; the target's tokens are scored by teacher forcing after the prompt,
  each as its own decode step over the quantized cache (speech: a reference transcript given its clip).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, Union

import numpy as np


@dataclass(frozen=True)
class Prompt:
    """One prompt. Images are PIL images; audios are mono float32 arrays at 16 kHz; `system` an optional system
    message.

    chat: wrap the text in the model's chat template (False: the text as it is, e.g. LongBench's few-shot sets).
    answer_prefix: text the answer starts with, placed after the template's assistant turn (RULER's
    "The special magic number for ... is"); the model continues it and the answer does not repeat it.
    max_tokens: the text is cut in its middle to at most this many tokens of the model's tokenizer before it is
    wrapped (LongBench's truncation: the first and the last half kept); None: never cut. An adapter also cuts
    to what the model can hold (harness/models/base.py: truncate_middle)."""

    text: str
    images: Sequence[Any] = ()
    audios: Sequence[np.ndarray] = ()
    system: str | None = None
    chat: bool = True
    answer_prefix: str = ""
    max_tokens: int | None = None


@dataclass(frozen=True)
class Generate:
    """Answer `prompt` greedily with at most `max_new_tokens` new tokens. `stop`: texts that end the answer as the
    end token does when the model emits one of them as a single token (LongBench's samsum stops at "\\n");
    `min_new_tokens`: the end tokens are suppressed before this many new tokens."""

    prompt: Prompt
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    min_new_tokens: int = 0


@dataclass(frozen=True)
class Score:
    """Teacher-forced NLL of `text`'s tokens `context` .. `context + scored - 1` (counted in the model's tokenizer)
    after prefilling the first `context` tokens into the cache. A text with fewer than `context + scored` tokens is
    answered with an error."""

    text: str
    context: int
    scored: int


@dataclass(frozen=True)
class Likelihood:
    """Teacher-forced NLL of `target` as the model's answer to `prompt`: the prompt is prefilled into the cache, then
    each of the target's tokens (the model's tokenizer, no special tokens) is fed as its own decode step, scored on
    the logits of the step before it."""

    prompt: Prompt
    target: str


Request = Union[Generate, Score, Likelihood]


@dataclass
class Response:
    """What one request got, and what it cost. `error` set: the request failed (the text says what and where) and
    the other fields are empty.

    Generate: text, tokens (the new token ids up to and with the first end token), tokens_sha1 (their digest),
    input_tokens, new_tokens.
    Score, Likelihood: nll_sum (float64 sum over the scored tokens), scored (their number).
    Both: modality_tokens (prompt positions per modality), kv_bytes (the request's own cache bytes,
    quant.cache.QuantizedKVCache.nbytes), wall_s (its share of its batch's time), graph_steps (decode steps replayed
    as CUDA graphs), cost (harness/models/cost.py: prefill and decode time, kernel steps, peak memory, batch size),
    details (request-kind specifics, e.g. whether a shared prefill was reused)."""

    text: str | None = None
    tokens: list[int] = field(default_factory=list)
    tokens_sha1: str = ""
    input_tokens: int = 0
    new_tokens: int = 0
    nll_sum: float | None = None
    scored: int = 0
    modality_tokens: dict[str, int] = field(default_factory=dict)
    kv_bytes: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    graph_steps: int = 0
    cost: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @classmethod
    def failed(cls, error: str) -> "Response":
        return cls(error=error)


class ModelSource(Protocol):
    """Models a task's scorer may load by name (MMAU-Pro's judge: a registered model such as smollm2-135m). The harness
    hands its registry to a task (harness/models/source.py); a task never imports the harness."""

    def __contains__(self, name: str) -> bool:
        """Whether `name` is a model this source can load."""

    def check(self, name: str) -> None:
        """RuntimeError naming what is missing and the fix when `name`'s weights are not here (loads nothing)."""

    def load(self, name: str, device: str | None = None, dtype: str | None = None) -> tuple[Any, Any]:
        """(model, tokenizer) of `name`, offline."""
