"""Perplexity of real prose through the quantized cache.

Text: the license texts every Debian machine ships in /usr/share/common-licenses (real English prose the
project did not write). Each item is a window: the first `context` tokens are prefilled (exact attention)
and stored in the quantized cache, then the next `continuation` tokens are scored one decode step at a
time (teacher forcing), so every scored token attends over the quantized cache as in real decoding.
Metric: perplexity = exp(sum of NLL / number of scored tokens) over all windows.
"""
from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import torch

from tasks.base import TaskDataError

LICENSE_DIR = Path("/usr/share/common-licenses")
LICENSE_FILES = ("GPL-3", "LGPL-2.1", "GFDL-1.3", "MPL-2.0", "Apache-2.0", "CC0-1.0", "Artistic")
WINDOW_CHARS = 6000  # ~1.5K tokens of English, enough for context + continuation


class PerplexityTask:
    name = "ppl"
    version = 1
    modalities = ("text",)

    def __init__(self, context: int = 1024, continuation: int = 128):
        self.context, self.continuation = context, continuation

    def sources(self, data: str | None) -> list[Path]:
        if data in (None, "generated"):
            paths = [LICENSE_DIR / name for name in LICENSE_FILES]
            missing = [str(p) for p in paths if not p.is_file()]
            if missing:
                raise TaskDataError(f"ppl: missing license texts {missing}; install Debian's base-files, or pass --data "
                                    "with a text file or a folder of .txt files")
            return paths
        path = Path(data)
        if path.is_dir():
            return sorted(p for p in path.iterdir() if p.is_file())
        if path.is_file():
            return [path]
        raise TaskDataError(f"ppl: --data {data!r} is neither a file nor a folder of text files")

    def load(self, data: str | None, limit: int | None) -> list[dict]:
        """Windows of WINDOW_CHARS characters, in file order."""
        items = []
        for path in self.sources(data):
            text = path.read_text(encoding="utf-8", errors="replace")
            for start in range(0, len(text) - WINDOW_CHARS + 1, WINDOW_CHARS):
                items.append({"id": f"{path.name}@{start}", "path": str(path), "start": start,
                              "sha": hashlib.sha1(text[start:start + WINDOW_CHARS].encode()).hexdigest()[:12]})
        return items[:limit] if limit else items

    def data_fingerprint(self, items: list[dict]) -> str:
        return hashlib.sha1("".join(i["sha"] for i in items).encode()).hexdigest()[:16]

    def window_ids(self, tokenizer, item: dict) -> torch.Tensor:
        text = Path(item["path"]).read_text(encoding="utf-8", errors="replace")[item["start"]:item["start"] + WINDOW_CHARS]
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
        need = self.context + self.continuation
        if ids.shape[1] < need:
            raise TaskDataError(f"ppl item {item['id']}: only {ids.shape[1]} tokens, need {need} (context + continuation)")
        return ids[:, :need]

    @torch.no_grad()
    def run_item(self, adapter, method, item: dict) -> dict:
        try:
            ids = self.window_ids(adapter.tokenizer, item).to(adapter.device)
        except TaskDataError as exc:
            return {"id": item["id"], "error": str(exc)}
        nll, cache = score_continuation(adapter, method, ids, self.context)
        n = ids.shape[1] - self.context
        return {
            "id": item["id"],
            "prediction": None,
            "scores": {"nll_sum": nll, "n_tokens": n, "ppl": math.exp(nll / n)},
            "modality_tokens": {"text": int(ids.shape[1])},
            "kv_bytes": cache.nbytes(),
            "bits_per_element": cache.bits_per_element(),
        }

    def aggregate(self, records: list[dict]) -> dict:
        ok = [r for r in records if "error" not in r]
        nll = sum(r["scores"]["nll_sum"] for r in ok)
        n = sum(r["scores"]["n_tokens"] for r in ok)
        metrics = {"ppl": math.exp(nll / n) if n else float("nan"), "nll": nll / n if n else float("nan"),
                   "tokens": n, "windows": len(ok), "failed": len(records) - len(ok)}
        return {"metrics": metrics, "categories": {}}


def score_continuation(adapter, method, ids: torch.Tensor, context: int):
    """Prefill ids[:, :context] into a fresh cache, then teacher-force the rest one token per step.
    Returns (sum of NLL over ids[:, context:], the cache)."""
    model = adapter.model
    cache = adapter.make_cache(method, torch.zeros_like(ids[:, :context]))
    logits = model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True).logits[:, -1]
    nll = 0.0
    for t in range(context, ids.shape[1]):
        nll -= torch.log_softmax(logits.float(), -1)[0, ids[0, t]].item()
        if t + 1 < ids.shape[1]:
            logits = model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[:, -1]
    return nll, cache


TASK = PerplexityTask(
    context=int(os.environ.get("OSCAR_PPL_CONTEXT", 1024)),
    continuation=int(os.environ.get("OSCAR_PPL_CONTINUATION", 128)),
)
