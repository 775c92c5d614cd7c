"""MMAU-Pro scoring: judge prompt and parsing, Good Rate, letter mapping, closed-form matching with
the real MiniLM embedder, aggregation."""
from __future__ import annotations

import pytest

from tasks.mmau_pro import MMAUProTask, score


# ------------------------------------------------------------------ the judge's output
def test_full_judge_output():
    text = ("CORRECTNESS: 4 - right.\nRELEVANCE: 5 - on topic.\nCOMPLETENESS: 3 - partial.\n"
            "CLARITY: 5 - clear.\nOVERALL: 4.25 - good.")
    assert score.parse_judge_scores(text) == {"correctness": 4.0, "relevance": 5.0, "completeness": 3.0,
                                              "clarity": 5.0, "overall": 4.25}


def test_missing_scores_count_three_and_overall_is_recomputed():
    text = "correctness: 5\nClarity: 1\nOVERALL: n/a"
    # relevance and completeness missing -> 3.0; OVERALL missing -> mean(5, 3, 3, 1) = 3.0
    assert score.parse_judge_scores(text) == {"correctness": 5.0, "relevance": 3.0, "completeness": 3.0,
                                              "clarity": 1.0, "overall": 3.0}
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
@pytest.mark.parametrize("prediction, expected", [
    ("B", ("cat", 1)), ("(B)", ("cat", 1)), ("B.", ("cat", 1)), ("B) cat", ("cat", 1)), ("C:", ("bird", 2)),
    ("Answer: C", ("bird", 2)), ("The answer is A.", ("dog", 0)),
    ("A dog barks", ("A dog barks", None)), ("D", ("D", None)), ("b", ("b", None)), ("I think B", ("I think B", None)),
])
def test_letter_to_option_mapping(prediction, expected):
    assert score.map_letter(prediction, ["dog", "cat", "bird"]) == expected


def test_pick_choice_takes_the_first_maximum():
    assert score.pick_choice([0.1, 0.9, 0.9]) == 1
    assert score.pick_choice([-1.0]) == 0


@pytest.fixture(scope="module")
def task():
    return MMAUProTask(embedder="all-MiniLM-L6-v2")


CLOSED = {"id": "c1", "category": "sound", "question": "Which best describes the sound?",
          "choices": ["a steady pure tone", "white noise", "a rising pitch sweep", "silence"], "answer": "white noise"}


@pytest.mark.parametrize("prediction, matched", [
    ("It is hissing static noise.", "white noise"),
    ("B", "white noise"),  # a bare letter is mapped to its option before embedding
    ("(C)", "a rising pitch sweep"),
    ("Nothing at all, it is quiet: silence.", "silence"),
    ("The pitch goes up over time", "a rising pitch sweep"),
])
def test_closed_form_matching_with_minilm(task, prediction, matched):
    out = task.score_prediction(CLOSED, prediction)
    assert out["matched_choice"] == matched
    assert out["scores"]["correct"] == int(matched == "white noise")
    assert out["scorer"] == {"embedder": "all-MiniLM-L6-v2", "embedder_pooling": "mean-pool"}
    assert len(out["similarities"]) == 4 and max(out["similarities"]) <= 100.0 + 1e-3


def test_embeddings_are_unit_norm(task):
    vectors = task.get_embedder().encode(["a", "a longer sentence about sounds"])
    assert vectors.shape == (2, 384)
    assert vectors.norm(dim=1).tolist() == pytest.approx([1.0, 1.0], abs=1e-5)


# ------------------------------------------------------------------ aggregation
def rec(i, category, kind, **scores):
    return {"id": f"r{i}", "category": category, "kind": kind, "scores": scores, "scorer": {"name": kind}}


def test_aggregate_matches_the_official_formulas():
    records = [
        rec(0, "open", "open", overall=4.0), rec(1, "open", "open", overall=3.5), rec(2, "open", "open", overall=5.0),
        rec(3, "instruction following", "aif", passed=1), rec(4, "instruction following", "aif", passed=0),
        rec(5, "sound", "closed", correct=1), rec(6, "sound", "closed", correct=0),
        rec(7, "music", "closed", correct=1),
        {"id": "r8", "category": "music", "kind": "closed", "error": "item r8: audio missing"},
    ]
    out = score.aggregate(records)
    m = out["metrics"]
    assert m["open_ended"] == pytest.approx((4.0 + 3.5 + 5.0) / 3 / 5 * 100)
    assert m["good_rate"] == pytest.approx(100 * 2 / 3)  # 4.0 counts as good, 3.5 does not
    assert m["aif"] == 50.0 and m["closed"] == pytest.approx(200 / 3)
    weighted = (3 * (12.5 / 3 / 5) + 2 * 0.5 + 2 * 0.5 + 1 * 1.0) / 8 * 100
    assert m["overall"] == pytest.approx(weighted)
    assert m["n"] == 9 and m["n_errors"] == 1
    assert out["categories"]["music"] == {"type": "closed", "n": 1, "score": 100.0, "n_errors": 1}
    assert [s["name"] for s in out["scorers"]] == ["aif", "closed", "open"]
    assert score.aggregate(records) == out  # pure: the same twice


def test_aggregate_of_an_empty_kind_is_none():
    m = score.aggregate([rec(0, "sound", "closed", correct=1)])["metrics"]
    assert m["open_ended"] is None and m["good_rate"] is None and m["aif"] is None
    assert m["closed"] == m["overall"] == 100.0
