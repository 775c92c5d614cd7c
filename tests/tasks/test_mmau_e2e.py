"""MMAU-Pro end to end on the generated set with the tiny Qwen3-Omni replica, every quantization
method, the real MiniLM embedder and the real SmolLM2 judge, through the harness's eval loop."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.models import tiny  # noqa: E402
from harness.models.source import RegistrySource
from tasks.mmau_pro import MMAUProTask, generate

run = pytest.importorskip("harness.run", reason="the harness eval loop is not there yet")
quant = pytest.importorskip("quant")
CATEGORIES = {"sound", "music", "sound-music", "open", "instruction following"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """The first five generated items (one per category, two clips in one) and one whose clip is missing."""
    import pyarrow.parquet as pq

    source = generate.ensure_generated(tmp_path_factory.mktemp("cache"))
    table = pq.read_table(source / "test.parquet")
    rows = table.slice(0, 5).to_pylist()
    rows.append(dict(rows[0], id="gen-missing", audio_path=["data/not-there.wav"]))
    target = tmp_path_factory.mktemp("mmau")
    shutil.copytree(source / "data", target / "data")
    pq.write_table(table.from_pylist(rows, schema=table.schema), target / "test.parquet")
    return target


@pytest.fixture(scope="module")
def task():
    # 4 answer tokens and 8 judge tokens keep the run short on CPU; the official 128 / 512 are the defaults
    return MMAUProTask(
        judge="smollm2-135m",
        embedder="all-MiniLM-L6-v2",
        models=RegistrySource(),
        judge_max_new_tokens=8,
        max_new_tokens=4,
    )


def test_every_method_on_tiny_qwen3_omni(dataset, task, tmp_path):
    adapter = tiny("qwen3_omni")
    results = run.evaluate(
        "qwen3-omni-30b-a3b",
        "all",
        task=task,
        data=str(dataset),
        adapter=adapter,
        out=str(tmp_path / "{method}.json"),
    )
    assert [r["method"]["name"] for r in results] == quant.list_methods()
    for result in results:
        assert result["task"]["name"] == "mmau-pro" and result["task"]["version"] == 2
        assert set(result["categories"]) == CATEGORIES
        assert all(c["n"] >= 1 and "score" in c["metrics"] for c in result["categories"].values())
        for metric in (
            "open_ended",
            "good_rate",
            "aif",
            "closed",
            "overall",
            "closed_letters_mapped",
            "overall_letters_mapped",
        ):
            assert 0.0 <= result["metrics"][metric]["value"] <= 100.0
        settings = result["task"]["settings"]
        assert settings["judge"] == "smollm2-135m" and settings["embedder"] == "all-MiniLM-L6-v2"
        assert settings["judge_temperature"] == 0.1 and settings["judge_max_new_tokens"] == 8
        assert settings["judge_dtype"] == "bfloat16" and "english punkt_tab" in settings["aif_sentence_splitter"]
        samples = {s["id"]: s for s in result["samples"]}
        missing = samples["gen-missing"]  # failed, and still scored as the official scores a missing answer
        assert result["n_errors"] == 1 and "not found" in missing["error"] and missing["failure"] == "audio"
        assert missing["scored_as"] == "" and set(missing["scores"]) == {"correct", "correct_letters_mapped"}
        category = result["categories"][missing["category"]]
        assert category["n"] == 2
        assert category["metrics"]["n_failed"] == 1 and category["metrics"]["n_failed_audio"] == 1
        open_sample = next(s for s in samples.values() if s["category"] == "open")
        assert open_sample["scorer"]["judge"] == "smollm2-135m" and set(open_sample["scores"]) >= {"overall", "clarity"}
        multi = next(s for s in samples.values() if s.get("n_clips") == 2)
        assert multi["modality_tokens"]["audio"] > 0 and multi["kv_bytes"]["total"] > 0
        written = next(tmp_path.glob(f"{result['method']['name']}.json"))
        assert json.loads(written.read_text())["metrics"] == result["metrics"]


def test_judge_is_seeded_per_item(task):
    judge = task.get_judge()
    first = judge.rate("What is heard?", "A bell.", "A bell rings.", "gen-0003")
    assert judge.rate("What is heard?", "A bell.", "A bell rings.", "gen-0003") == first
    assert judge.item_seed("gen-0003") != judge.item_seed("gen-0004")


def test_prompt_as_rendered_by_the_omni_family(dataset):
    """Snapshot of the chat-templated prompt with two clips (audio placeholders before the text)."""
    adapter = tiny("qwen3_omni")
    items = MMAUProTask().load(str(dataset))
    item = next(i for i in items if len(i["audio_path"]) == 2)
    render = getattr(adapter, "render_prompt", None) or adapter.chat_text
    audio = "<|audio_start|><|audio_pad|><|audio_end|>"
    options = f"A. {item['choices'][0]}\nB. {item['choices'][1]}"
    assert render(MMAUProTask().requests(item)[0].prompt) == (
        f"<|im_start|>user\n{audio}{audio}{item['question']}\n\n{options}<|im_end|>\n<|im_start|>assistant\n"
    )
