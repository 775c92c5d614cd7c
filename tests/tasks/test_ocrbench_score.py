"""OCRBench scoring: the official rule on hand-written cases, agreement with lmms-eval, purity."""

from __future__ import annotations

import random
import types

import pytest

from tasks.ocrbench import score


def record(i, category, value, error=False):
    base = {"id": f"r{i}", "category": category}
    return {**base, "error": "bad image"} if error else {**base, "prediction": "x", "scores": {"score": value}}


@pytest.mark.parametrize(
    "prediction, answers, dataset, expected",
    [
        ("The word is CENTRE.", "centre", "IIIT5K", 1),  # case folded, substring counts
        ("the word is centre", ["CENTRE"], "svt", 1),
        ("  hello\nworld  ", ["hello world"], "docVQA", 1),  # newline -> space after stripping
        ("hello  world", ["hello world"], "docVQA", 0),  # inner spaces are kept outside HME100k
        ("cent re", ["centre"], "IIIT5K", 0),
        ("", ["centre"], "IIIT5K", 0),
        ("nothing here", ["no", "zzz"], "STVQA", 1),  # several answers: any one is enough
        ("nothing here", ["yyy", "zzz"], "STVQA", 0),
        ("x ^ { 2 } + 3 = 7", ["x^{2}+3=7"], "HME100k", 1),  # HME100k: all spaces removed
        ("x^{2}\n+3=7", ["x ^ { 2 } + 3 = 7"], "HME100k", 1),
        ("\\Alpha + 1", ["\\alpha+1"], "HME100k", 0),  # HME100k keeps case
        ("\\alpha + 1", ["\\alpha+1"], "HME100k", 1),
        ("\\Alpha + 1", ["\\alpha + 1"], "IIIT5K", 1),  # the same strings elsewhere fold case
        ("x\t^2", ["x^2"], "HME100k", 0),  # only ' ' is removed, not tabs (the official replace)
        ("anything", [], "IIIT5K", 0),  # an empty list never matches
    ],
)
def test_official_rule(prediction, answers, dataset, expected):
    assert score.score_sample(prediction, answers, dataset) == expected


def test_full_width_is_not_folded():
    """lmms-eval folds full-width letters; the official rule (ours) does not."""
    assert score.score_sample("ＣＥＮＴＲＥ", ["centre"], "IIIT5K") == 0


def test_aggregate_categories_total_and_errors():
    records = [record(i, c, i % 2) for i, c in enumerate(score.CATEGORIES)]  # odd indices win a point
    records.append(record(99, "Doc-oriented VQA", 0, error=True))
    result = score.aggregate(records)
    m = result["metrics"]
    assert m["total"] == 5 and m["n"] == 11 and m["n_errors"] == 1
    assert m["text_recognition"] == 3  # categories 1, 3, 5 of the first six
    assert result["categories"]["Doc-oriented VQA"] == {"score": 1, "n": 1, "n_errors": 1, "accuracy": 1.0}
    assert result["categories"]["Regular Text Recognition"]["accuracy"] == 0.0
    assert set(result["categories"]) == set(score.CATEGORIES)
    assert sum(score.CATEGORY_POINTS.values()) == 1000


def test_aggregate_rejects_unknown_category():
    with pytest.raises(ValueError, match="OCRBench categories"):
        score.aggregate([record(0, "Poetry", 1)])


def test_aggregate_twice_in_one_process_is_identical():
    records = [record(i, score.CATEGORIES[i % 10], 1) for i in range(40)]
    first = score.aggregate(records)
    assert score.aggregate(records) == first
    assert first["metrics"]["total"] == 40


# ----------------------------------------------------------------- agreement with lmms-eval
lmms_utils = pytest.importorskip(
    "lmms_eval.tasks.ocrbench.utils", reason="lmms-eval is not installed (pip install --no-deps lmms-eval==0.7.3)"
)
ALPHABET = "abcXYZ 019\n{}^\\+=.-"


def _random_case(rng: random.Random):
    text = lambda n: "".join(rng.choice(ALPHABET) for _ in range(n))  # noqa: E731
    answers = [text(rng.randint(0, 3)) for _ in range(rng.randint(1, 3))]
    prediction = text(rng.randint(0, 12))
    if rng.random() < 0.5:  # plant an answer, maybe re-cased and re-spaced, to get many matches
        planted = rng.choice(answers)
        planted = planted.upper() if rng.random() < 0.5 else planted.replace(" ", "")
        prediction = text(2) + planted + text(2)
    dataset = rng.choice(["HME100k", "IIIT5K", "docVQA"])
    return prediction, answers, dataset


def test_agrees_with_lmms_eval_without_full_width_characters():
    rng = random.Random(0)
    matches = 0
    for _ in range(3000):
        prediction, answers, dataset = _random_case(rng)
        doc = {"answer": answers, "dataset": dataset, "question_type": "Doc-oriented VQA"}
        theirs = lmms_utils.ocrbench_process_results(doc, [prediction])["ocrbench_accuracy"]["score"]
        ours = score.score_sample(prediction, answers, dataset)
        assert ours == theirs, (prediction, answers, dataset)
        matches += ours
    assert 300 < matches < 2700  # both outcomes were exercised


def test_lmms_eval_accumulates_across_runs_but_we_do_not(tmp_path, monkeypatch):
    """lmms-eval's module-level tally inflates a second run in one process; ours stays put."""
    monkeypatch.setattr(lmms_utils, "generate_submission_file", lambda name, args, subpath=None: str(tmp_path / name))
    monkeypatch.setattr(lmms_utils, "OCRBench_score", {c: 0 for c in score.CATEGORIES})
    results = [{"question_type": "Regular Text Recognition", "score": 1}] * 3
    first = lmms_utils.ocrbench_aggregate_accuracy(results, types.SimpleNamespace())
    second = lmms_utils.ocrbench_aggregate_accuracy(results, types.SimpleNamespace())
    assert second == 2 * first  # their bug, shown
    records = [record(i, "Regular Text Recognition", 1) for i in range(3)]
    assert score.aggregate(records)["metrics"]["total"] == score.aggregate(records)["metrics"]["total"] == 3
