"""OCRBench (echo840/OCRBench): 1000 OCR questions over images in ten categories, scored out of 1000.

Prompt: the bare question (stripped, as lmms-eval does) with the image; greedy decoding, at most
128 new tokens (lmms-eval's setting). Scoring: tasks.ocrbench.score (the official rule).
VERSION is bumped whenever the prompt or the metric changes; results record it.
"""
from __future__ import annotations

import traceback
from typing import Any

from tasks.base import TaskDataError
from tasks.ocrbench import data as ocr_data
from tasks.ocrbench import score

VERSION = 1
MAX_NEW_TOKENS = 128


def prompt_text(item: dict[str, Any]) -> str:
    """The text part of the prompt: the bare question."""
    return item["question"].strip()


def _generation_record(generation) -> dict[str, Any]:
    """The cost figures of one adapter.generate call (harness.models.base.Generation)."""
    return {
        "modality_tokens": dict(generation.modality_tokens),
        "kv_bytes": dict(generation.kv_bytes),
        "input_tokens": generation.input_tokens,
        "new_tokens": generation.new_tokens,
        "tokens_sha1": generation.tokens_sha1,
        "wall_s": generation.wall_s,
        "graph_steps": generation.graph_steps,
    }


def generate_or_error(adapter, prompt, method, item_id: str, max_new_tokens: int):
    """(Generation, None) or (None, error text): a failing generate becomes a recorded per-item
    failure naming the item and the exception, never an empty answer."""
    try:
        return adapter.generate(prompt, method, max_new_tokens=max_new_tokens), None
    except Exception as exc:  # one bad item must not end a 1000-item run; the error is kept
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return None, (f"item {item_id}: generation failed: {type(exc).__name__}: {exc} "
                      f"(at {where.filename}:{where.lineno})")


class OCRBenchTask:
    name = "ocrbench"
    version = VERSION
    modalities = ("image", "text")
    primary_metric = "total"  # points out of 1000 on the real set, as the paper reports

    def __init__(self, max_new_tokens: int = MAX_NEW_TOKENS):
        """max_new_tokens: the official setting is 128; smaller only for quick smoke runs (recorded)."""
        self.max_new_tokens = max_new_tokens

    def load(self, data: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        items = ocr_data.load_items(data, limit)
        unknown = sorted({i["question_type"] for i in items} - set(score.CATEGORIES))
        if unknown:
            raise TaskDataError(f"OCRBench items with unknown question_type {unknown}; "
                                f"expected {list(score.CATEGORIES)}")
        return items

    def build_prompt(self, item: dict[str, Any]):
        """harness.models.base.Prompt for `item`; raises TaskDataError for an unreadable image."""
        from harness.models.base import Prompt

        return Prompt(text=prompt_text(item), images=[ocr_data.open_image(item)])

    def run_item(self, adapter, method, item: dict[str, Any]) -> dict[str, Any]:
        """{"id", "prediction", "scores": {"score": 0|1}, "category", "dataset", "answers", cost
        figures} or {"id", "category", "error"} for an item that cannot run."""
        base = {"id": item["id"], "category": item["question_type"], "dataset": item["dataset"]}
        if not item["answers"]:
            return {**base, "error": f"item {item['id']}: empty answer list; the item cannot be scored (fix the data)"}
        try:
            prompt = self.build_prompt(item)
        except TaskDataError as exc:
            return {**base, "error": str(exc)}
        generation, error = generate_or_error(adapter, prompt, method, item["id"], self.max_new_tokens)
        if error:
            return {**base, "error": error}
        prediction = generation.text
        return {
            **base,
            "prediction": prediction,
            "answers": list(item["answers"]),
            "scores": {"score": score.score_sample(prediction, item["answers"], item["dataset"])},
            "empty_prediction": not prediction.strip(),
            **_generation_record(generation),
        }

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return score.aggregate(records)

    def data_fingerprint(self, items: list[dict[str, Any]]) -> str:
        return ocr_data.fingerprint(items)

    def describe(self) -> dict[str, Any]:
        """Settings a result should record besides the version."""
        return {"prompt": "bare question", "decoding": "greedy", "max_new_tokens": self.max_new_tokens,
                "scorer": "official OCRBench/example.py rule (no full-width folding)"}


TASK = OCRBenchTask()
