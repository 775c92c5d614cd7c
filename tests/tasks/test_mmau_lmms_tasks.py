"""The lmms-eval task definitions in tasks/lmms: registered by lmms-eval's TaskManager, built by its
ConfigurableTask from the local copies harness.lmms_tasks writes, and scoring like the harness."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lmms_eval", reason="lmms-eval is not installed (pip install --no-deps lmms-eval==0.7.3)")
from lmms_eval import utils as lmms_utils  # noqa: E402
from lmms_eval.api.task import ConfigurableTask  # noqa: E402
from lmms_eval.tasks import TaskManager  # noqa: E402

from harness import lmms_tasks  # noqa: E402
from tasks.mmau_pro import data as mmau_data  # noqa: E402
from tasks.mmau_pro import generate as mmau_generate  # noqa: E402
from tasks.ocrbench import data as ocr_data  # noqa: E402
from tasks.ocrbench import generate as ocr_generate  # noqa: E402
from tasks.ocrbench import score as ocr_score  # noqa: E402

INCLUDE = str(Path(__file__).resolve().parents[2] / "tasks" / "lmms")


@pytest.fixture(scope="module")
def manager():
    return TaskManager(include_path=INCLUDE)


def _local_task(task: str, data: Path, out: Path, monkeypatch) -> ConfigurableTask:
    """lmms-eval's own task object from the YAML harness.lmms_tasks writes (the shipped one included,
    reading a local parquet instead of the hub), with the environment the writer asks for."""
    yaml_path, env = lmms_tasks.write_local_task(task, str(data), out)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return ConfigurableTask(config=lmms_utils.load_yaml_config(str(yaml_path)))


def test_task_manager_registers_both_tasks(manager):
    assert "oscar_ocrbench" in manager.all_tasks and "mmau_pro" in manager.all_tasks
    assert "ocrbench" in manager.all_tasks  # lmms-eval's own stays available beside ours


def test_ocrbench_yaml_runs_in_lmms_eval(tmp_path, monkeypatch):
    source = ocr_generate.ensure_generated(tmp_path)  # the official layout: OCRBench.json + image files
    items = ocr_data.load_path(source)
    task = _local_task("ocrbench", source, tmp_path / "tasks", monkeypatch)
    docs = list(task.test_docs())
    assert len(docs) == len(items)
    for doc, item in zip(docs, items):
        fields = (item["dataset"], item["question_type"], item["answers"])
        assert (doc["dataset"], doc["question_type"], doc["answer"]) == fields
    assert task.doc_to_text(docs[0]) == items[0]["question"].strip()
    assert task.config.generation_kwargs["until"] == [] and task.config.reasoning_tags == "none"
    shown = task.doc_to_visual(docs[0])[0]
    assert shown.tobytes() == ocr_data.open_image(items[0]).tobytes()  # the same pixels as oscar-eval's
    predictions = [f"it says {i['answers'][0]}" if k % 2 == 0 else "no idea" for k, i in enumerate(items)]
    per_metric = [task.process_results(doc, [p]) for doc, p in zip(docs, predictions)]
    records = [r["ocrbench_total"] for r in per_metric]
    total = task.aggregation()["ocrbench_total"](records)
    ours = sum(ocr_score.score_sample(p, i["answers"], i["dataset"]) for p, i in zip(predictions, items))
    assert total == ours == (len(items) + 1) // 2


def test_mmau_pro_yaml_runs_in_lmms_eval(tmp_path, monkeypatch):
    folder = mmau_generate.ensure_generated(tmp_path)
    task = _local_task("mmau-pro", folder, tmp_path / "tasks", monkeypatch)  # loads utils.py afresh
    assert os.environ[mmau_data.ENV_PATH] == str(folder.resolve())  # the audio stays in the folder
    docs = list(task.test_docs())
    items = mmau_data.load_path(folder)
    assert len(docs) == len(items)
    multi = next(k for k, i in enumerate(items) if len(i["audio_path"]) == 2)
    audios = task.doc_to_visual(docs[multi])
    assert len(audios) == 2 and audios[0]["sampling_rate"] == 16000 and audios[0]["array"].dtype == np.float32
    assert task.doc_to_text(docs[multi]).startswith(items[multi]["question"] + "\n\nA. ")
    closed = [k for k, i in enumerate(items) if i["category"] in ("sound", "music", "sound-music")]
    aif_ids = [k for k, i in enumerate(items) if i["category"] == "instruction following"][:3]
    records = [task.process_results(docs[k], [items[k]["answer"]])["closed"] for k in closed]
    records += [task.process_results(docs[k], ["a, b"])["aif"] for k in aif_ids]
    aggregations = task.aggregation()
    assert aggregations["closed"](records) == 100.0  # the reference text always matches its own choice
    assert 0.0 <= aggregations["aif"](records) <= 100.0
    assert np.isnan(aggregations["open_ended"](records))  # no open item scored: NaN, not a made-up number


def test_local_task_errors_name_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv(mmau_data.ENV_PATH, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with pytest.raises(lmms_tasks.TaskDataError, match="MMAU_PRO_PATH is unset"):
        lmms_tasks.write_local_task("mmau-pro", None, tmp_path / "tasks")
    with pytest.raises(lmms_tasks.TaskDataError, match="does not exist"):
        lmms_tasks.write_local_task("ocrbench", str(tmp_path / "nowhere"), tmp_path / "tasks")
    with pytest.raises(KeyError, match="ocrbench, mmau-pro"):
        lmms_tasks.write_local_task("mmau", "generated", tmp_path / "tasks")
    assert lmms_tasks.main(["ocrbench", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "t")]) == 2
