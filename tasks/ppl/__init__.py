"""Perplexity of real prose through the quantized cache, scored past the full-precision window.

Text: the license texts every Debian machine ships in /usr/share/common-licenses (real English prose the
project did not write), read in a fixed order as one stream and cut into windows. In each window the first
`context` tokens are the prompt (prefilled with exact attention and stored in the quantized cache); the next
`continuation` tokens are scored by teacher forcing, each attending over the cache as its own decode step would.
With a continuation longer than a method's window R, most scored tokens attend over quantized recent tokens, not
only over a quantized distant past.

Speed without changing what is scored (tasks/ppl/scoring.py): the windows of a run go through the model in
batches, the prompt's exact forward runs once per batch for all the methods of a run (scoring.Prefills), and the
continuation goes in chunks a method declares exact (MethodConfig.exact_chunk: e.g. R - 1 tokens
between two block flushes, then the flushing token alone), so each scored token sees exactly what one decode step
at a time would show it.
Metric: perplexity = exp(sum of NLL / number of scored tokens) over all windows.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path

from tasks.base import TaskDataError
from tasks.ppl.scoring import Prefills, score_batch

LICENSE_DIR = Path("/usr/share/common-licenses")
LICENSE_FILES = ("GPL-3", "LGPL-2.1", "GFDL-1.3", "MPL-2.0", "Apache-2.0", "CC0-1.0", "Artistic", "GPL-2", "MPL-1.1")
CHARS_PER_TOKEN = 5.0  # English prose has 4.3-4.6 characters per token in these tokenizers; windows keep a margin


class PerplexityTask:
    modalities = ("text",)
    version = 2

    def __init__(self, context: int = 1024, continuation: int = 512, batch: int = 8, name: str = "ppl"):
        if context < 1 or continuation < 2:
            raise ValueError(f"ppl: context must be >= 1 and continuation >= 2 tokens, "
                             f"got {context} and {continuation}")
        self.name, self.context, self.continuation, self.batch = name, context, continuation, batch
        self.window_chars = int(math.ceil((context + continuation) * CHARS_PER_TOKEN))
        self._order: list[dict] = []  # the loaded items, so one call can score the next few windows with it
        self._done: dict[tuple[str, str], dict] = {}  # records scored ahead of their turn
        self._prefills = Prefills()  # the exact prompts' forwards, shared by the methods of a run

    def describe(self) -> dict:
        return {"context_tokens": self.context, "scored_tokens": self.continuation, "window_chars": self.window_chars,
                "texts": [f"{LICENSE_DIR}/{n}" for n in LICENSE_FILES],
                "scoring": "teacher forcing; each scored token attends over the cache as its decode step would"}

    def sources(self, data: str | None) -> list[Path]:
        if data in (None, "generated"):
            paths = [LICENSE_DIR / name for name in LICENSE_FILES]
            missing = [str(p) for p in paths if not p.is_file()]
            if missing:
                raise TaskDataError(f"ppl: missing license texts {missing}; install Debian's base-files, or pass "
                                    "--data with a text file or a folder of .txt files")
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
        items = [{"id": f"chars@{start}", "paths": [str(p) for p in paths], "start": start,
                  "sha": hashlib.sha1(text[start:start + n].encode()).hexdigest()[:12]}
                 for start in range(0, len(text) - n + 1, n)]
        items = items[:limit] if limit else items
        self._order = items
        return items

    def data_fingerprint(self, items: list[dict]) -> str:
        key = f"{self.context}+{self.continuation}:" + "".join(i["sha"] for i in items)
        return hashlib.sha1(key.encode()).hexdigest()[:16]

    def window_ids(self, tokenizer, item: dict):
        text = self.stream([Path(p) for p in item["paths"]])[item["start"]:item["start"] + self.window_chars]
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
        need = self.context + self.continuation
        if ids.shape[1] < need:
            raise TaskDataError(f"ppl item {item['id']}: only {ids.shape[1]} tokens in {self.window_chars} characters, "
                                f"need {need} (context + continuation); the text is denser than {CHARS_PER_TOKEN} "
                                "characters a token: raise tasks.ppl.CHARS_PER_TOKEN")
        return ids[:, :need]

    def run_item(self, adapter, method, item: dict) -> dict:
        """Score `item`, together with the next windows of the run (up to `batch` in one forward) whose records
        are kept for their own call."""
        key = (repr(method.to_dict()), str(item["id"]))
        if key in self._done:
            return self._done.pop(key)
        ids = [str(i["id"]) for i in self._order]
        pos = ids.index(str(item["id"])) if str(item["id"]) in ids else None
        group = [item] if pos is None else self._order[pos:pos + self.batch]
        group = [g for g in group if g is item or (key[0], str(g["id"])) not in self._done]
        records = self.run_batch(adapter, method, group)
        for g, record in zip(group[1:], records[1:]):
            self._done[(key[0], str(g["id"]))] = record
        return records[0]

    def run_batch(self, adapter, method, items: list[dict]) -> list[dict]:
        """One record per item; windows too short for context + continuation are recorded as errors."""
        import time

        import torch

        start = time.perf_counter()
        rows, records = [], {}
        for item in items:
            try:
                rows.append((item, self.window_ids(adapter.tokenizer, item)))
            except TaskDataError as exc:
                records[str(item["id"])] = {"id": item["id"], "error": str(exc)}
        if rows:
            ids = torch.cat([r[1] for r in rows]).to(adapter.device)
            self._prefills.reused = False
            with torch.no_grad():
                nll, cache = score_batch(adapter, method, ids, self.context, self._prefills)
            kv = cache.nbytes()
            per_row = per_sequence(kv, len(rows))
            wall = (time.perf_counter() - start) / len(rows)
            for (item, _), row_nll in zip(rows, nll.tolist()):
                n = self.continuation
                records[str(item["id"])] = {
                    "id": item["id"], "prediction": None,
                    "scores": {"nll_sum": row_nll, "n_tokens": n, "ppl": math.exp(row_nll / n)},
                    "modality_tokens": {"text": self.context + n},
                    "kv_bytes": per_row, "bits_per_element": kv["bits_per_element"], "window": method.window,
                    "wall_s": wall,
                    # the prompt's forward was an earlier method's (scoring.Prefills): wall_s is the rest of the work
                    "prefill_reused": self._prefills.reused,
                }
        return [records[str(item["id"])] for item in items]

    def aggregate(self, records: list[dict]) -> dict:
        ok = [r for r in records if "error" not in r]
        nll = sum(r["scores"]["nll_sum"] for r in ok)
        n = sum(r["scores"]["n_tokens"] for r in ok)
        metrics = {"ppl": math.exp(nll / n) if n else float("nan"), "nll": nll / n if n else float("nan"),
                   "tokens": n, "windows": len(ok), "failed": len(records) - len(ok)}
        return {"metrics": metrics, "categories": {}}


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


# 1,024 tokens of context, 512 scored: four times the 128-token window of the paper comparison.
TASK = PerplexityTask(context=1024, continuation=512, batch=8, name="ppl")
# A long context (4K tokens, 512 scored), where token-norm imbalance across many blocks shows.
TASK_LONG = PerplexityTask(context=4096, continuation=512, batch=2, name="ppl-4k")
