"""OCRBench end to end on the generated set with the tiny replicas, every quantization method,
through the harness's eval loop: a schema-valid result with every category filled, bad items
recorded as failures while the run goes on, and the prompt as each model family renders it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.models import tiny  # noqa: E402
from tasks.ocrbench import OCRBenchTask, generate, score

run = pytest.importorskip("harness.run", reason="the harness eval loop is not there yet")
quant = pytest.importorskip("quant")
SMOKE_TOKENS = 4  # replicas have random weights: 4 tokens exercise decoding as well as 128 would


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """One generated item per category, plus an unreadable image and an empty answer list."""
    source = generate.ensure_generated(tmp_path_factory.mktemp("cache"))
    records = json.loads((source / "OCRBench.json").read_text())
    chosen = [next(r for r in records if r["type"] == c) for c in score.CATEGORIES]
    target = tmp_path_factory.mktemp("ocrbench")
    for r in chosen:
        (target / "OCRBench_Images" / r["image_path"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source / "OCRBench_Images" / r["image_path"], target / "OCRBench_Images" / r["image_path"])
    (target / "OCRBench_Images" / "broken.png").write_bytes(b"\x89PNG not really")
    bad_image = dict(chosen[0], image_path="broken.png", id=1001)
    no_answer = dict(chosen[1], answers=[], id=1002)
    (target / "OCRBench.json").write_text(json.dumps(chosen[:5] + [bad_image] + chosen[5:] + [no_answer]))
    return target


def _check_result(result: dict, n_items: int) -> None:
    assert result["task"]["name"] == "ocrbench" and result["task"]["version"] == 1
    assert set(result["categories"]) == set(score.CATEGORIES)
    for category in result["categories"].values():
        assert category["n"] >= 1 and "score" in category["metrics"] and "accuracy" in category["metrics"]
    assert result["metrics"]["total"]["value"] == sum(c["metrics"]["score"] for c in result["categories"].values())
    samples = {s["id"]: s for s in result["samples"]}
    assert len(samples) == n_items and result["n_errors"] == 2
    assert "unreadable image" in samples["ocrbench-0005"]["error"]
    assert "empty answer list" in samples["ocrbench-0011"]["error"]
    for s in samples.values():
        assert "error" in s or ("prediction" in s and s["modality_tokens"]["image"] > 0 and s["kv_bytes"]["total"] > 0)


def test_every_method_on_tiny_qwen3_vl(dataset, tmp_path):
    adapter = tiny("qwen3_vl")
    results = run.evaluate(
        "qwen3-vl-4b",
        "all",
        task=OCRBenchTask(max_new_tokens=SMOKE_TOKENS),
        data=str(dataset),
        adapter=adapter,
        out=str(tmp_path / "{task}" / "{model}" / "{method}.json"),
    )
    assert [r["method"]["name"] for r in results] == quant.list_methods()
    for result in results:
        _check_result(result, 12)
        written = next(tmp_path.rglob(f"{result['method']['name']}.json"))
        assert json.loads(written.read_text())["metrics"] == result["metrics"]


def test_llava_family_runs_too(dataset, tmp_path):
    adapter = tiny("llava")
    results = run.evaluate(
        "llava-v1.6-7b",
        "bf16,oscar",
        task=OCRBenchTask(max_new_tokens=SMOKE_TOKENS),
        data=str(dataset),
        adapter=adapter,
        out=str(tmp_path / "{method}.json"),
    )
    for result in results:
        _check_result(result, 12)


@pytest.mark.parametrize("family", ["llava", "qwen3_vl"])
def test_prompt_as_rendered_by_each_family(dataset, family):
    """Snapshot of the chat-templated prompt text per family (the tiny replicas use each family's
    chat format), with the image placeholder before the question."""
    adapter = tiny(family)
    item = OCRBenchTask().load(str(dataset))[4]  # Digit String Recognition
    render = getattr(adapter, "render_prompt", None) or adapter.chat_text
    text = render(OCRBenchTask().requests(item)[0].prompt)
    expected = {
        "qwen3_vl": "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>what is the number in the image?"
        "<|im_end|>\n<|im_start|>assistant\n",
        "llava": "USER: <image>\nwhat is the number in the image? ASSISTANT:",
    }[family]
    assert text == expected
