"""The percentile bootstrap over clusters of items (harness.stats.bootstrap_cis_clustered), beside the one over items:
singleton clusters are the item bootstrap itself, identical items within a cluster are one draw, one cluster gives no
interval; the eval loop writes it where records have a `cluster` (OCRBench's real aggregate here) and the
leaderboard shows it, marked."""

from __future__ import annotations

import numpy as np
import pytest

from harness import record, stats
from harness.report import tables as T
from tasks.ocrbench import TASK as OCRBENCH


def mean_of(records):
    return {"mean": float(np.mean([r["x"] for r in records]))}


def records(values, clusters=None):
    out = [{"id": str(i), "x": float(v)} for i, v in enumerate(values)]
    for r, c in zip(out, clusters or []):
        r["cluster"] = c
    return out


def test_every_item_its_own_cluster_is_the_item_bootstrap():
    rs = records(np.random.default_rng(0).normal(size=40))
    clustered = stats.bootstrap_cis_clustered(rs, [r["id"] for r in rs], mean_of, n_resamples=300, seed=4)
    assert clustered == stats.bootstrap_cis(rs, mean_of, n_resamples=300, seed=4)
    assert stats.clusters_of(rs) is None  # records without clusters: no clustered interval at all


def test_identical_items_of_a_cluster_count_as_one_draw():
    """10 clusters of 20 identical items: the clustered interval is the item interval of the 10 cluster values (the
    same draws), and wider than the item bootstrap that takes the 200 items as independent."""
    values = np.random.default_rng(1).normal(size=10)
    rs = records(np.repeat(values, 20), np.repeat([f"c{i}" for i in range(10)], 20).tolist())
    clustered = stats.bootstrap_cis_clustered(rs, stats.clusters_of(rs), mean_of, n_resamples=500, seed=2)["mean"]
    assert clustered == pytest.approx(stats.bootstrap_cis(records(values), mean_of, n_resamples=500, seed=2)["mean"])
    items = stats.bootstrap_cis(rs, mean_of, n_resamples=500, seed=2)["mean"]
    assert clustered[1] - clustered[0] > 3 * (items[1] - items[0])


def test_one_cluster_gives_no_interval_and_records_without_a_cluster_stand_alone():
    rs = records([0, 1, 1, 0, 1], ["a"] * 5)
    assert stats.bootstrap_cis_clustered(rs, stats.clusters_of(rs), mean_of) == {"mean": (None, None)}
    rs = records([0, 1, 1, 0, 1], ["a", "a"])  # the last three have none: clusters of their own
    assert stats.clusters_of(rs) == ["a", "a", ("item", 2), ("item", 3), ("item", 4)]
    low, high = stats.bootstrap_cis_clustered(rs, stats.clusters_of(rs), mean_of, n_resamples=200)["mean"]
    assert 0 <= low < high <= 1
    with pytest.raises(ValueError, match="3 clusters for 5 items"):
        stats.bootstrap_cis_clustered(rs, ["a", "b", "c"], mean_of)


def ocr_record(i: int, dataset: str, right: bool) -> dict:
    return {
        "id": str(i),
        "category": "Regular Text Recognition",
        "dataset": dataset,
        "cluster": dataset,
        "prediction": "x",
        "scores": {"score": int(right)},
    }


def test_the_loop_writes_both_intervals_and_the_leaderboard_shows_the_clustered_one():
    rng = np.random.default_rng(3)
    rs = [ocr_record(i, f"set{i % 6}", rng.random() < 0.3 + 0.1 * (i % 6)) for i in range(60)]
    metrics, _ = record.aggregate_with_ci(OCRBENCH, rs, 200, 0)
    m = metrics["accuracy"]
    assert m["clustered"]["n"] == 6 and "over 6 clusters" in m["clustered"]["ci_method"]
    assert m["clustered"]["ci_low"] <= m["value"] <= m["clustered"]["ci_high"]
    assert T.metric_cell(m) == (
        f"{T.fmt(m['value'])} [{T.fmt(m['clustered']['ci_low'])}, {T.fmt(m['clustered']['ci_high'])}]ᶜ"
    )
    for r in rs:
        del r["cluster"]
    plain, _ = record.aggregate_with_ci(OCRBENCH, rs, 200, 0)
    assert "clustered" not in plain["accuracy"] and plain["accuracy"]["ci_low"] == m["ci_low"]
    assert T.metric_cell(plain["accuracy"]).endswith("]") and "ᶜ" not in T.metric_cell(plain["accuracy"])
