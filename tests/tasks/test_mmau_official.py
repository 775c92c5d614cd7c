"""MMAU-Pro scored as the official evaluator (sonalkum/MMAUPro evaluate_mmau_pro_comprehensive.py, read
at bf12804) on the kinds of case where the project used to differ: failed items kept, unknown AIF
identifiers failing, empty references judged, None kwargs passed through, raw closed answers, broken
embeddings refused, the judge in bfloat16. Real embedder (MiniLM) and real judge (SmolLM2-135M)."""

from __future__ import annotations

import pytest

from harness.models.source import RegistrySource
from tasks.base import TaskDataError
from tasks.mmau_pro import MMAUProTask, data, embed, generate, judge, score


@pytest.fixture(scope="module")
def items(tmp_path_factory):
    return data.load_path(generate.ensure_generated(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="module")
def task():
    # 8 judge tokens keep CPU runs short; the official 512 is the default
    return MMAUProTask(
        judge="smollm2-135m", embedder="all-MiniLM-L6-v2", models=RegistrySource(), judge_max_new_tokens=8
    )


def by_rule(items, identifier):
    return next(i for i in items if i["task_identifier"] == identifier)


def record_of(task, item):
    """The record the eval loop makes of an item that never reaches a model: its clips cannot be read, or the
    official evaluator leaves it out (no requests)."""
    try:
        requests = task.requests(item)
    except TaskDataError as exc:
        return task.record(item, [], str(exc))
    assert requests == [], "this helper is for items that never reach a model"
    return task.record(item, [])


def no_audio(item):
    """The item with its clip gone: building the prompt fails, as with a missing file in the real set."""
    return dict(item, audio_path=["data/not-there.wav"])


# ------------------------------------------------------------------ kind 2: failed items are kept
def test_a_failed_aif_item_counts_as_officially(task, items):
    """Two answered AIF items (one passes) and one whose audio is missing: the official script checks
    str(None) = "None" for the missing answer, so AIF = 1/3 (the old rule left it out: 1/2)."""
    lower, upper = by_rule(items, "All Lowercase"), by_rule(items, "All Uppercase")
    records = [
        dict(id=i["id"], category=i["category"], kind="aif", **task.score_prediction(i, text))
        for i, text in ((lower, "a soft tone."), (upper, "a soft tone."))
    ]
    failed = record_of(task, no_audio(by_rule(items, "No Commas") | {"task_identifier": "All Lowercase"}))
    assert failed["failure"] == "audio" and "not found" in failed["error"]
    assert failed["prediction"] is None and failed["scored_as"] == "None" and failed["scores"] == {"passed": 0}
    m = score.aggregate(records + [failed])["metrics"]
    assert m["aif"] == pytest.approx(100 / 3) and m["n_errors"] == 1
    assert score.aggregate(records)["metrics"]["aif"] == 50.0


def test_a_failed_item_can_pass_a_check_officially(task, items):
    """ "None" is one word: a missing answer passes "at most 8 words", as in the official script."""
    record = record_of(task, no_audio(by_rule(items, "Number Words (at most)")))
    assert record["scores"] == {"passed": 1} and "error" in record


def test_a_failed_closed_item_embeds_the_empty_answer(task, items):
    item = next(i for i in items if i["category"] == "sound")
    record = record_of(task, no_audio(item))
    assert record["scored_as"] == "" and record["failure"] == "audio"
    model = task.get_embedder()
    empty = (model.encode([""]) @ model.encode(item["choices"]).T * 100).squeeze(0).tolist()
    assert record["similarities"] == pytest.approx(empty, abs=1e-4)
    assert record["matched_choice"] == item["choices"][score.pick_choice(empty)]


def test_a_failed_open_item_is_judged_on_the_empty_answer(task, items):
    item = next(i for i in items if i["category"] == "open")
    record = record_of(task, no_audio(item))
    assert record["scored_as"] == "" and set(record["scores"]) == {*score.CRITERIA, "overall"}
    assert record["scorer"]["judge"] == "smollm2-135m"


def test_an_excluded_closed_item_is_left_out_of_every_number(task, items):
    """Closed items with fewer than two choices are filtered out by the official script before scoring."""
    item = dict(next(i for i in items if i["category"] == "music"), choices=["C major"])
    record = record_of(task, item)
    assert set(record) == {"id", "category", "kind", "excluded", "cluster"} and record["kind"] == "excluded"
    scored = dict(id="x", category="music", kind="closed", scores={"correct": 1, "correct_letters_mapped": 1})
    out = score.aggregate([record, scored])
    assert out["metrics"]["closed"] == 100.0 and out["categories"]["music"]["n"] == 1
    assert out["categories"]["music"]["n_excluded"] == 1 and out["metrics"]["n_errors"] == 0


# ------------------------------------------------------------------ kind 3: unknown identifier fails
def test_an_unknown_identifier_is_scored_as_a_failure(task, items):
    item = dict(by_rule(items, "No Commas"), task_identifier="Haiku")
    out = task.score_prediction(item, "no commas here")
    assert out["scores"] == {"passed": 0} and "unknown AIF task_identifier 'Haiku'" in out["note"]
    record = dict(id=item["id"], category=item["category"], kind="aif", **out)
    agg = score.aggregate([record])
    assert agg["metrics"]["aif"] == 0.0 and agg["categories"]["instruction following"]["n_noted"] == 1


# ------------------------------------------------------------------ kind 4: an empty reference is judged
@pytest.mark.parametrize("reference, shown", [("", ""), (None, "None")])
def test_an_empty_reference_is_judged(task, items, reference, shown):
    item = dict(next(i for i in items if i["category"] == "open"), answer=reference)
    out = task.score_prediction(item, "Three notes rising.")
    assert set(out["scores"]) == {*score.CRITERIA, "overall"} and isinstance(out["judge_output"], str)
    text = task.get_judge().chat_text(item["question"], item["answer"], "Three notes rising.")
    assert f"Reference Answer: {shown}\n\nModel Response: Three notes rising." in text  # the official f-string


def test_empty_reference_items_of_the_data_keep_their_null(tmp_path, items):
    import pyarrow.parquet as pq

    folder = generate.ensure_generated(tmp_path)
    table = pq.read_table(folder / "test.parquet")
    rows = table.to_pylist()
    rows[0]["answer"] = None
    pq.write_table(table.from_pylist(rows, schema=table.schema), folder / "test.parquet")
    assert data.load_path(folder)[0]["answer"] is None and items[0]["answer"] is not None


# ------------------------------------------------------------------ kind 5: None kwargs pass through
def test_none_kwargs_from_the_parquet_struct_pass_through(task, items):
    item = by_rule(items, "Number Words (range)")
    assert item["kwargs"]["N1"] == 5 and item["kwargs"]["N"] is None  # the struct's other fields are None
    assert task.score_prediction(item, "one two three four five six")["scores"] == {"passed": 1}
    broken = dict(item, kwargs=dict(item["kwargs"], N2=None))  # N1 <= count <= None: the official raises
    out = task.score_prediction(broken, "one two three four five six")
    assert out["scores"] == {"passed": 0} and "TypeError" in out["note"]


# ------------------------------------------------------------------ kind 7: broken embeddings are refused
def test_nan_embeddings_name_the_item_and_the_embedder(items):
    import torch

    broken = MMAUProTask(embedder="all-MiniLM-L6-v2")
    model = broken.get_embedder()
    with torch.no_grad():
        model.model.embeddings.word_embeddings.weight[:] = float("nan")  # a real embedder with broken weights
    item = next(i for i in items if i["category"] == "sound")
    with pytest.raises(embed.EmbeddingError, match=rf"item {item['id']}: embedder all-MiniLM-L6-v2 returned NaN/inf"):
        broken.score_prediction(item, "white noise")


# ------------------------------------------------------------------ the judge as officially loaded
def test_the_judge_runs_in_bfloat16(task):
    import torch

    rater = task.get_judge()
    assert next(rater.model.parameters()).dtype == torch.bfloat16 and judge.DTYPE == "bfloat16"
    assert rater.describe()["judge_dtype"] == "bfloat16" and rater.temperature == 0.1
    assert task.describe()["judge_dtype"] == "bfloat16"


def test_results_say_which_rule_made_each_number(task):
    settings = task.describe()
    rules = settings["rules"]
    assert set(rules) == {
        "open_ended",
        "good_rate",
        "aif",
        "closed",
        "overall",
        "closed_letters_mapped",
        "overall_letters_mapped",
    }
    assert all(rules[k].startswith("official") for k in ("open_ended", "good_rate", "aif", "closed", "overall"))
    assert rules["closed_letters_mapped"].startswith("ours, not official")
    assert "english punkt_tab" in settings["aif_sentence_splitter"]
