"""OCRBench scoring, following the official rule (Yuliang-Liu/MultimodalOCR, OCRBench/example.py).

A sample scores 1 when any ground-truth answer, normalized, is a substring of the normalized
prediction; otherwise 0. Normalization depends on the source dataset:

- HME100k (handwritten math, LaTeX answers): strip, newlines -> space, then drop every space;
  case is kept (``\\Alpha`` and ``\\alpha`` differ).
- every other source: lower-case, strip, newlines -> space.

Scores are summed per category (10 categories, 1000 items in the real set) and in total. Unlike
lmms-eval's copy, nothing here accumulates in module state, and full-width characters are not folded.
All functions are pure.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

HME_DATASET = "HME100k"

# The ten categories with their point totals in the real benchmark (sum 1000).
CATEGORY_POINTS: dict[str, int] = {
    "Regular Text Recognition": 50,
    "Irregular Text Recognition": 50,
    "Artistic Text Recognition": 50,
    "Handwriting Recognition": 50,
    "Digit String Recognition": 50,
    "Non-Semantic Text Recognition": 50,
    "Scene Text-centric VQA": 200,
    "Doc-oriented VQA": 200,
    "Key Information Extraction": 200,
    "Handwritten Mathematical Expression Recognition": 100,
}
CATEGORIES: tuple[str, ...] = tuple(CATEGORY_POINTS)
# The six recognition categories are also reported together as "Text Recognition" (out of 300).
RECOGNITION: tuple[str, ...] = CATEGORIES[:6]


def normalize(text: str, dataset: str) -> str:
    """The official normalization of one answer or prediction for a sample from `dataset`."""
    if dataset == HME_DATASET:
        return text.strip().replace("\n", " ").replace(" ", "")
    return text.lower().strip().replace("\n", " ")


def as_answer_list(answers: str | Sequence[str]) -> list[str]:
    """The official data holds either one answer string or a list of them; always give a list."""
    if isinstance(answers, str):
        return [answers]
    return [str(a) for a in answers]


def score_sample(prediction: str, answers: str | Sequence[str], dataset: str) -> int:
    """1 if any normalized answer is a substring of the normalized prediction, else 0.

    An empty answer list scores 0, as in the official loop (which never enters its body); the task
    reports such items as errors before they get here.
    """
    predicted = normalize(prediction, dataset)
    return int(any(normalize(a, dataset) in predicted for a in as_answer_list(answers)))


def _category_totals(records: Iterable[dict[str, Any]]) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Per category: points won, items scored, items that failed (records with "error")."""
    won = {c: 0 for c in CATEGORIES}
    scored = {c: 0 for c in CATEGORIES}
    failed = {c: 0 for c in CATEGORIES}
    for record in records:
        category = record.get("category")
        if category not in won:
            raise ValueError(
                f"record {record.get('id')!r} has category {category!r}; OCRBench categories are {list(CATEGORIES)}"
            )
        if "error" in record:
            failed[category] += 1
            continue
        won[category] += int(record["scores"]["score"])
        scored[category] += 1
    return won, scored, failed


def aggregate(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Sum the per-sample scores into the official report.

    Returns {"metrics": {"total": points (out of 1000 on the real set), "text_recognition": points
    (out of 300), "accuracy": total / items, "n": items, "n_errors": failed items, one key per
    category with its points}, "categories": {category: {"score": points, "n": items scored,
    "n_errors": failed items, "accuracy": points / n or None}}}. Failed items win no points, as in
    the official script where an item without a prediction adds nothing.
    """
    won, scored, failed = _category_totals(records)
    total = sum(won.values())
    n_items = len(records)
    categories = {
        c: {
            "score": won[c],
            "n": scored[c],
            "n_errors": failed[c],
            "accuracy": (won[c] / scored[c]) if scored[c] else None,
        }
        for c in CATEGORIES
    }
    metrics: dict[str, Any] = {
        "total": total,
        "text_recognition": sum(won[c] for c in RECOGNITION),
        "accuracy": total / n_items if n_items else 0.0,
        "n": n_items,
        "n_errors": sum(failed.values()),
    }
    metrics.update({c: won[c] for c in CATEGORIES})
    return {"metrics": metrics, "categories": categories}
