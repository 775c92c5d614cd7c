"""OCRBench data: the generated set, every loader on the same items, clear errors, prompt snapshot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.base import TaskDataError
from tasks.ocrbench import TASK, VERSION, data, generate, prompt_text, score


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    return generate.ensure_generated(tmp_path_factory.mktemp("cache"))


def test_generated_set_covers_every_category_and_is_seeded(generated, tmp_path):
    records = json.loads((generated / "OCRBench.json").read_text())
    assert {r["type"] for r in records} == set(score.CATEGORIES)
    assert len(records) == generate.ITEMS_PER_CATEGORY * 10
    assert any(isinstance(r["answers"], list) and len(r["answers"]) > 1 for r in records)
    assert any(r["dataset_name"] == "HME100k" for r in records)
    again = tmp_path / "again"
    again.mkdir()
    generate.build(again)
    for r in records:  # same seed -> the same bytes
        image = Path("OCRBench_Images") / r["image_path"]
        assert (again / image).read_bytes() == (generated / image).read_bytes()
    assert json.loads((again / "OCRBench.json").read_text()) == records


def test_generated_images_decode_and_differ(generated):
    items = data.load_path(generated)
    images = [data.open_image(i) for i in items]
    assert all(im.mode == "RGB" and im.width > 20 and im.height > 20 for im in images)
    assert len({im.tobytes() for im in images}) == len(images)


def _hub_rows(items):
    return [
        {
            "dataset": i["dataset"],
            "question": i["question"],
            "question_type": i["question_type"],
            "answer": i["answers"],
            "image": {"bytes": Path(i["image"]["path"]).read_bytes(), "path": None},
        }
        for i in items
    ]


def test_parquet_and_saved_dataset_load_the_same_items(generated, tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    from_json = data.load_path(generated)
    rows = _hub_rows(from_json)
    (tmp_path / "hub" / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "hub" / "data" / "test-00000-of-00001.parquet")
    from_parquet = data.load_path(tmp_path / "hub")
    features = datasets.Features(
        {
            "dataset": datasets.Value("string"),
            "question": datasets.Value("string"),
            "question_type": datasets.Value("string"),
            "answer": datasets.Sequence(datasets.Value("string")),
            "image": datasets.Image(),
        }
    )
    saved = datasets.DatasetDict({"test": datasets.Dataset.from_list(rows, features=features)})
    saved.save_to_disk(str(tmp_path / "saved"))
    from_saved = data.load_path(tmp_path / "saved")
    for a, b, c in zip(from_json, from_parquet, from_saved):
        assert a["id"] == b["id"] == c["id"]
        assert a["answers"] == b["answers"] == c["answers"]
        assert data.open_image(a).tobytes() == data.open_image(b).tobytes() == data.open_image(c).tobytes()
    assert data.fingerprint(from_parquet) == data.fingerprint(from_saved)
    assert len(from_parquet) == len(from_json)


def test_env_var_and_limit(generated, monkeypatch):
    monkeypatch.setenv(data.ENV_PATH, str(generated))
    items = TASK.load(None, limit=4)
    assert [i["id"] for i in items] == [f"ocrbench-{k:04d}" for k in range(4)]


def test_missing_official_data_names_hub_id_and_env_var(monkeypatch, tmp_path):
    monkeypatch.delenv(data.ENV_PATH, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with pytest.raises(TaskDataError) as err:
        TASK.load(None)
    assert data.HUB_ID in str(err.value) and data.ENV_PATH in str(err.value)


def test_bad_paths_and_images_fail_clearly(generated, tmp_path):
    with pytest.raises(TaskDataError, match="does not exist"):
        data.load_path(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskDataError, match="no OCRBench data"):
        data.load_path(tmp_path / "empty")
    item = dict(data.load_path(generated)[0])
    item["image"] = {"bytes": b"not an image"}
    with pytest.raises(TaskDataError, match=f"item {item['id']}: unreadable image"):
        data.open_image(item)
    item["image"] = {"path": str(tmp_path / "missing.png")}
    with pytest.raises(TaskDataError, match="missing.png"):
        data.open_image(item)


def test_images_folder_not_found_is_a_clear_error(generated, tmp_path):
    (tmp_path / "OCRBench.json").write_text((generated / "OCRBench.json").read_text())
    with pytest.raises(TaskDataError, match="OCRBENCH_IMAGES"):
        data.load_path(tmp_path / "OCRBench.json")


def test_prompt_text_snapshot(generated):
    """The exact text `requests` puts in Prompt.text, per category (the bare, stripped question)."""
    items = {i["question_type"]: i for i in data.load_path(generated)}
    assert prompt_text(items["Regular Text Recognition"]) == "what is written in the image?"
    assert prompt_text(items["Digit String Recognition"]) == "what is the number in the image?"
    assert prompt_text(items["Key Information Extraction"]) == (
        "what is the total amount of this receipt? Answer this question using the text in the image directly."
    )
    assert prompt_text(items["Handwritten Mathematical Expression Recognition"]) == (
        "Please write out the expression of the formula in the image using LaTeX format."
    )
    assert prompt_text({"question": "  what is written in the image?\n"}) == "what is written in the image?"
    prompt = TASK.requests(items["Doc-oriented VQA"])[0].prompt
    assert prompt.text == "What is the invoice number?" and len(prompt.images) == 1 and not prompt.audios
    assert TASK.version == VERSION == 1 and TASK.max_new_tokens == 128


def test_large_set_adds_pages_of_the_real_image_sizes(tmp_path):
    from PIL import Image

    from harness.results import task_dir
    from tasks.ocrbench.generate import PAGE_CATEGORIES, PAGE_SIZES, build_large

    records = build_large(tmp_path)
    pages = records[: len(PAGE_SIZES) * len(PAGE_CATEGORIES)]
    assert len(records) == 30 + 16 and [r["id"] for r in records] == list(range(46))
    sizes = [Image.open(tmp_path / "OCRBench_Images" / r["image_path"]).size for r in pages]
    assert sizes == [s for s in PAGE_SIZES for _ in PAGE_CATEGORIES]
    assert [r["type"] for r in pages] == list(PAGE_CATEGORIES) * len(PAGE_SIZES)
    assert task_dir("ocrbench", "generated-large") == "ocrbench.generated-large"
