"""LongBench-E scoring as THUDM/LongBench's eval.py (`--e`) and metrics.py do it, rule for rule.

An item scores max(0, max over its answers of metric(prediction, answer)); trec, triviaqa and samsum score only the
first line of the prediction (after leading newlines). Items fall in length buckets by their `length` field (< 4000
"0-4k", < 8000 "4-8k", else "8k+"); a bucket is round(100 * mean, 2). eval.py stops there (one dict of buckets per
set); the paper's LongBench-E average is the OScaR repository's eval_long_bench.py (4f76613): a set's score is the
plain mean of its three rounded buckets and the average is the plain mean of the sets' scores.

Empty buckets: numpy's mean of an empty bucket is NaN there, and NaN makes the set's score and the average NaN. On the
official data every bucket of every set has items, so that never happens; on a part of it (`--limit`, a subset) the
average here is taken over the buckets and sets that have items, which equals the official number whenever all 39
buckets are filled (the result's categories show which buckets had items).

Failed items: the official pipeline has none (an exception ends its run). Here an item whose generation failed counts
as 0.0 in its bucket, the score of an empty answer; an item whose line could not be read has no length, so it is
only counted among the errors.
"""

from __future__ import annotations

import math
import re
import string
import sys
import threading
from collections import Counter
from typing import Any, Sequence

import numpy as np

from tasks.longbench_e import fuzzy
from tasks.longbench_e.prompts import DATASETS, FIRST_LINE, METRICS

BUCKETS = ("0-4k", "4-8k", "8k+")
_PUNCTUATION = frozenset(string.punctuation)  # ASCII only, as metrics.py: curly quotes and dashes stay


def normalize_answer(s: str) -> str:
    """metrics.py's normalize_answer: lower case, ASCII punctuation dropped, articles a/an/the -> space, spaces
    collapsed (in that order)."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_score(prediction: Sequence[str], ground_truth: Sequence[str]) -> float:
    """Token-multiset F1; 0 when nothing is shared (also for empty lists)."""
    same = sum((Counter(prediction) & Counter(ground_truth)).values())
    if same == 0:
        return 0.0
    precision = same / len(prediction)
    recall = same / len(ground_truth)
    return (2 * precision * recall) / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, **_: Any) -> float:
    return f1_score(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


# eval.py calls the metric from a script's top level: <module> -> scorer_e -> rouge_score, under CPython's default
# recursion limit. rouge 1.0.1's ROUGE-L back-trace recurses once per step, so whether a long one-sentence pair scores
# or ends in RecursionError (-> 0.0) depends on how deep the stack already is: ~990 words there. The call runs in a
# thread of its own with the limit set so that it has exactly that room, whoever calls it and however deep.
OFFICIAL_LIMIT = 1000
OFFICIAL_FRAMES = 3


def _frames() -> int:
    """Python frames on this thread's stack, the caller's included."""
    frame, depth = sys._getframe(1), 0
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    return depth


def rouge_score(prediction: str, ground_truth: str, **_: Any) -> float:
    """ROUGE-L F of rouge 1.0.1 (`Rouge().get_scores([pred], [gt], avg=True)["rouge-l"]["f"]`); any exception (an
    empty or "."-only prediction, a too deep back-trace) scores 0.0, as metrics.py's bare `except`."""
    from rouge import Rouge

    out: list[float] = []

    def as_in_eval_py() -> None:  # plays eval.py's rouge_score: the frame that calls get_scores
        sys.setrecursionlimit(OFFICIAL_LIMIT + _frames() - OFFICIAL_FRAMES)
        try:
            out.append(float(Rouge().get_scores([prediction], [ground_truth], avg=True)["rouge-l"]["f"]))
        except Exception:  # noqa: BLE001 - the official rule: any failure of the scorer is a 0
            out.append(0.0)

    limit = sys.getrecursionlimit()
    thread = threading.Thread(target=as_in_eval_py, name="longbench-rouge")
    try:
        thread.start()
        thread.join()
    finally:
        sys.setrecursionlimit(limit)
    return out[0] if out else 0.0


def classification_score(prediction: str, ground_truth: str, all_classes: Sequence[str], **_: Any) -> float:
    """metrics.py's classification_score, its list edited while iterated over (a removal skips the next class)."""
    matches = [name for name in all_classes if name in prediction]
    for term in matches:  # the official loop: removing while iterating is part of the rule
        if term in ground_truth and term != ground_truth:
            matches.remove(term)
    return 1.0 / len(matches) if ground_truth in matches else 0.0


def _share_equal(prediction: str, target: str) -> float:
    numbers = re.findall(r"\d+", prediction)
    return 0.0 if not numbers else sum(1 for n in numbers if n == target) / len(numbers)


def count_score(prediction: str, ground_truth: Any, **_: Any) -> float:
    """Share of the digit runs in the prediction equal to str(answer)."""
    return _share_equal(prediction, str(ground_truth))


def retrieval_id(ground_truth: str) -> str:
    """The paragraph number of a passage_retrieval answer (the first `Paragraph N`); ValueError when there is none
    (metrics.py raises IndexError there)."""
    found = re.findall(r"Paragraph (\d+)", ground_truth)
    if not found:
        raise ValueError(f"answer {ground_truth!r} holds no 'Paragraph <number>'")
    return found[0]


def retrieval_score(prediction: str, ground_truth: str, **_: Any) -> float:
    return _share_equal(prediction, retrieval_id(ground_truth))


def code_line(prediction: str) -> str:
    """The first line of the prediction holding no "`", "#" or "//" ("" if none)."""
    for line in prediction.lstrip("\n").split("\n"):
        if "`" not in line and "#" not in line and "//" not in line:
            return line
    return ""


def code_sim_score(prediction: str, ground_truth: str, backend: str = fuzzy.DEFAULT_BACKEND, **_: Any) -> float:
    return fuzzy.ratio(code_line(prediction), ground_truth, backend) / 100


FUNCTIONS = {
    "qa_f1": qa_f1_score,
    "rouge": rouge_score,
    "classification": classification_score,
    "count": count_score,
    "retrieval": retrieval_score,
    "code_sim": code_sim_score,
}


def score_item(
    dataset: str,
    prediction: str,
    answers: Sequence[Any],
    all_classes: Sequence[str] | None = None,
    backend: str = fuzzy.DEFAULT_BACKEND,
) -> float:
    """eval.py's per-item score: the first line for trec/triviaqa/samsum, then the best answer's metric, at least 0."""
    if dataset in FIRST_LINE:
        prediction = prediction.lstrip("\n").split("\n")[0]
    metric = FUNCTIONS[METRICS[dataset]]
    score = 0.0
    for answer in answers:
        score = max(score, metric(prediction, answer, all_classes=all_classes, backend=backend))
    return float(score)


def bucket(length: float) -> str:
    return "0-4k" if length < 4000 else "4-8k" if length < 8000 else "8k+"


def _mean(values: Sequence[float]) -> float:
    """numpy's mean, as the official scripts take it (pairwise summation); NaN for nothing, without its warning."""
    return float(np.mean(values)) if len(values) else math.nan


def bucket_scores(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """{dataset: {bucket: round(100 * mean, 2), NaN when empty}} over the records of each dataset present; a failed
    record with a length counts 0.0, one without (an unreadable line) is left out. The rounding is numpy's, as
    eval.py's `round(100 * np.mean(...), 2)` on a numpy float."""
    scores: dict[str, dict[str, list[float]]] = {}
    for r in records:
        if "error" in r and r.get("length") is None:
            continue
        value = 0.0 if "error" in r else float(r["scores"]["score"])
        scores.setdefault(r["dataset"], {b: [] for b in BUCKETS})[bucket(r["length"])].append(value)
    return {
        d: {b: float(round(100 * np.mean(v[b]), 2)) if v[b] else math.nan for b in BUCKETS} for d, v in scores.items()
    }


def _present_mean(values) -> float:
    return _mean([v for v in values if not math.isnan(v)])


def aggregate(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """{"metrics": {"average" (the paper's LongBench-E average), one per dataset (its mean of buckets), "0-4k",
    "4-8k", "8k+" (each bucket's mean over the datasets), "n", "n_errors"}, "categories": {dataset: {"score", the
    three buckets (absent when empty), "n", "n_errors"}}}."""
    table = bucket_scores(records)
    order = [d for d in DATASETS if d in table] + sorted(d for d in table if d not in DATASETS)
    per_set = {d: _present_mean(table[d].values()) for d in order}
    average = _present_mean(per_set.values())
    metrics: dict[str, Any] = {"average": average if math.isnan(average) else float(round(np.float64(average), 2))}
    metrics.update({d: per_set[d] for d in order})
    for b in BUCKETS:
        metrics[b] = _present_mean(table[d][b] for d in order)
    metrics["n"] = len(records)
    metrics["n_errors"] = sum(1 for r in records if "error" in r)
    scored = Counter(r.get("dataset") for r in records if "error" not in r)
    failed = Counter(r.get("dataset") for r in records if "error" in r)
    categories = {}
    for d in order:
        filled = {b: v for b, v in table[d].items() if not math.isnan(v)}
        categories[d] = {"score": per_set[d], **filled, "n": scored[d], "n_errors": failed[d]}
    return {"metrics": metrics, "categories": categories}
