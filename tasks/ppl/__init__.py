"""Perplexity of real prose through the quantized cache, scored past the full-precision window.

Text: the license texts every Debian machine ships in /usr/share/common-licenses (real English prose the
project did not write), read in a fixed order as one stream and cut into windows. In each window the first
`context` tokens are the prompt (prefilled with exact attention and stored in the quantized cache); the next
`continuation` tokens are scored by teacher forcing, each attending over the cache as its own decode step would.
With a continuation longer than a method's window R, most scored tokens attend over quantized recent tokens, not
only over a quantized distant past.

Each window is one `Score` request (tasks/contract.py); the runner scores them (harness/scoring.py): the windows
of a run go through the model in batches (`--batch-size`, default `default_batch_size`), the prompt's exact forward
runs once per batch for all the methods of a run, and the continuation goes in chunks a method declares exact
(MethodConfig.exact_chunk: e.g. R - 1 tokens between two block flushes, then the flushing token alone), so each
scored token sees exactly what one decode step at a time would show it.
Metric: perplexity = exp(sum of NLL / number of scored tokens) over all windows.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

from tasks.base import TaskDataError
from tasks.contract import Response, Score

LICENSE_DIR = Path("/usr/share/common-licenses")
LICENSE_FILES = ("GPL-3", "LGPL-2.1", "GFDL-1.3", "MPL-2.0", "Apache-2.0", "CC0-1.0", "Artistic", "GPL-2", "MPL-1.1")
CHARS_PER_TOKEN = 5.0  # English prose has 4.3-4.6 characters per token in these tokenizers; windows keep a margin


class PerplexityTask:
    modalities = ("text",)
    version = 2

    def __init__(self, context: int = 1024, continuation: int = 512, batch: int = 8, name: str = "ppl"):
        """batch: windows per forward when the run does not say (`default_batch_size`)."""
        if context < 1 or continuation < 2:
            raise ValueError(
                f"ppl: context must be >= 1 and continuation >= 2 tokens, got {context} and {continuation}"
            )
        self.name, self.context, self.continuation, self.default_batch_size = name, context, continuation, batch
        self.window_chars = int(math.ceil((context + continuation) * CHARS_PER_TOKEN))

    def describe(self) -> dict:
        return {
            "context_tokens": self.context,
            "scored_tokens": self.continuation,
            "window_chars": self.window_chars,
            "texts": [f"{LICENSE_DIR}/{n}" for n in LICENSE_FILES],
            "scoring": "teacher forcing; each scored token attends over the cache as its decode step would",
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
        """Consecutive windows of `window_chars` characters of the text stream, in order."""
        paths = self.sources(data)
        text = self.stream(paths)
        n = self.window_chars
        items = [
            {
                "id": f"chars@{start}",
                "paths": [str(p) for p in paths],
                "start": start,
                "sha": hashlib.sha1(text[start : start + n].encode()).hexdigest()[:12],
            }
            for start in range(0, len(text) - n + 1, n)
        ]
        return items[:limit] if limit else items

    def data_fingerprint(self, items: list[dict]) -> str:
        key = f"{self.context}+{self.continuation}:" + "".join(i["sha"] for i in items)
        return hashlib.sha1(key.encode()).hexdigest()[:16]

    def requests(self, item: dict) -> list[Score]:
        """The window's text: its first `context` tokens are the prompt, the next `continuation` are scored."""
        text = self.stream([Path(p) for p in item["paths"]])[item["start"] : item["start"] + self.window_chars]
        return [Score(text, self.context, self.continuation)]

    def record(self, item: dict, responses: list[Response], error: str | None = None) -> dict:
        """{"id", "scores": {"nll_sum", "n_tokens", "ppl"}, cache figures}; a window too short for context +
        continuation is an error naming the fix."""
        error = error or responses[0].error
        if error:
            dense = error.startswith("only ")  # the runner's words for a window with too few tokens
            return {
                "id": item["id"],
                "error": f"ppl item {item['id']}: {error}"
                + (
                    f"; the text is denser than {CHARS_PER_TOKEN} characters a token: raise tasks.ppl.CHARS_PER_TOKEN"
                    if dense
                    else ""
                ),
            }
        response = responses[0]
        n = response.scored
        return {
            "id": item["id"],
            "prediction": None,
            "scores": {"nll_sum": response.nll_sum, "n_tokens": n, "ppl": math.exp(response.nll_sum / n)},
            "modality_tokens": dict(response.modality_tokens),
            "kv_bytes": response.kv_bytes,
            "bits_per_element": response.details["bits_per_element"],
            "window": response.details["window"],
            "wall_s": response.wall_s,
            # the prompt's forward was an earlier method's (harness/scoring.py): wall_s is the rest of the work
            "prefill_reused": response.details["prefill_reused"],
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
        return {"metrics": metrics, "categories": {}}


# 1,024 tokens of context, 512 scored: four times the 128-token window of the paper comparison.
TASK = PerplexityTask(context=1024, continuation=512, batch=8, name="ppl")
# A long context (4K tokens, 512 scored), where token-norm imbalance across many blocks shows.
TASK_LONG = PerplexityTask(context=4096, continuation=512, batch=2, name="ppl-4k")
