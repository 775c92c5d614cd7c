"""RULER's niah scoring (NVIDIA/RULER scripts/eval/evaluate.py and scripts/eval/synthetic/constants.py), and the
cells of the length x depth heat map.

A prediction is post-processed as RULER's postprocess_pred does: stripped, every character in [\\x00-\\x1f] made a
newline, stripped again. string_match_all: for each item the share of its answers r with r.lower() in pred.lower()
(a plain substring: "123456789" holds "2345678"), averaged over items, times 100, rounded to 2 decimals. RULER
reports one such number per task and length; here the same formula gives the overall number, each variant's and
each length x depth cell's.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from tasks.niah.haystack import DEPTHS, VARIANTS

METRIC = "string_match_all"
CONTROL = re.compile(r"[\x00-\x1f]")
# The heat map's depth rows: RULER's 40 depths in 10 consecutive groups of 4 (0-8%, 10-18%, ..., 92-100%).
DEPTH_BINS: tuple[tuple[int, ...], ...] = tuple(DEPTHS[i : i + 4] for i in range(0, len(DEPTHS), 4))


def postprocess(prediction: str) -> str:
    """RULER's postprocess_pred."""
    return CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """RULER's string_match_all over post-processed predictions; every item needs at least one reference."""
    if len(predictions) != len(references) or not predictions:
        raise ValueError(
            f"string_match_all needs as many predictions as references, at least one: "
            f"{len(predictions)} and {len(references)}"
        )
    total = 0.0
    for prediction, refs in zip(predictions, references):
        if not refs:
            raise ValueError(f"string_match_all: an item without references (prediction {prediction[:40]!r})")
        pred = prediction.lower()
        total += sum(1.0 if r.lower() in pred else 0.0 for r in refs) / len(refs)
    return round(total / len(predictions) * 100, 2)


def item_score(prediction: str, answers: Sequence[str]) -> float:
    """One item's string_match_all (0 to 100)."""
    return string_match_all([postprocess(prediction)], [answers])


def depth_bin(depth: int) -> int:
    """The heat-map row of a grid depth."""
    for row, depths in enumerate(DEPTH_BINS):
        if depth in depths:
            return row
    raise ValueError(f"depth {depth} is not on RULER's grid {DEPTHS}")


def depth_label(row: int) -> str:
    depths = DEPTH_BINS[row]
    return f"{depths[0]}-{depths[-1]}%"


def length_label(length: int) -> str:
    """4096 -> '4K'; a length that is no multiple of 1024 stays a number."""
    return f"{length // 1024}K" if length % 1024 == 0 else str(length)


def cell_label(length: int, depth: int) -> str:
    """The record's category: its heat-map cell, e.g. '4K, depth 0-8%'."""
    return f"{length_label(length)}, depth {depth_label(depth_bin(depth))}"


def _score(records: Sequence[dict[str, Any]]) -> float:
    """string_match_all of records; a failed item counts as an empty prediction, as it would in RULER's files."""
    preds = [postprocess(r.get("prediction") or "") for r in records]
    return string_match_all(preds, [r["answers"] for r in records])


def cells(records: Sequence[dict[str, Any]]) -> dict[tuple[int, int], tuple[float, int]]:
    """{(length, depth row): (string_match_all, items)} of records from one or more lengths."""
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((int(r["length"]), depth_bin(int(r["depth"]))), []).append(r)
    return {key: (_score(group), len(group)) for key, group in sorted(groups.items())}


def by_length(records: Sequence[dict[str, Any]]) -> dict[int, float]:
    """{length: string_match_all of its records}."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(int(r["length"]), []).append(r)
    return {length: _score(group) for length, group in sorted(groups.items())}


def aggregate(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """{"metrics": {string_match_all over all items, one per variant present, n, n_errors}, "categories": {cell:
    {string_match_all, n}}}; failed items score 0 (an empty prediction)."""
    if not records:
        return {"metrics": {METRIC: None, "n": 0, "n_errors": 0}, "categories": {}}
    metrics: dict[str, Any] = {METRIC: _score(records)}
    for name in VARIANTS:
        own = [r for r in records if r["variant"] == name]
        if own:
            metrics[name] = _score(own)
    metrics.update(n=len(records), n_errors=sum(1 for r in records if "error" in r))
    categories = {
        f"{length_label(length)}, depth {depth_label(row)}": {METRIC: value, "n": n}
        for (length, row), (value, n) in cells(records).items()
    }
    return {"metrics": metrics, "categories": categories}
