"""MMAU-Pro scoring: judge prompt and parsing, Good Rate, letter mapping, closed-form matching with
the real MiniLM embedder (raw answers officially, letters mapped only in the extra metric), aggregation."""

from __future__ import annotations

import pytest

from tasks.mmau_pro import MMAUProTask, score


# ------------------------------------------------------------------ the judge's output
def test_full_judge_output():
    text = (
        "CORRECTNESS: 4 - right.\nRELEVANCE: 5 - on topic.\nCOMPLETENESS: 3 - partial.\n"
        "CLARITY: 5 - clear.\nOVERALL: 4.25 - good."
    )
    assert score.parse_judge_scores(text) == {
        "correctness": 4.0,
        "relevance": 5.0,
        "completeness": 3.0,
        "clarity": 5.0,
        "overall": 4.25,
    }


def test_missing_scores_count_three_and_overall_is_recomputed():
    text = "correctness: 5\nClarity: 1\nOVERALL: n/a"
    # relevance and completeness missing -> 3.0; OVERALL missing -> mean(5, 3, 3, 1) = 3.0
    assert score.parse_judge_scores(text) == {
        "correctness": 5.0,
        "relevance": 3.0,
        "completeness": 3.0,
        "clarity": 1.0,
        "overall": 3.0,
    }
    assert score.parse_judge_scores("no scores at all")["overall"] == 3.0


def test_overall_of_exactly_three_is_replaced_by_the_mean():
    text = "CORRECTNESS: 5\nRELEVANCE: 5\nCOMPLETENESS: 5\nCLARITY: 4\nOVERALL: 3.0"
    assert score.parse_judge_scores(text)["overall"] == pytest.approx(4.75)
    text = "CORRECTNESS: 5\nRELEVANCE: 5\nCOMPLETENESS: 5\nCLARITY: 4\nOVERALL: 3.5"
    assert score.parse_judge_scores(text)["overall"] == 3.5  # any other value is kept


def test_criteria_take_integers_only_overall_takes_decimals():
    text = "CORRECTNESS: 4.5\nRELEVANCE: [5]\nCOMPLETENESS:2\nCLARITY: 5\nOVERALL: 4.5"
    scores = score.parse_judge_scores(text)
    assert scores["correctness"] == 4.0  # "\d+" stops at the dot, as officially
    assert scores["relevance"] == 3.0  # "[5]" is not a number right after the colon
    assert scores["completeness"] == 2.0 and scores["overall"] == 4.5


def test_judge_prompt_wording():
    prompt = score.judge_prompt("What is heard?", "A bell.", "A bell rings.")
    assert prompt.startswith("You are an expert evaluator for general open-ended question answering tasks.")
    assert "\n\nQuestion: What is heard?\n\nReference Answer: A bell.\n\nModel Response: A bell rings.\n\n" in prompt
    assert prompt.endswith("OVERALL: [average score] - [overall assessment]")
    assert score.JUDGE_SYSTEM == "You are a helpful and objective evaluator."


# ------------------------------------------------------------------ letters and choices
@pytest.mark.parametrize(
    "prediction, expected",
    [
        ("B", ("cat", 1)),
        ("(B)", ("cat", 1)),
        ("B.", ("cat", 1)),
        ("B) cat", ("cat", 1)),
        ("C:", ("bird", 2)),
        ("Answer: C", ("bird", 2)),
        ("The answer is A.", ("dog", 0)),
        ("A dog barks", ("A dog barks", None)),
        ("D", ("D", None)),
        ("b", ("b", None)),
        ("I think B", ("I think B", None)),
    ],
)
def test_letter_to_option_mapping(prediction, expected):
    assert score.map_letter(prediction, ["dog", "cat", "bird"]) == expected


def test_pick_choice_takes_the_first_maximum():
    assert score.pick_choice([0.1, 0.9, 0.9]) == 1
    assert score.pick_choice([-1.0]) == 0


@pytest.fixture(scope="module")
def task():
    return MMAUProTask(embedder="all-MiniLM-L6-v2")


CLOSED = {
    "id": "c1",
    "category": "sound",
    "question": "Which best describes the sound?",
    "choices": ["a steady pure tone", "white noise", "a rising pitch sweep", "silence"],
    "answer": "white noise",
}


@pytest.mark.parametrize(
    "prediction, matched",
    [
        ("It is hissing static noise.", "white noise"),
        ("Nothing at all, it is quiet: silence.", "silence"),
        ("The pitch goes up over time", "a rising pitch sweep"),
    ],
)
def test_closed_form_matching_with_minilm(task, prediction, matched):
    out = task.score_prediction(CLOSED, prediction)
    assert out["matched_choice"] == out["matched_choice_letters_mapped"] == matched  # no letter: both the same
    correct = int(matched == "white noise")
    assert out["scores"] == {"correct": correct, "correct_letters_mapped": correct}
    assert out["scorer"] == {"embedder": "all-MiniLM-L6-v2", "embedder_pooling": "mean-pool"}
    assert len(out["similarities"]) == 4 and max(out["similarities"]) <= 100.0 + 1e-3


@pytest.mark.parametrize("prediction, letter", [("B", 1), ("(B)", 1), ("Answer: B", 1)])
def test_a_letter_is_embedded_raw_officially_and_mapped_only_in_the_extra_metric(task, prediction, letter):
    """Kind 6: the official script embeds "B" itself; what it is closest to has nothing to do with option B."""
    out = task.score_prediction(CLOSED, prediction)
    model = task.get_embedder()
    raw = (model.encode([prediction]) @ model.encode(CLOSED["choices"]).T * 100).squeeze(0).tolist()
    assert out["similarities"] == pytest.approx(raw, abs=1e-4)
    assert out["matched_choice"] == CLOSED["choices"][score.pick_choice(raw)]
    assert out["scores"]["correct"] == int(out["matched_choice"] == "white noise")
    assert out["letter_index"] == letter and out["matched_choice_letters_mapped"] == "white noise"
    assert out["scores"]["correct_letters_mapped"] == 1


def test_embeddings_are_unit_norm(task):
    vectors = task.get_embedder().encode(["a", "a longer sentence about sounds"])
    assert vectors.shape == (2, 384)
    assert vectors.norm(dim=1).tolist() == pytest.approx([1.0, 1.0], abs=1e-5)


# ------------------------------------------------------------------ aggregation
def rec(i, category, kind, **fields):
    extra = {k: fields.pop(k) for k in ("error", "failure", "note") if k in fields}
    if kind == "closed":
        fields.setdefault("correct_letters_mapped", fields["correct"])
    return {"id": f"r{i}", "category": category, "kind": kind, "scores": fields, "scorer": {"name": kind}, **extra}


def test_aggregate_matches_the_official_formulas():
    records = [
        rec(0, "open", "open", overall=4.0),
        rec(1, "open", "open", overall=3.5),
        rec(2, "open", "open", overall=5.0),
        rec(3, "instruction following", "aif", passed=1),
        rec(4, "instruction following", "aif", passed=0),
        rec(5, "sound", "closed", correct=1),
        rec(6, "sound", "closed", correct=0, correct_letters_mapped=1),
        rec(7, "music", "closed", correct=1),
        rec(8, "music", "closed", correct=0, error="item r8: audio missing", failure="audio"),
        {"id": "r9", "category": "music", "kind": "excluded", "excluded": "item r9: one choice"},
    ]
    out = score.aggregate(records)
    m = out["metrics"]
    assert m["open_ended"] == pytest.approx((4.0 + 3.5 + 5.0) / 3 / 5 * 100)
    assert m["good_rate"] == pytest.approx(100 * 2 / 3)  # 4.0 counts as good, 3.5 does not
    assert m["aif"] == 50.0 and m["closed"] == 50.0  # the failed r8 counts, as a miss
    weighted = (3 * (12.5 / 3 / 5) + 2 * 0.5 + 2 * 0.5 + 2 * 0.5) / 9 * 100
    assert m["overall"] == pytest.approx(weighted)
    assert m["closed_letters_mapped"] == 75.0
    assert m["overall_letters_mapped"] == pytest.approx((3 * (12.5 / 3 / 5) + 2 * 0.5 + 2 * 1.0 + 2 * 0.5) / 9 * 100)
    assert m["n"] == 10 and m["n_errors"] == 1
    assert out["categories"]["music"] == {
        "type": "closed",
        "n": 2,
        "score": 50.0,
        "score_letters_mapped": 50.0,
        "n_failed": 1,
        "n_failed_audio": 1,
        "n_excluded": 1,
    }
    assert [s["name"] for s in out["scorers"]] == ["aif", "closed", "open"]
    assert set(out["rules"]) >= {"overall", "closed", "closed_letters_mapped"}
    assert "ours" in out["rules"]["closed_letters_mapped"]
    assert score.aggregate(records) == out  # pure: the same twice


def test_aggregate_of_an_empty_kind_is_none():
    m = score.aggregate([rec(0, "sound", "closed", correct=1)])["metrics"]
    assert m["open_ended"] is None and m["good_rate"] is None and m["aif"] is None
    assert m["closed"] == m["overall"] == 100.0


def test_a_record_without_scores_is_refused():
    with pytest.raises(ValueError, match="record 'r0' has no scores"):
        score.aggregate([{"id": "r0", "category": "sound", "kind": "closed", "error": "old"}])


def test_pick_choice_refuses_nan():
    with pytest.raises(ValueError, match="not all finite"):
        score.pick_choice([0.2, float("nan"), 0.1])  # torch.argmax would pick the NaN
