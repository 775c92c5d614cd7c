"""MMAU-Pro on a model with random weights: closed and open items are generated but not scored (no embedder, no
judge loaded), instruction-following items keep their rule-based score, and the result says so."""

from __future__ import annotations

import pytest

from harness.models import tiny  # noqa: E402
from tasks.mmau_pro import UNSCORED, MMAUProTask, generate

run = pytest.importorskip("harness.run")
record = pytest.importorskip("harness.record")


def test_random_weights_are_not_scored_by_models(tmp_path):
    data = generate.ensure_generated(tmp_path / "cache")
    task = MMAUProTask(judge="no-such-judge", embedder="no-such-embedder", max_new_tokens=4, model_scoring=False)
    [result] = run.evaluate(
        "qwen3-omni-30b-a3b",
        "oscar",
        task=task,
        data=str(data),
        limit=5,
        adapter=tiny("qwen3_omni"),
        out=str(tmp_path / "{method}.json"),
    )
    kinds = {s["id"]: s["kind"] for s in result["samples"]}
    assert set(kinds.values()) == {"closed", "open", "aif"}  # the first five items: every kind
    for s in result["samples"]:
        assert s["new_tokens"] >= 1 and s["kv_bytes"]["total"] > 0  # generated all the same
        if s["kind"] == "aif":
            assert set(s["scores"]) == {"passed"}
        else:
            assert s["unscored"] == UNSCORED and "scores" not in s
    assert task._judge is None and task._embedder is None  # the bad scorer names were never loaded
    assert result["metrics"]["overall"]["value"] is None and result["metrics"]["overall"]["ci_method"] == "not scored"
    assert 0 <= result["metrics"]["aif"]["value"] <= 100
    assert result["task"]["settings"]["model_scoring"] is False


def test_the_harness_turns_model_scoring_off_only_for_random_real_size_weights():
    from harness.models.source import RegistrySource

    task = MMAUProTask(models=RegistrySource())
    assert record.scoring_for(task, {"weights": "real", "replica": False}) is task
    assert record.scoring_for(task, {"weights": "random", "replica": True}) is task  # replicas keep the real scorers
    copy = record.scoring_for(task, {"weights": "random", "replica": False})
    assert copy is not task and copy.model_scoring is False and task.model_scoring is True
    bare = MMAUProTask()  # the run's copy gets the registry, for a judge named by it
    assert isinstance(record.scoring_for(bare, {"weights": "real"}).models, RegistrySource) and bare.models is None
