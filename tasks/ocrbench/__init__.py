"""OCRBench (echo840/OCRBench): 1000 OCR questions over images in ten categories, scored out of 1000.

Prompt: the bare question (stripped, as lmms-eval does) with the image; greedy decoding, at most
128 new tokens (lmms-eval's setting). Scoring: tasks.ocrbench.score (the official rule).
VERSION is bumped whenever the prompt or the metric changes; results record it.
"""

from __future__ import annotations

from typing import Any

from tasks.base import TaskDataError
from tasks.contract import Generate, Prompt, Response
from tasks.ocrbench import data as ocr_data
from tasks.ocrbench import score

VERSION = 1
MAX_NEW_TOKENS = 128


def prompt_text(item: dict[str, Any]) -> str:
    """The text part of the prompt: the bare question."""
    return item["question"].strip()


def generation_fields(response: Response) -> dict[str, Any]:
    """A generate response's figures as a record keeps them (tasks/contract.py: Response)."""
    return {
        "modality_tokens": dict(response.modality_tokens),
        "kv_bytes": dict(response.kv_bytes),
        "input_tokens": response.input_tokens,
        "new_tokens": response.new_tokens,
        "tokens_sha1": response.tokens_sha1,
        "wall_s": response.wall_s,
        "graph_steps": response.graph_steps,
    }


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
            raise TaskDataError(
                f"OCRBench items with unknown question_type {unknown}; expected {list(score.CATEGORIES)}"
            )
        return items

    def requests(self, item: dict[str, Any]) -> list[Generate]:
        """The question with the item's image; TaskDataError for an unreadable image or an item without answers."""
        if not item["answers"]:
            raise TaskDataError(f"item {item['id']}: empty answer list; the item cannot be scored (fix the data)")
        prompt = Prompt(text=prompt_text(item), images=[ocr_data.open_image(item)])
        return [Generate(prompt, self.max_new_tokens)]

    def record(self, item: dict[str, Any], responses: list[Response], error: str | None = None) -> dict[str, Any]:
        """{"id", "prediction", "scores": {"score": 0|1}, "category", "dataset", "cluster", "answers", cost
        figures} or {"id", "category", "dataset", "cluster", "error"} for an item that could not run. cluster: the
        source dataset (items of one dataset are alike: the clustered interval resamples datasets)."""
        base = {
            "id": item["id"],
            "category": item["question_type"],
            "dataset": item["dataset"],
            "cluster": item["dataset"],
        }
        error = error or (responses[0].error and f"item {item['id']}: {responses[0].error}")
        if error:
            return {**base, "error": error}
        prediction = responses[0].text
        return {
            **base,
            "prediction": prediction,
            "answers": list(item["answers"]),
            "scores": {"score": score.score_sample(prediction, item["answers"], item["dataset"])},
            "empty_prediction": not prediction.strip(),
            **generation_fields(responses[0]),
        }

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return score.aggregate(records)

    def data_fingerprint(self, items: list[dict[str, Any]]) -> str:
        return ocr_data.fingerprint(items)

    def describe(self) -> dict[str, Any]:
        """Settings a result should record besides the version."""
        return {
            "prompt": "bare question",
            "decoding": "greedy",
            "max_new_tokens": self.max_new_tokens,
            "scorer": "official OCRBench/example.py rule (no full-width folding)",
        }


TASK = OCRBenchTask()
