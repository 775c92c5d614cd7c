"""Re-scoring a committed MMAU-Pro result from its recorded predictions (harness.rescore): the
current rules, the same samples, a valid result, and a failed item scored on the official stand-in."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from harness import rescore
from harness import results as R
from harness.models.source import RegistrySource
from tasks.mmau_pro import VERSION, MMAUProTask, score

COMMITTED = (
    Path(__file__).resolve().parents[2] / "results" / "runs" / "mmau-pro.generated" / "tiny-qwen3-omni" / "kivi.json"
)


@pytest.fixture(scope="module")
def task():
    return MMAUProTask(judge="smollm2-135m", embedder="all-MiniLM-L6-v2", models=RegistrySource())


@pytest.fixture(scope="module")
def result():
    return json.loads(COMMITTED.read_text())


def test_rescoring_a_result_twice_gives_the_same_numbers(task, result):
    items = task.load("generated", result["task"]["limit"])
    again = rescore.rescore_result(result, items, task)
    R.validate(again)
    assert again["task"]["version"] == VERSION and again["metrics"] == result["metrics"]
    assert [s["scores"] for s in again["samples"]] == [s["scores"] for s in result["samples"]]
    assert again["task"]["settings"]["judge_dtype"] == result["task"]["settings"]["judge_dtype"]
    assert "re-parsed" in again["task"]["settings"]["open_items_judged"]


def test_an_old_failed_record_is_scored_on_the_stand_in(task, result):
    old = copy.deepcopy(result)
    aif_sample = next(s for s in old["samples"] if s["category"] == "instruction following")
    for key in ("prediction", "scores", "scorer", "n_clips"):
        aif_sample.pop(key, None)
    aif_sample["error"] = f"item {aif_sample['id']}: generation failed: RuntimeError: out of memory (at x.py:1)"
    items = task.load("generated", old["task"]["limit"])
    new = rescore.rescore_result(old, items, task)
    record = next(s for s in new["samples"] if s["id"] == aif_sample["id"])
    assert record["failure"] == "generation" and record["scored_as"] == score.standin("aif") == "None"
    assert record["prediction"] is None and set(record["scores"]) == {"passed"}
    assert new["n_errors"] == 1 and new["metrics"]["aif"]["n"] == len(new["samples"])


def test_an_item_the_old_rules_never_generated_cannot_be_rescored(task, result):
    old = copy.deepcopy(result)
    sample = old["samples"][0]
    for key in ("prediction", "scores", "n_clips"):
        sample.pop(key, None)
    sample["error"] = f"item {sample['id']}: empty reference answer; the item cannot be scored (fix the data)"
    with pytest.raises(ValueError, match="was never generated; rerun the model"):
        rescore.rescore_result(old, task.load("generated", old["task"]["limit"]), task)


def test_other_data_is_refused(task, result):
    with pytest.raises(ValueError, match="data fingerprint differs"):
        rescore.rescore_result(result, task.load("generated", 5), task)
