"""Perplexity of real prose through the quantized cache, scored past the full-precision window, and the distance of
each method's next-token distribution to BF16's.

Text: the license texts every Debian machine ships in /usr/share/common-licenses (real English prose the
project did not write), read in a fixed order as one stream. The windows are cut in the model's own tokens: the
runner tokenizes the whole stream once (no special tokens) and window i is its tokens [i * L, (i + 1) * L) with
L = context + continuation, so every window holds exactly L tokens whatever the tokenizer (tasks.contract.Score
with a `window`: StreamWindow). How many windows a text holds is counted without a tokenizer, at CHARS_PER_TOKEN
characters a token over the whole stream: the same items for every model, and every tokenizer holds them. Gemma's
tokenizer puts <bos> before any text: the runner puts it before each window, as context (harness/runner.py).

In each window the first `context` tokens are the prompt (prefilled with exact attention and stored in the quantized
cache); the next `continuation` tokens are scored by teacher forcing, each attending over the cache as its own
decode step would. With a continuation longer than a method's window R, most scored tokens attend over quantized
recent tokens, not only over a quantized distant past.

Each window is one request; the runner scores them (harness/scoring.py): the windows of a run go through the model
in batches (`--batch-size`, default `default_batch_size`), the prompt's exact forward runs once per batch for all
the methods of a run, and the continuation goes in chunks a method declares exact (MethodConfig.exact_chunk: e.g.
R - 1 tokens between two block flushes, then the flushing token alone), so each scored token sees exactly what one
decode step at a time would show it.

Metrics: perplexity = exp(sum of NLL / number of scored tokens) over all windows (and that mean NLL). Against the
BF16 method's distribution of the same window (the exact cache, on the model without the values' rotation folded
in; harness/scoring.Divergence), per scored token: KL(BF16 || method) in nats over the whole vocabulary, and
whether the method's most likely token is BF16's. `kl`: the mean KL per scored token; `kl_p99`: the 99th percentile
of all scored tokens' KL (numpy's linear interpolation, over each token's value to 4 significant digits); `top1`:
the share of scored tokens whose argmax agrees. BF16 itself: kl 0, top1 1.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.base import TaskDataError
from tasks.contract import Response, Score

LICENSE_DIR = Path("/usr/share/common-licenses")
LICENSE_FILES = ("GPL-3", "LGPL-2.1", "GFDL-1.3", "MPL-2.0", "Apache-2.0", "CC0-1.0", "Artistic", "GPL-2", "MPL-1.1")
# Characters a token the window count assumes over the whole stream. The license stream has 4.55 (SmolLM2), 4.62
# (Gemma-3) and 4.71 (Qwen2.5) characters a token: 5.0 leaves every tokenizer tokens to spare.
CHARS_PER_TOKEN = 5.0


@dataclass(frozen=True)
class StreamWindow(Score):
    """Score window `window` of a token stream: `text` is the whole stream, tokenized once by the runner (the model's
    tokenizer, no special tokens); the window is its tokens [window * (context + scored), (window + 1) * (context +
    scored)): `context` prompt tokens, then `scored` scored ones (harness/scoring.request_ids)."""

    window: int = 0


class PerplexityTask:
    modalities = ("text",)
    version = 3
    lower_is_better = ("kl", "kl_p99")

    def __init__(self, context: int = 1024, continuation: int = 512, batch: int = 8, name: str = "ppl"):
        """batch: windows per forward when the run does not say (`default_batch_size`)."""
        if context < 1 or continuation < 2:
            raise ValueError(
                f"ppl: context must be >= 1 and continuation >= 2 tokens, got {context} and {continuation}"
            )
        self.name, self.context, self.continuation, self.default_batch_size = name, context, continuation, batch
        # the characters a window takes at CHARS_PER_TOKEN: a text holds len(text) // window_chars windows
        self.window_chars = int(math.ceil((context + continuation) * CHARS_PER_TOKEN))

    def describe(self) -> dict:
        return {
            "context_tokens": self.context,
            "scored_tokens": self.continuation,
            "windows": "consecutive windows of context + scored tokens of the whole stream in the model's tokens",
            "chars_per_token": self.window_chars / (self.context + self.continuation),
            "texts": [f"{LICENSE_DIR}/{n}" for n in LICENSE_FILES],
            "scoring": "teacher forcing; each scored token attends over the cache as its decode step would",
            "reference": "kl, kl_p99, top1: per scored token against the BF16 method's distribution of the same window "
            "(exact cache, values' rotation not folded in), KL(BF16 || method) in nats over the whole vocabulary",
        }

    def sources(self, data: str | None) -> list[Path]:
        if data in (None, "generated"):
            paths = [LICENSE_DIR / name for name in LICENSE_FILES]
            missing = [str(p) for p in paths if not p.is_file()]
            if missing:
                raise TaskDataError(
                    f"ppl: missing license texts {missing}; install Debian's base-files, or pass "
                    "--data with a text file or a folder of .txt files"
                )
            return paths
        path = Path(data)
        if path.is_dir():
            return sorted(p for p in path.iterdir() if p.is_file())
        if path.is_file():
            return [path]
        raise TaskDataError(f"ppl: --data {data!r} is neither a file nor a folder of text files")

    def stream(self, paths: list[Path]) -> str:
        return "\n\n".join(p.read_text(encoding="utf-8", errors="replace").strip() for p in paths)

    def load(self, data: str | None, limit: int | None) -> list[dict]:
        """The first windows of the text stream, as many as it holds at CHARS_PER_TOKEN characters a token."""
        paths = self.sources(data)
        text = self.stream(paths)
        n = len(text) // self.window_chars
        if n == 0:
            raise TaskDataError(
                f"ppl: the text ({len(text)} characters) holds no window of {self.context + self.continuation} "
                f"tokens at {CHARS_PER_TOKEN} characters a token; pass a longer text with --data"
            )
        size = self.context + self.continuation
        sha = hashlib.sha1(text.encode()).hexdigest()[:12]
        items = [
            {"id": f"tokens@{i * size}", "window": i, "paths": [str(p) for p in paths], "sha": sha} for i in range(n)
        ]
        return items[:limit] if limit else items

    def data_fingerprint(self, items: list[dict]) -> str:
        key = f"{self.context}+{self.continuation}:{items[0]['sha'] if items else ''}:{len(items)}"
        return hashlib.sha1(key.encode()).hexdigest()[:16]

    def requests(self, item: dict) -> list[Score]:
        """Window `window` of the stream's tokens: its first `context` are the prompt, the next `continuation` are
        scored."""
        text = self.stream([Path(p) for p in item["paths"]])
        return [StreamWindow(text, self.context, self.continuation, window=item["window"])]

    def record(self, item: dict, responses: list[Response], error: str | None = None) -> dict:
        """{"id", "scores": {"nll_sum", "n_tokens", "ppl", and against BF16 "kl_sum", "kl", "top1_hits", "top1"},
        "kl_tokens", cache figures}; a window the stream's tokens do not hold is an error naming the fix."""
        error = error or responses[0].error
        if error:
            short = error.startswith("only ")  # the runner's words for a window with too few tokens
            hint = f"; the text has more than {CHARS_PER_TOKEN} characters a token: raise tasks.ppl.CHARS_PER_TOKEN"
            return {"id": item["id"], "error": f"ppl item {item['id']}: {error}" + (hint if short else "")}
        response = responses[0]
        n, details = response.scored, response.details
        scores = {"nll_sum": response.nll_sum, "n_tokens": n, "ppl": math.exp(response.nll_sum / n)}
        against = {}
        if "kl_sum" in details:  # measured against BF16 (a run of the eval loop)
            scores |= {
                "kl_sum": details["kl_sum"],
                "kl": details["kl_sum"] / n,
                "top1_hits": details["top1"],
                "top1": details["top1"] / n,
            }
            against["kl_tokens"] = details["kl_tokens"]
        return {
            "id": item["id"],
            "prediction": None,
            "scores": scores,
            **against,
            "modality_tokens": dict(response.modality_tokens),
            "kv_bytes": response.kv_bytes,
            "bits_per_element": details["bits_per_element"],
            "window": details["window"],
            "wall_s": response.wall_s,
            # the prompt's forward was an earlier method's (harness/scoring.py): wall_s is the rest of the work
            "prefill_reused": details["prefill_reused"],
        }

    def aggregate(self, records: list[dict]) -> dict:
        ok = [r for r in records if "error" not in r]
        nll = sum(r["scores"]["nll_sum"] for r in ok)
        n = sum(r["scores"]["n_tokens"] for r in ok)
        metrics = {
            "ppl": math.exp(nll / n) if n else float("nan"),
            "nll": nll / n if n else float("nan"),
            "tokens": n,
            "windows": len(ok),
            "failed": len(records) - len(ok),
        }
        if n and all("kl_sum" in r["scores"] for r in ok):  # every window measured against BF16
            metrics["kl"] = sum(r["scores"]["kl_sum"] for r in ok) / n
            metrics["kl_p99"] = float(np.quantile(np.concatenate([_array(r["kl_tokens"]) for r in ok]), 0.99))
            metrics["top1"] = sum(r["scores"]["top1_hits"] for r in ok) / n
        return {"metrics": metrics, "categories": {}}


_ARRAYS: dict[int, tuple[list, np.ndarray]] = {}  # id of a record's kl_tokens -> (that list, its array)


def _array(values: list) -> np.ndarray:
    """`values` as a float64 array, made once per list object: a bootstrap aggregates the same records a thousand
    times, and turning their lists into arrays would be most of its time. A memo of what the list holds (the list is
    kept with it, so its id cannot pass to another list); records are never changed once written."""
    hit = _ARRAYS.get(id(values))
    if hit is not None and hit[0] is values and len(values) == hit[1].size:
        return hit[1]
    if len(_ARRAYS) >= 1 << 16:
        _ARRAYS.clear()
    array = np.asarray(values, dtype=np.float64)
    _ARRAYS[id(values)] = (values, array)
    return array


# 1,024 tokens of context, 512 scored: four times the 128-token window of the paper comparison.
TASK = PerplexityTask(context=1024, continuation=512, batch=8, name="ppl")
# A long context (4K tokens, 512 scored), where token-norm imbalance across many blocks shows.
TASK_LONG = PerplexityTask(context=4096, continuation=512, batch=2, name="ppl-4k")
