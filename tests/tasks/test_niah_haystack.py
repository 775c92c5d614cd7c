"""The niah inputs as RULER builds them (scripts/data/synthetic/niah.py, constants.py, synthetic.yaml): the variants,
needles, singular and plural templates, depth placement in each haystack kind, the essay's sentence split, the item
schedule, and the sizing search against a brute-force search."""

from __future__ import annotations

import random
import re
from collections import Counter

import numpy as np
import pytest

from tasks.niah import haystack as H
from tasks.niah import largest_fitting, schedule, score
from tasks.niah.words import ADJECTIVES, NOUNS

UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def test_the_depth_grid_is_rulers():
    assert list(H.DEPTHS) == [int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True))]


def test_the_variants_are_rulers_synthetic_yaml():
    table = {v.name: (v.haystack, v.key_type, v.value_type, v.keys, v.values, v.queries) for v in H.VARIANTS.values()}
    assert table == {
        "niah_single_1": ("noise", "words", "numbers", 1, 1, 1),
        "niah_single_2": ("essay", "words", "numbers", 1, 1, 1),
        "niah_single_3": ("essay", "words", "uuids", 1, 1, 1),
        "niah_multikey_1": ("essay", "words", "numbers", 4, 1, 1),
        "niah_multikey_2": ("needle", "words", "numbers", 1, 1, 1),
        "niah_multikey_3": ("needle", "uuids", "uuids", 1, 1, 1),
        "niah_multivalue": ("essay", "words", "numbers", 1, 4, 1),
        "niah_multiquery": ("essay", "words", "numbers", 4, 1, 4),
    }


def test_word_lists():
    for words in (ADJECTIVES, NOUNS):
        assert len(words) >= 400 and len(set(words)) == len(words)
        assert all(re.fullmatch(r"[a-z]+", w) for w in words)


@pytest.mark.parametrize("name", list(H.VARIANTS))
def test_needles(name):
    variant = H.VARIANTS[name]
    for seed in range(20):
        depth = H.DEPTHS[seed * 2]
        needles = H.make_needles(variant, depth, random.Random(seed))
        n_keys = max(variant.keys, variant.queries)
        assert len(set(needles.keys)) == n_keys and len(needles.queries) == variant.queries
        assert len(needles.answers) == variant.queries * variant.values
        assert len(needles.placed) == n_keys * variant.values
        depths = [d for d, _ in needles.placed]
        assert depths == sorted(depths) and len(set(depths)) == len(depths) and set(depths) <= set(H.DEPTHS)
        first = f"One of the special magic {variant.value_type} for {needles.queries[0]} is: {needles.answers[0]}."
        assert (depth, first) in needles.placed
        for key in needles.keys:
            if variant.key_type == "words":
                adjective, noun = key.split("-")
                assert adjective in ADJECTIVES and noun in NOUNS
            else:
                assert UUID4.match(key)
        for value in needles.answers:
            assert re.fullmatch(r"[1-9][0-9]{6}", value) if variant.value_type == "numbers" else UUID4.match(value)
        assert needles == H.make_needles(variant, depth, random.Random(seed))  # seeded


def test_the_question_is_singular_when_one_value_is_asked():
    needles = H.make_needles(H.VARIANTS["niah_single_2"], 0, random.Random(1))
    key = needles.queries[0]
    text, prefix = H.question(H.VARIANTS["niah_single_2"], needles, "HAY")
    assert text == (
        "A special magic number is hidden within the following text. Make sure to memorize it. I will quiz you about "
        f"the number afterwards.\nHAY\nWhat is the special magic number for {key} mentioned in the provided text?"
    )
    assert prefix == f" The special magic number for {key} mentioned in the provided text is"
    text, _ = H.question(
        H.VARIANTS["niah_multikey_3"], H.make_needles(H.VARIANTS["niah_multikey_3"], 0, random.Random(1)), ""
    )
    assert text.startswith("A special magic uuid is hidden") and "I will quiz you about the uuid afterwards" in text


def test_the_question_is_plural_with_several_values_or_queries():
    variant = H.VARIANTS["niah_multiquery"]
    needles = H.make_needles(variant, 0, random.Random(3))
    a, b, c, d = needles.queries
    text, prefix = H.question(variant, needles, "HAY")
    assert text == (
        "Some special magic numbers are hidden within the following text. Make sure to memorize it. I will quiz you "
        f"about the numbers afterwards.\nHAY\nWhat are all the special magic numbers for {a}, {b}, {c}, and {d} "
        "mentioned in the provided text?"
    )
    assert prefix == f" The special magic numbers for {a}, {b}, {c}, and {d} mentioned in the provided text are"
    text, prefix = H.question(
        H.VARIANTS["niah_multivalue"], H.make_needles(H.VARIANTS["niah_multivalue"], 0, random.Random(3)), ""
    )
    assert "What are all the special magic numbers for" in text and prefix.endswith("provided text are")


@pytest.mark.parametrize("n", [1, 7, 40, 333])
def test_line_haystacks_put_the_needle_at_its_depth(n):
    for depth in H.DEPTHS:
        placed = ((depth, "NEEDLE"),)
        lines = H.line_context([H.NOISE] * n, placed).split("\n")
        assert len(lines) == n + 1 and lines.index("NEEDLE") == int(n * (depth / 100))  # RULER's expression


def test_several_needles_keep_their_depth_order_in_a_line_haystack():
    placed = ((0, "A"), (49, "B"), (51, "C"), (100, "D"))
    lines = H.line_context([H.NOISE] * 50, placed).split("\n")
    assert [lines.index(x) for x in "ABCD"] == [0, 25, 27, 53]  # before lines 0, 24, 25, 50 of the haystack


def test_the_needle_haystack_draws_distractors_unlike_the_items_keys():
    variant = H.VARIANTS["niah_multikey_2"]
    needles = H.make_needles(variant, 23, random.Random(0))
    lines = H.distractors(variant, needles, 300, random.Random("hay"))
    assert lines[:100] == H.distractors(variant, needles, 100, random.Random("hay"))  # grows at its end only
    keys = [re.match(r"One of the special magic numbers for (\S+) is: \d{7}\.$", line).group(1) for line in lines]
    assert needles.keys[0] not in keys


def test_the_essay_needle_goes_before_sentence_int_len_times_depth():
    start, n = 2, 900
    sentences = H.essay_sentences(start, n)
    for depth in (0, 13, 49, 87, 100):
        context = H.essay_context(start, n, ((depth, "NEEDLE."),))
        position = int(len(sentences) * (depth / 100))
        before = " ".join(sentences[:position])
        assert context == " ".join([before, "NEEDLE.", " ".join(sentences[position:])])


@pytest.mark.parametrize("start", [0, 5, 8])
def test_the_essay_split_equals_nltk_sent_tokenize_of_the_prefix(start):
    """The fast split (one Punkt pass over the stream, the prefix's end split anew) against Punkt on the prefix
    itself, RULER's sent_tokenize(text), at awkward cuts: at and just after sentence ends, and past the stream's end
    (where RULER repeats it)."""
    words = H.license_words(start)
    full = H.essay(start, 2)
    ends = [b for _, b in full.spans[:60:7]]
    cuts = [1, 2, 3, len(words) - 1, len(words), len(words) + 1, len(words) + 37]
    cuts += [full.word_ends.index(e) + 1 for e in ends if e in full.word_ends]
    cuts += [c + 1 for c in cuts[-3:]]
    for n in cuts:
        text = " ".join((words * 2)[:n]).strip()
        assert H.essay_sentences(start, n) == H.split_sentences(text), n


def brute_force(tokens, budget):
    best = -1
    for n in range(0, 5000):
        if tokens(n) <= budget:
            best = n
    return best


@pytest.mark.parametrize(
    "tokens",
    [
        lambda n: 100 + 13 * n,
        lambda n: 100 + 13 * n + (n % 7 == 0),  # nearly linear with bumps
        lambda n: 40 + int(n**1.3),
        lambda n: 500 + 50 * (n // 10),  # plateaus: the largest n of a plateau counts
        lambda n: 10 + n * n,
    ],
)
@pytest.mark.parametrize("budget", [5, 100, 113, 1000, 3968, 20000])
@pytest.mark.parametrize("guess", [1, 25, 500, 4000])
def test_largest_fitting_finds_what_a_brute_force_search_finds(tokens, budget, guess):
    calls = []

    def counted(n):
        calls.append(n)
        return tokens(n)

    n, t = largest_fitting(counted, budget, guess)
    expected = brute_force(tokens, budget)
    assert n == expected
    assert t == tokens(max(n, 0))
    assert len(calls) <= 40


def test_the_schedule_balances_variants_depths_and_prefixes():
    plan = schedule(tuple(H.VARIANTS), 10)
    assert len(plan) == 80 and len({(j, name) for j, name, _ in plan}) == 80
    cells = Counter((name, score.depth_bin(depth)) for _, name, depth in plan)
    assert set(cells.values()) == {1} and len(cells) == 80  # each variant once in every depth row
    assert set(Counter(depth for _, _, depth in plan).values()) == {2}  # every grid depth twice
    first = plan[:8]
    assert {name for _, name, _ in first} == set(H.VARIANTS)
    assert len({score.depth_bin(depth) for _, _, depth in first}) == 8
