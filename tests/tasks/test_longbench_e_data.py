"""LongBench-E data: the loader on official-format files written here (both layouts, the zip, bad lines, missing
files), the generated set's schema and answers, the requests each set gets, and the task's settings."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import pytest

from tasks import get_task
from tasks.base import TaskDataError, TaskNotReady
from tasks.contract import Response
from tasks.longbench_e import TASK, TASK_OSCAR, LongBenchETask, data, generate, max_length_for, score
from tasks.longbench_e.prompts import DATASETS, MAX_NEW_TOKENS, NO_CHAT, PROMPTS


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    return generate.ensure_generated(tmp_path_factory.mktemp("cache"))


def _row(dataset: str, uid: str, length: int = 100, answers=("x",), all_classes=None) -> dict:
    return {
        "input": f"question {uid}",
        "context": f"context {uid}",
        "answers": list(answers),
        "length": length,
        "dataset": dataset,
        "language": "en",
        "all_classes": all_classes,
        "_id": uid,
    }


def _write_official(folder: Path, lines_for: dict | None = None) -> None:
    """Two rows per set (the Paragraph form for passage_retrieval_en); `lines_for` replaces a set's lines."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in DATASETS:
        answers = ("Paragraph 3",) if name == "passage_retrieval_en" else ("x",)
        classes = ["A", "B"] if name == "trec" else None
        rows = [json.dumps(_row(name, f"{name}-{k}", 5000 * k, answers, classes)) for k in range(2)]
        lines = (lines_for or {}).get(name, rows)
        (folder / data.file_name(name)).write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_both_layouts_and_the_zip_load_the_same_items(tmp_path):
    _write_official(tmp_path / "flat")
    _write_official(tmp_path / "nested" / "data")
    with zipfile.ZipFile(tmp_path / "data.zip", "w") as z:
        for f in sorted((tmp_path / "flat").iterdir()):
            z.write(f, f"data/{f.name}")
    flat = data.load_path(tmp_path / "flat")
    assert data.load_path(tmp_path / "nested") == data.load_path(tmp_path / "nested" / "data")
    zipped = data.load_path(tmp_path / "data.zip")
    strip = [{k: v for k, v in i.items() if k != "source"} for i in flat]
    assert [{k: v for k, v in i.items() if k != "source"} for i in zipped] == strip
    assert len(flat) == 26 and [i["dataset"] for i in flat[::2]] == list(DATASETS)  # the official order
    assert flat[0]["id"] == "qasper/qasper-0" and flat[0]["category"] == "qasper"
    assert flat[0]["source"].endswith("qasper_e.jsonl:1") and zipped[0]["source"].endswith("data/qasper_e.jsonl:1")
    assert len({i["id"] for i in flat}) == 26
    assert data.fingerprint(flat) == data.fingerprint(zipped) != data.fingerprint(flat[:-1])


def test_missing_file_names_it_the_hub_and_the_fix(tmp_path):
    _write_official(tmp_path)
    (tmp_path / "lcc_e.jsonl").unlink()
    with pytest.raises(TaskDataError) as err:
        TASK.load(str(tmp_path))
    message = str(err.value)
    assert "lcc_e.jsonl" in message and data.HUB_ID in message and "data.zip" in message and "--data" in message
    with pytest.raises(TaskDataError, match="does not exist"):
        TASK.load(str(tmp_path / "nowhere"))


def test_no_data_anywhere_is_a_one_line_fix(monkeypatch, tmp_path):
    monkeypatch.delenv(data.ENV_PATH, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with pytest.raises(TaskDataError) as err:
        TASK.load(None)
    assert "\n" not in str(err.value) and data.ENV_PATH in str(err.value) and data.HUB_ID in str(err.value)
    _write_official(tmp_path / "lb")
    monkeypatch.setenv(data.ENV_PATH, str(tmp_path / "lb"))
    assert [i["id"] for i in TASK.load(None, limit=3)] == [
        "qasper/qasper-0",
        "qasper/qasper-1",
        "multifieldqa_en/multifieldqa_en-0",
    ]


def test_bad_lines_fail_alone_with_file_and_line(tmp_path):
    trec = [
        json.dumps(_row("trec", "t0", all_classes=["Early"])),
        "{not json",
        "",
        json.dumps({"input": "q"}),
        json.dumps(_row("trec", "t0", all_classes=["Early"])),  # repeats line 1's _id
        json.dumps(_row("trec", "t5", all_classes=["Last", "Other"])),
    ]
    _write_official(tmp_path, {"trec": trec})
    items = [i for i in TASK.load(str(tmp_path)) if i["dataset"] == "trec"]
    assert [i["id"] for i in items] == ["trec/t0", "trec/line2", "trec/line4", "trec/t0#line5", "trec/t5"]
    good, broken, partial, repeated, last = items
    assert good["all_classes"] == last["all_classes"] == ["Last", "Other"]  # the file's last row's, for every item
    for bad, why in ((broken, "not JSON"), (partial, "lacks"), (repeated, "repeats line 1")):
        with pytest.raises(TaskDataError, match=rf"trec_e\.jsonl:{bad['source'].rsplit(':', 1)[1]}\): .*{why}"):
            TASK.requests(bad)
        record = TASK.record(bad, [], error="from the loop")
        assert record["error"] == "from the loop" and record["length"] is None
    assert TASK.requests(good)[0].prompt.text.endswith("question t0")


def test_unscorable_answers_are_refused_per_item(tmp_path):
    _write_official(tmp_path, {"passage_retrieval_en": [json.dumps(_row("passage_retrieval_en", "p", answers=["7"]))]})
    item = next(i for i in TASK.load(str(tmp_path)) if i["dataset"] == "passage_retrieval_en")
    with pytest.raises(TaskDataError, match="no 'Paragraph <number>'"):
        TASK.requests(item)


def test_requests_follow_pred_py(tmp_path):
    _write_official(tmp_path)
    items: dict[str, dict] = {}
    for i in TASK.load(str(tmp_path)):
        items.setdefault(i["dataset"], i)  # each set's first row
    for name, item in items.items():
        (request,) = TASK.requests(item)
        assert request.prompt.text == PROMPTS[name].format(**item)
        assert request.prompt.chat is (name not in NO_CHAT)
        assert request.prompt.max_tokens == 31500 and request.max_new_tokens == MAX_NEW_TOKENS[name]
        assert (request.stop, request.min_new_tokens) == ((("\n",), 1) if name == "samsum" else ((), 0))
    qasper = TASK.requests(items["qasper"])[0].prompt.text
    assert qasper.startswith("You are given a scientific article and a question.")
    assert "\n\nArticle: context qasper-0\n\n Answer the question based on" in qasper  # the space after the blank line
    assert qasper.endswith("\n\nQuestion: question qasper-0\n\nAnswer:")
    assert (
        TASK.requests(items["lcc"])[0].prompt.text
        == "Please complete the code given below. \ncontext lcc-0Next line of code:\n"
    )
    oscar = [TASK_OSCAR.requests(i)[0] for i in items.values()]
    assert all(not r.prompt.chat and r.prompt.max_tokens == 32768 and not r.stop for r in oscar)
    capped = LongBenchETask(max_new_tokens=8, max_length=300, datasets=["samsum", "qasper"])
    assert capped.datasets == ("qasper", "samsum")
    assert [r.max_new_tokens for r in capped.requests(items["gov_report"])] == [8]
    assert capped.requests(items["qasper"])[0].prompt.max_tokens == 300


def test_bind_takes_the_models_class_and_refuses_overflow():
    def count(prompt):  # a chat template of 20 tokens around the text, none without it
        return len(prompt.text.split()) + (20 if prompt.chat else 0)

    assert [max_length_for(n) for n in (4096, 8192, 40960, 131072)] == [3500, 7500, 31500, 31500]
    assert TASK.bind(count, 8192).max_length == 7500 and TASK.max_length == 31500  # a copy
    assert TASK.bind(count, None).max_length == 31500
    assert TASK_OSCAR.bind(count, 40960).max_length == 32768
    with pytest.raises(
        ValueError, match="exceed the model's context of 32768 tokens; use a max_length of at most 32256"
    ):
        TASK_OSCAR.bind(count, 32768)  # no template: 32768 - 512
    assert LongBenchETask(max_length=7660).bind(count, 8192).max_length == 7660  # 8192 - 512 - 20
    with pytest.raises(ValueError, match="at most 7660"):
        LongBenchETask(max_length=7661).bind(count, 8192)
    with pytest.raises(ValueError, match="holds none"):
        TASK.bind(count, 2048)
    settings = TASK.bind(count, 8192).describe()
    assert (
        settings["max_length"] == 7500 and settings["max_length_from"] == "model" and settings["model_context"] == 8192
    )


def test_registry_settings_and_readiness(monkeypatch):
    assert get_task("longbench-e") is TASK and get_task("longbench-e-oscar") is TASK_OSCAR
    assert TASK.version == 1 and TASK.primary_metric == "average"
    from harness.results import higher_is_better

    assert higher_is_better("average", TASK)
    assert (
        TASK.describe()["code_sim_matcher"] == "difflib" and TASK_OSCAR.describe()["code_sim_matcher"] == "levenshtein"
    )
    assert "difflib" in TASK.notes()[0] and "Levenshtein" in TASK_OSCAR.notes()[0]
    TASK.check_ready()
    from importlib import metadata

    monkeypatch.setattr(metadata, "version", lambda name: "1.0.0")
    with pytest.raises(TaskNotReady, match=r"rouge==1\.0\.1, which is 1\.0\.0; run `pip install rouge==1\.0\.1`"):
        TASK.check_ready()


def test_record_scores_and_failures(tmp_path):
    _write_official(tmp_path)
    item = next(i for i in TASK.load(str(tmp_path)) if i["dataset"] == "triviaqa")
    ok = TASK.record(item, [Response(text="\nx\nmore", new_tokens=3, input_tokens=9)])
    assert ok["scores"] == {"score": 1.0} and ok["length"] == 0 and ok["input_tokens"] == 9
    failed = TASK.record(item, [Response.failed("generation failed: OOM")])
    assert failed["error"].startswith(f"item {item['id']}: generation failed") and failed["length"] == 0


# ------------------------------------------------------------------------------------------------ generated set


def test_generated_set_schema_and_buckets(generated, monkeypatch):
    for name in DATASETS:
        lines = (generated / "data" / data.file_name(name)).read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines]
        assert len(rows) == len(generate.LENGTH_WORDS)
        for row in rows:
            assert set(row) == {"input", "context", "answers", "length", "dataset", "language", "all_classes", "_id"}
            assert row["dataset"] == name and row["language"] == "en" and row["answers"]
            assert row["length"] == generate.word_length(row)  # honest: words of input, context and answers
            assert (row["all_classes"] is not None) == (name == "trec")
        assert [score.bucket(r["length"]) for r in rows] == list(score.BUCKETS)
    monkeypatch.setenv("OSCAR_EVAL_CACHE", str(generated.parent))  # data="generated" finds the set built above
    items = TASK.load("generated")
    assert len(items) == 39 and len({i["id"] for i in items}) == 39
    assert all(TASK.requests(i) for i in items)


def test_generated_answers_can_be_read_off_the_items(generated):
    items = TASK.load(str(generated))
    by_set: dict[str, list] = {}
    for i in items:
        by_set.setdefault(i["dataset"], []).append(i)
    for item in by_set["passage_count"]:
        paragraphs = re.split(r"\n\nParagraph \d+: ", "\n\n" + item["context"])[1:]
        assert item["answers"] == [str(len(set(paragraphs)))] and len(paragraphs) > len(set(paragraphs))
    for item in by_set["passage_retrieval_en"]:
        k = int(score.retrieval_id(item["answers"][0]))
        assert f"Paragraph {k}: {item['input']}" in item["context"]
    for item in by_set["trec"]:
        assert item["answers"][0] in item["all_classes"]
    for item in by_set["hotpotqa"] + by_set["2wikimqa"] + by_set["triviaqa"]:
        assert any(a in item["context"] + item["input"] for a in item["answers"])
    for item in by_set["lcc"]:
        assert item["context"].rstrip("\n").endswith("0,") and item["answers"][0].startswith('    "')


def test_generated_set_is_seeded(generated, tmp_path):
    generate.build(tmp_path)
    for name in DATASETS:
        path = Path("data") / data.file_name(name)
        assert (tmp_path / path).read_bytes() == (generated / path).read_bytes()
