"""A finished run's records aggregated: each metric with its bootstrap interval (clustered where the items are),
the categories, and the scorer a task gets for the model's weights."""

from __future__ import annotations

import copy
from typing import Any

from harness import results as R
from harness import stats

# Counts some tasks return among their metrics; the result has them as n_items / n_errors instead.
COUNT_KEYS = frozenset({"n", "n_items", "n_errors", "n_unscored", "failed", "windows", "tokens", "empty_references"})


def scoring_for(task, model_info: dict[str, Any]):
    """The task as this model's run scores it: a task that scores with models of its own (MMAU-Pro's judge) gets the
    registry to find them by name (tasks.contract.ModelSource); a shape-real model with random weights answers noise,
    so such a task gets a copy that does not run them."""
    random_size = model_info.get("weights") == "random" and not model_info.get("replica")
    if random_size and getattr(task, "model_scoring", False):
        task = copy.copy(task)
        task.model_scoring = False
    if getattr(task, "models", False) is None:
        from harness.models.source import RegistrySource

        task = copy.copy(task)
        task.models = RegistrySource()
    return task


def aggregate_with_ci(task, records, n_resamples: int, seed: int):
    """(metrics, categories) in the schema's shape; intervals from a bootstrap over the task's aggregate. A run
    whose items were all left unscored (`scoring_for`) gets its primary metric as null."""
    agg = task.aggregate(records)
    point = {k: R.number(v) for k, v in agg["metrics"].items() if R.is_number(v) and k not in COUNT_KEYS}
    unscored = bool(agg["metrics"].get("n_unscored"))
    if not point and not unscored:
        raise ValueError(f"task {task.name}: aggregate() returned no numeric metric ({agg['metrics']!r})")

    def statistics(rs):
        m = task.aggregate(rs)["metrics"]
        return {k: R.number(m.get(k)) for k in point}

    cis = stats.bootstrap_cis(records, statistics, n_resamples=n_resamples, seed=seed) if point else {}
    method = stats.ci_method_text(n_resamples)
    metrics = {
        k: {
            "value": v,
            "ci_low": cis[k][0],
            "ci_high": cis[k][1],
            "ci_method": method,
            "higher_is_better": R.higher_is_better(k, task),
            "n": len(records),
        }
        for k, v in point.items()
    }
    clusters = stats.clusters_of(records)  # items in clusters (a source dataset, a clip, a haystack): that interval too
    if clusters is not None and point:
        within = stats.bootstrap_cis_clustered(records, clusters, statistics, n_resamples=n_resamples, seed=seed)
        n = len(set(clusters))
        text = stats.ci_method_clustered_text(n, n_resamples)
        for k in point:
            metrics[k]["clustered"] = {"ci_low": within[k][0], "ci_high": within[k][1], "ci_method": text, "n": n}
    primary = getattr(task, "primary_metric", None)
    if unscored and primary and primary not in metrics:  # items left unscored (`scoring_for`): no value to give
        metrics[primary] = {
            "value": None,
            "ci_low": None,
            "ci_high": None,
            "ci_method": "not scored",
            "higher_is_better": R.higher_is_better(primary, task),
            "n": len(records),
        }
    categories = {}
    for cat, values in (agg.get("categories") or {}).items():
        n = int(values.get("n", sum(1 for r in records if r.get("category") == cat)))
        nums = {k: R.number(v) for k, v in values.items() if k != "n" and R.is_number(v)}
        categories[str(cat)] = {"n": n, "metrics": nums}
    return metrics, categories
