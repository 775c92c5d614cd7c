"""RULER's niah scoring as its scripts/eval/evaluate.py and eval/synthetic/constants.py define it: postprocess_pred
(strip, control characters [\\x00-\\x1f] to newlines, strip) then string_match_all (per item the share of references
found case-insensitively as plain substrings, the mean share x 100, rounded to 2 decimals), and the aggregate's
overall, per-variant and per-cell numbers."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tasks.niah import score


def reference(predictions, references) -> float:
    """RULER's rule written out plainly, in exact fractions: post-process, count the references contained in the
    lower-cased prediction, average the shares, x 100, round to 2 decimals."""
    shares = []
    for prediction, refs in zip(predictions, references):
        text = prediction.strip()
        text = "".join("\n" if ord(c) < 0x20 else c for c in text).strip()
        found = sum(1 for r in refs if r.lower() in text.lower())
        shares.append(Fraction(found, len(refs)))
    return round(float(sum(shares) / len(shares) * 100), 2)


def test_case_is_ignored_on_both_sides():
    assert (
        score.item_score("The UUID is 8F6AC489-BBB2-41F2-AF2E-AD8E9BD1B07F.", ["8f6ac489-bbb2-41f2-af2e-ad8e9bd1b07f"])
        == 100
    )
    assert score.item_score("key: fluffy-hill", ["FLUFFY-Hill"]) == 100


def test_a_plain_substring_counts_even_inside_a_longer_number():
    assert score.item_score("123456789", ["2345678"]) == 100  # RULER does no word or number boundary check
    assert score.item_score("2345678", ["123456789"]) == 0


def test_control_characters_become_newlines_and_can_split_an_answer():
    assert score.postprocess("\t 12\x0034567\x1f \n") == "12\n34567"
    assert score.item_score("12\x0034567", ["1234567"]) == 0
    assert score.postprocess("a\x7fb") == "a\x7fb"  # DEL is outside [\x00-\x1f]: kept
    assert score.item_score("  \x05 1234567 \x1b ", ["1234567"]) == 100


def test_an_empty_prediction_scores_zero():
    assert score.item_score("", ["1234567"]) == 0
    assert score.item_score("   \x00\n", ["1234567"]) == 0


def test_several_values_give_partial_credit():
    refs = ["1111111", "2222222", "3333333", "4444444"]
    assert score.item_score("2222222 and 4444444", refs) == 50
    assert score.item_score("4444444, 1111111, 3333333", refs) == 75
    assert score.item_score("the number is 3333333", ["3333333", "5555555", "6666666"]) == 33.33


def test_the_mean_is_over_items_then_rounded():
    preds = ["1", "1 2", "x", "1 2 3"]
    refs = [["1"], ["1", "2", "3", "4"], ["y"], ["1", "2", "3"]]
    # shares 1, 1/2, 0, 1 -> 62.5; a share of 1/3 in three items -> 11.11 (rounded once, at the end)
    assert score.string_match_all(preds, refs) == 62.5
    assert score.string_match_all(["a", "b", "c"], [["a", "x", "y"], ["z"], ["z"]]) == 11.11


@pytest.mark.parametrize("seed", range(5))
def test_against_the_plain_reference_on_awkward_inputs(seed):
    import random

    rng = random.Random(seed)
    pieces = ["1234567", "AbC-dEf", "\x00", "\x1f", " ", "\n", "é", "2345", "uuid-Ä", "abc-def", ""]
    predictions, references = [], []
    for _ in range(40):
        predictions.append("".join(rng.choice(pieces) for _ in range(rng.randrange(0, 8))))
        references.append([rng.choice(pieces[:2] + pieces[6:-1]) for _ in range(rng.randrange(1, 5))])
    assert score.string_match_all([score.postprocess(p) for p in predictions], references) == reference(
        predictions, references
    )


def test_an_item_without_references_is_refused():
    with pytest.raises(ValueError, match="without references"):
        score.string_match_all(["x"], [[]])


def record(variant, length, depth, prediction, answers, error=None):
    r = {"variant": variant, "length": length, "depth": depth, "prediction": prediction, "answers": answers}
    return r if error is None else {**r, "error": error}


def test_aggregate_overall_per_variant_and_per_cell():
    records = [
        record("niah_single_1", 4096, 0, "1234567", ["1234567"]),
        record("niah_single_1", 4096, 8, "nothing", ["1234567"]),
        record("niah_multivalue", 4096, 100, "1111111 2222222", ["1111111", "2222222", "3", "4"]),
        record("niah_multivalue", 8192, 100, "", ["1111111"], error="out of memory"),  # counts as empty
    ]
    agg = score.aggregate(records)
    m = agg["metrics"]
    assert m["string_match_all"] == reference([r["prediction"] for r in records], [r["answers"] for r in records])
    assert m["string_match_all"] == 37.5
    assert m["niah_single_1"] == 50 and m["niah_multivalue"] == 25
    assert m["n"] == 4 and m["n_errors"] == 1
    assert agg["categories"] == {
        "4K, depth 0-8%": {"string_match_all": 50.0, "n": 2},
        "4K, depth 92-100%": {"string_match_all": 50.0, "n": 1},
        "8K, depth 92-100%": {"string_match_all": 0.0, "n": 1},
    }
    assert score.by_length(records) == {4096: 50.0, 8192: 0.0}


def test_depth_rows_cover_the_grid_in_order():
    flat = [d for row in score.DEPTH_BINS for d in row]
    assert flat == list(score.DEPTHS) and len(score.DEPTH_BINS) == 10
    assert [score.depth_label(r) for r in (0, 9)] == ["0-8%", "92-100%"]
    with pytest.raises(ValueError, match="grid"):
        score.depth_bin(50)
