"""LongBench-E end to end through the harness's eval loop: a Qwen3 text model (the paper's family: its chat template
and special tokens, widths shrunk, seeded random weights) answers a handful of generated items, one per length bucket
plus samsum's stop rule and a broken line, with bf16 and OScaR; the result has every bucket where an item fell, the
average as its primary metric, the broken line as a failed item, and prompts cut to the budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.longbench_e import LongBenchETask, data, generate, score
from tasks.longbench_e.prompts import DATASETS

run = pytest.importorskip("harness.run", reason="the harness eval loop is not there yet")
SHRINK = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 128,
}
PICK = {"trec": 0, "samsum": 1, "passage_retrieval_en": 0, "lcc": 2}  # set -> row (0: 0-4k, 1: 4-8k, 2: 8k+)
MAX_LENGTH = 256  # tokens of the prompt; a random-weight run needs no more to take every path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    source = generate.ensure_generated(tmp_path_factory.mktemp("cache")) / "data"
    target = tmp_path_factory.mktemp("longbench") / "data"
    target.mkdir()
    for name in DATASETS:
        rows = (source / data.file_name(name)).read_text(encoding="utf-8").splitlines()
        keep = [rows[PICK[name]]] if name in PICK else []
        if name == "trec":
            keep.append('{"input": "truncated')
        (target / data.file_name(name)).write_text("".join(line + "\n" for line in keep), encoding="utf-8")
    return target.parent


@pytest.fixture(scope="module")
def adapter():
    from harness.models import MODELS
    from harness.models.synthetic import load_random
    from harness.models.text.adapter import TextAdapter

    return load_random(TextAdapter, MODELS["qwen3-8b"], device="cpu", dtype="float32", overrides=SHRINK)


def test_bf16_and_oscar_on_a_few_generated_items(dataset, adapter, tmp_path):
    task = LongBenchETask(max_length=MAX_LENGTH, max_new_tokens=4)
    results = run.evaluate(
        "qwen3-8b",
        "bf16,oscar",
        task=task,
        data=str(dataset),
        adapter=adapter,
        out=str(tmp_path / "{task}" / "{model}" / "{method}.json"),
    )
    assert [r["method"]["name"] for r in results] == ["bf16", "oscar"]
    for result in results:
        assert result["task"]["name"] == "longbench-e" and result["primary_metric"] == "average"
        assert result["task"]["settings"]["max_length"] == MAX_LENGTH
        assert result["metrics"]["average"]["higher_is_better"] and result["n_errors"] == 1
        assert set(result["categories"]) == set(PICK)
        for name, row in PICK.items():
            category = result["categories"][name]["metrics"]
            assert set(category) & set(score.BUCKETS) == {score.BUCKETS[row]}
        samples = {s["id"]: s for s in result["samples"]}
        broken = samples["trec/line2"]
        assert "trec_e.jsonl:2" in broken["error"] and broken["length"] is None
        ok = [s for s in samples.values() if "error" not in s]
        assert len(ok) == 4 and all(s["kv_bytes"]["total"] > 0 and 0 < s["new_tokens"] <= 4 for s in ok)
        chat = {s["dataset"]: s["input_tokens"] for s in ok}
        assert chat["passage_retrieval_en"] > MAX_LENGTH >= chat["trec"]  # the template comes after the cut
        buckets = [result["metrics"][b]["value"] for b in score.BUCKETS]
        per_set = [result["metrics"][name]["value"] for name in PICK]
        assert result["metrics"]["average"]["value"] == pytest.approx(round(sum(per_set) / 4, 2))
        assert all(0 <= v <= 100 for v in buckets + per_set)
        written = json.loads(next(tmp_path.rglob(f"{result['method']['name']}.json")).read_text())
        assert written["metrics"] == result["metrics"]
