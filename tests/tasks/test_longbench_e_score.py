"""LongBench-E scoring against the rules of THUDM/LongBench's metrics.py and eval.py (--e), worked out by hand on
awkward inputs; the code-similarity matchers against a plain dynamic-programming reference; ROUGE's recursion edge
against a script shaped like eval.py."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import textwrap
from difflib import SequenceMatcher

import pytest

from tasks.longbench_e import fuzzy, score

pytest.importorskip("rouge", reason="LongBench-E's ROUGE-L needs rouge==1.0.1 (pip install rouge==1.0.1)")


# ------------------------------------------------------------------------------------------------ qa_f1


def test_normalize_answer_order_and_ascii_punctuation():
    assert score.normalize_answer("The  Cat's hat!") == "cats hat"  # punctuation first: "cat's" -> "cats"
    assert score.normalize_answer("a-team") == "ateam"  # the hyphen goes before articles are looked for
    assert score.normalize_answer("Theater, an apple") == "theater apple"  # whole words only
    assert score.normalize_answer("“Paris” — 3.5") == "“paris” — 35"  # curly quotes and em dash are not ASCII
    assert score.normalize_answer("1,000 Ünïcode") == "1000 ünïcode"


@pytest.mark.parametrize(
    "prediction, answer, expected",
    [
        ("Paris", "paris.", 1.0),
        ("Eventually, an apple.", "apple", 2 / 3),  # P = 1/2, R = 1
        ("paris paris", "paris", 2 / 3),  # token multisets: one shared
        ("“Paris”", "Paris", 0.0),  # the curly quotes stay glued to the word
        ("", "Paris", 0.0),
        ("the", "a", 0.0),  # both normalize to nothing
        ("3.5 million", "35 million", 1.0),
    ],
)
def test_qa_f1(prediction, answer, expected):
    assert score.qa_f1_score(prediction, answer) == pytest.approx(expected, abs=1e-12)


def test_qa_f1_precision_recall():
    # "it is 3 or 5" vs "3": one shared token of five -> P = 1/5, R = 1, F1 = 2 * 0.2 / 1.2
    assert score.qa_f1_score("It is 3 or 5", "3") == pytest.approx(2 * 0.2 / 1.2)


# ------------------------------------------------------------------------------------------------ rouge


def test_rouge_official_edges():
    assert score.rouge_score(".", "a b") == 0.0  # "." only: no sentence left, rouge raises -> 0
    assert score.rouge_score("", "a b") == 0.0
    assert score.rouge_score("the cat sat", "the cat sat") == pytest.approx(1.0, abs=1e-7)
    assert score.rouge_score("The cat sat", "the cat sat") < 0.7  # case-sensitive
    assert score.rouge_score("3.5", "3 5") == pytest.approx(1.0, abs=1e-7)  # "3.5" is two sentences, "3" and "5"
    assert score.rouge_score("3.5", "35") == 0.0


def test_rouge_recursion_edge_as_at_eval_py_top_level(monkeypatch):
    """rouge's back-trace recurses once per step: find the longest identical one-sentence pair that still scores
    when called the way eval.py calls it (module -> scorer_e -> rouge_score), under a small recursion limit to keep it
    quick; from pytest's much deeper stack (and deeper still) the edge must be the same."""
    limit = 300
    script = textwrap.dedent(
        f"""
        import sys
        from rouge import Rouge
        sys.setrecursionlimit({limit})

        def rouge_score(prediction, ground_truth):
            try:
                return Rouge().get_scores([prediction], [ground_truth], avg=True)["rouge-l"]["f"]
            except Exception:
                return 0.0

        def scorer_e(n):
            s = " ".join(f"w{{i}}" for i in range(n))
            return rouge_score(s, s)

        lo, hi = 150, {limit}
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if scorer_e(mid) > 0 else (lo, mid - 1)
        print(lo)
        """
    )
    edge = int(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout)
    monkeypatch.setattr(score, "OFFICIAL_LIMIT", limit)

    def words(n):
        return " ".join(f"w{i}" for i in range(n))

    def deeper(k, n):
        return score.rouge_score(words(n), words(n)) if k == 0 else deeper(k - 1, n)

    before = sys.getrecursionlimit()
    assert score.rouge_score(words(edge), words(edge)) > 0.99
    assert score.rouge_score(words(edge + 1), words(edge + 1)) == 0.0
    assert deeper(100, edge) > 0.99 and deeper(100, edge + 1) == 0.0
    assert sys.getrecursionlimit() == before


# ------------------------------------------------------------------------------------------------ trec


def test_classification_substrings_and_case():
    classes = ["Event", "Date", "Description of something"]
    assert score.classification_score("Eventually", "Event", all_classes=classes) == 1.0  # "Event" in "Eventually"
    assert score.classification_score("Eventually, a Date", "Date", all_classes=classes) == 0.5
    assert score.classification_score("event", "Event", all_classes=classes) == 0.0
    assert score.classification_score("Date", "Event", all_classes=classes) == 0.0


def test_classification_remove_while_iterating():
    """Matches [full, "Description", "something"]: removing "Description" shifts "something" under the loop's index,
    so it is never looked at and stays: 1/2, where removing every sub-class would give 1."""
    classes = ["Description of something", "Description", "something", "Date"]
    got = score.classification_score("Description of something", "Description of something", all_classes=classes)
    assert got == 0.5
    # another class order: removing "Description" shifts the full answer under the index (it stays anyway) and
    # "something" is looked at and removed: 1/1
    reordered = ["Description", "Description of something", "Date", "something"]
    got = score.classification_score("Description of something", "Description of something", all_classes=reordered)
    assert got == 1.0


# ------------------------------------------------------------------------------------------------ count / retrieval


@pytest.mark.parametrize(
    "prediction, answer, expected",
    [
        ("There are 12 paragraphs, 12 unique", "12", 1.0),
        ("12 of 13", 12, 0.5),  # str(answer)
        ("", "12", 0.0),
        ("012", "12", 0.0),
        ("١٢", "12", 0.0),  # Arabic-Indic digits are \d but never equal "12"
        ("3.5", "5", 0.5),
        ("twelve", "12", 0.0),
    ],
)
def test_count_score(prediction, answer, expected):
    assert score.count_score(prediction, answer) == expected


def test_retrieval_score():
    assert score.retrieval_score("Paragraph 7", "Paragraph 7") == 1.0
    assert score.retrieval_score("Paragraph 07", "Paragraph 7") == 0.0
    assert score.retrieval_score("Paragraph 7, not 8", "Paragraph 7") == 0.5
    assert score.retrieval_score("The answer is Paragraph 3", "Paragraph 30 and Paragraph 3") == 0.0  # first id: 30
    with pytest.raises(ValueError, match="Paragraph"):
        score.retrieval_score("Paragraph 1", "paragraph 1")


# ------------------------------------------------------------------------------------------------ code


def test_code_line_skips_comments_and_fences():
    assert score.code_line("\n\n# comment\n```python\nx = 1\ny = 2") == "x = 1"
    assert score.code_line("// c\nurl = 'http://a'\nreturn url") == "return url"  # "//" anywhere skips a line
    assert score.code_line("# a\n# b") == ""
    assert score.code_line("") == ""
    assert score.code_line("  x = 1  \n") == "  x = 1  "  # no stripping of the line itself


def _lcs_reference(a: str, b: str) -> int:
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a, 1):
        for j, y in enumerate(b, 1):
            table[i][j] = table[i - 1][j - 1] + 1 if x == y else max(table[i - 1][j], table[i][j - 1])
    return table[len(a)][len(b)]


def test_bit_parallel_lcs_matches_the_table():
    rng = random.Random(0)
    for _ in range(3000):
        a = "".join(rng.choice("ab (){}é\n") for _ in range(rng.randint(0, 30)))
        b = "".join(rng.choice("ab (){}é\n") for _ in range(rng.randint(0, 30)))
        assert fuzzy.lcs_length(a, b) == _lcs_reference(a, b), (a, b)
        if a or b:
            assert fuzzy.indel_ratio(a, b) == pytest.approx(2 * _lcs_reference(a, b) / (len(a) + len(b)), abs=1e-15)


@pytest.mark.parametrize(
    "a, b, difflib_score, levenshtein_score",
    [
        ("", "", 100, 100),  # equal strings first: fuzzywuzzy's guard
        ("", "x", 0, 0),
        ("x = 1", "x = 1", 100, 100),
        ("aaaa", "abaa", 50, 75),  # difflib takes the block "aa" and stops; the LCS is "aaa"
        ("abcd", "bcda", 75, 75),
        (("ab" * 105)[1:], "ab" * 105, 0, 100),  # b >= 200 chars: difflib's autojunk drops every character
        (("ab" * 99)[1:], "ab" * 99, 100, 100),  # under 200 chars: no autojunk, 2*197/395 -> 99.75 -> 100
        ("abc", "abcde", 75, 75),  # 2*3/8 = 0.75 exactly
    ],
)
def test_fuzzy_ratio_known_pairs(a, b, difflib_score, levenshtein_score):
    assert fuzzy.ratio(a, b, "difflib") == difflib_score
    assert fuzzy.ratio(a, b, "levenshtein") == levenshtein_score


def test_fuzzy_difflib_backend_is_the_stdlib_matcher_with_halves_to_even():
    rng = random.Random(1)
    for _ in range(500):
        b = "".join(rng.choice("ab =()") for _ in range(rng.randint(1, 240)))
        a = b[: rng.randint(0, len(b))] + "x" + b[rng.randint(0, len(b)) :]
        if a != b:
            assert fuzzy.ratio(a, b, "difflib") == int(round(100 * SequenceMatcher(None, a, b).ratio()))
    # one shared character of 16: 100 * 2 / 16 = 12.5, and Python's round takes halves to the even 12
    assert fuzzy.ratio("abcdefgh", "ijklmnoa", "levenshtein") == fuzzy.ratio("abcdefgh", "ijklmnoa", "difflib") == 12
    assert score.code_sim_score("x\ny", "x") == 1.0
    with pytest.raises(ValueError, match="unknown fuzzy backend"):
        fuzzy.ratio("a", "b", "jaro")


def test_levenshtein_backend_matches_python_levenshtein_where_installed():
    levenshtein = pytest.importorskip("Levenshtein")
    rng = random.Random(2)
    for _ in range(2000):
        a = "".join(rng.choice("ab (){}=é") for _ in range(rng.randint(1, 60)))
        b = "".join(rng.choice("ab (){}=é") for _ in range(rng.randint(1, 60)))
        assert fuzzy.indel_ratio(a, b) == levenshtein.ratio(a, b)


# ------------------------------------------------------------------------------------------------ items


def test_score_item_first_line_and_best_answer():
    assert score.score_item("triviaqa", "\n\nParis\nLondon", ["London", "Paris"]) == 1.0
    assert score.score_item("hotpotqa", "\n\nParis\nLondon", ["Paris"]) == pytest.approx(2 / 3)  # both lines scored
    assert score.score_item("samsum", "A met B.\nThen more", ["A met B."]) == pytest.approx(1.0, abs=1e-7)
    assert score.score_item("trec", "Date\nEvent", ["Event"], ["Date", "Event"]) == 0.0
    assert score.score_item("lcc", "# c\nx = 1", ["x = 1"]) == 1.0
    assert score.score_item("passage_count", "", ["3"]) == 0.0


# ------------------------------------------------------------------------------------------------ aggregation


def _rec(dataset, length, value=None, error=False):
    out = {"id": f"{dataset}/{length}/{value}", "dataset": dataset, "category": dataset, "length": length}
    return {**out, "error": "boom"} if error else {**out, "scores": {"score": value}}


def test_buckets_sets_and_average_with_an_empty_bucket():
    records = [
        _rec("qasper", 100, 1.0),
        _rec("qasper", 3999, 0.0),
        _rec("qasper", 2500, 0.5),  # 0-4k: 50.0
        _rec("qasper", 4000, 1 / 3),  # 4-8k: 33.33; 8k+ empty
        _rec("trec", 7999, 0.0),  # 4-8k: 0.0
        _rec("trec", 8000, 0.25),  # 8k+: 25.0
        _rec("trec", 10, 1.0),  # 0-4k: 100.0
        _rec("trec", 20, error=True),  # a failed item counts 0 in its bucket: 0-4k -> 50.0
        {"id": "trec/line9", "dataset": "trec", "category": "trec", "length": None, "error": "bad line"},
    ]
    table = score.bucket_scores(records)
    assert table["qasper"]["0-4k"] == 50.0 and table["qasper"]["4-8k"] == 33.33 and math.isnan(table["qasper"]["8k+"])
    assert table["trec"] == {"0-4k": 50.0, "4-8k": 0.0, "8k+": 25.0}
    out = score.aggregate(records)
    m = out["metrics"]
    assert m["qasper"] == pytest.approx((50.0 + 33.33) / 2)  # the empty bucket left out
    assert m["trec"] == pytest.approx(75.0 / 3)
    assert m["average"] == round((41.665 + 25.0) / 2, 2) == 33.33
    assert m["0-4k"] == pytest.approx(50.0) and m["8k+"] == pytest.approx(25.0)  # qasper has no 8k+ bucket
    assert m["n"] == 9 and m["n_errors"] == 2
    assert out["categories"]["qasper"] == {"score": m["qasper"], "0-4k": 50.0, "4-8k": 33.33, "n": 4, "n_errors": 0}
    assert out["categories"]["trec"]["n"] == 3 and out["categories"]["trec"]["n_errors"] == 2
    assert list(out["categories"]) == ["qasper", "trec"]


def test_bucket_rounding_is_numpy_round_of_numpy_mean():
    import numpy as np

    values = [1 / 3, 2 / 3, 1 / 7, 0.1, 0.2, 0.7, 0.005]
    records = [_rec("lcc", 100, v) for v in values]
    assert score.bucket_scores(records)["lcc"]["0-4k"] == float(round(100 * np.mean(values), 2))
    assert score.aggregate(records)["metrics"]["average"] == float(round(100 * np.mean(values), 2))


def test_every_set_scores_and_full_tables_give_the_plain_mean():
    """With every bucket filled the average is the [OS] rule: mean of the sets' means of their rounded buckets."""
    from tasks.longbench_e.prompts import DATASETS

    rng = random.Random(3)
    records = [_rec(d, length, rng.random()) for d in DATASETS for length in (10, 5000, 9000, 12000, 3000)]
    table = score.bucket_scores(records)
    per_set = [sum(table[d].values()) / 3 for d in DATASETS]
    assert score.aggregate(records)["metrics"]["average"] == pytest.approx(round(sum(per_set) / 13, 2), abs=1e-9)
