"""Hand-made result files for the results/compare/leaderboard tests (built in code, validated here)."""

from __future__ import annotations

import copy
from typing import Any, Sequence

from harness import results as R

BASE: dict[str, Any] = {
    "schema_version": 1,
    "date": "2026-01-01T00:00:00+00:00",
    "seed": 0,
    "model": {
        "name": "tiny-model",
        "hub_id": "example/tiny",
        "family": "text",
        "revision": None,
        "weight_hash": "sha256-sampled:00",
        "replica": True,
    },
    "backend": "torch",
    "environment": {
        "python": "3.11",
        "platform": "Linux",
        "cpu": "cpu",
        "gpu": None,
        "packages": {"torch": "2.13"},
        "git_commit": None,
        "git_dirty": None,
    },
}


def make_result(
    method: str,
    scores: Sequence[float],
    categories: Sequence[str] | None = None,
    *,
    task: str = "handmade",
    version: int = 1,
    fingerprint: str = "fp-1",
    metric: str = "accuracy",
    higher_is_better: bool = True,
    kv_total: float = 1000.0,
    bits: float = 16.0,
    model: str = "tiny-model",
    score_key: str | None = None,
) -> dict[str, Any]:
    """A valid schema-v1 result whose per-item scores[score_key or metric] are `scores`; the metric is
    their mean."""
    cats = list(categories) if categories is not None else [None] * len(scores)
    samples = [
        {
            "id": f"item-{i}",
            "prediction": f"p{i}-{method}",
            "scores": {score_key or metric: float(s)},
            "category": c,
            "wall_s": 0.1,
            "loop_s": 0.1,
            "input_tokens": 10,
            "new_tokens": 2,
        }
        for i, (s, c) in enumerate(zip(scores, cats))
    ]
    mean = sum(scores) / len(scores)
    by_cat: dict[str, list[float]] = {}
    for s, c in zip(scores, cats):
        if c is not None:
            by_cat.setdefault(c, []).append(float(s))
    result = copy.deepcopy(BASE)
    result["model"]["name"] = model
    result.update(
        {
            "method": {"name": method, "config": {"method": method, "name": method}, "bits": bits},
            "task": {
                "name": task,
                "version": version,
                "data": "generated",
                "data_fingerprint": fingerprint,
                "n_items": len(scores),
                "limit": None,
            },
            "primary_metric": metric,
            "metrics": {
                metric: {
                    "value": mean,
                    "ci_low": mean - 0.1,
                    "ci_high": mean + 0.1,
                    "ci_method": "hand-made",
                    "higher_is_better": higher_is_better,
                    "n": len(scores),
                }
            },
            "categories": {c: {"n": len(v), "metrics": {metric: sum(v) / len(v)}} for c, v in by_cat.items()},
            "samples": samples,
            "system": {
                "kv_bytes": {
                    "total": kv_total,
                    "quantized": kv_total * 0.9,
                    "full_precision": kv_total * 0.1,
                    "max_total": kv_total,
                    "per_modality": {},
                },
                "bits_per_element": bits,
                "wall_s": 0.1 * len(scores),
                "tokens_per_s": 120.0,
                "new_tokens_per_s": 20.0,
                "peak_memory": {"cpu_rss_bytes": 1 << 30, "cuda_bytes": None},
                "device": "cpu",
            },
            "n_errors": 0,
            "notes": [],
        }
    )
    return result


def test_factory_results_are_valid():
    R.validate(make_result("bf16", [1, 0, 1], ["a", "b", "a"]))
