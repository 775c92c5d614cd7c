"""Every MMAU-Pro instruction-following checker on a passing and a failing response."""
from __future__ import annotations

import json

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
    "Multiple Sections": ({"N": 2, "section_splitter": "Section"}, "Section 1 tone. Section 2 noise.", "Section 1 only."),
    "Repeat Prompt": ({}, "describe the audio and repeat this request. A tone.", "A tone. Describe the audio..."),
    "Two Responses": ({}, "A tone. ****** A beep.", "A tone. ****** a tone."),
    "All Uppercase": ({}, "A LOUD TONE.", "A loud TONE."),
    "All Lowercase": ({}, "a soft tone.", "a soft Tone."),
    "All-capital Words (at least)": ({"N": 2}, "A LOUD tone", "a LOUD tone"),
    "All-capital Words (at most)": ({"N": 1}, "a LOUD tone", "A LOUD tone"),
    "All-capital Words (range)": ({"N1": 1, "N2": 2}, "a LOUD tone", "a loud tone"),
    "Start Checker": ({"start_phrase": "I hear"}, "I hear, a tone.", "  I hear a tone."),  # the official check keeps leading spaces
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
    assert aif.check(identifier, good, kwargs, QUESTION) is True
    assert aif.check(identifier, bad, kwargs, QUESTION) is False


def test_counting_rules():
    assert aif.count_paragraphs("a *** *** b ***") == 2  # empty paragraphs do not count
    assert aif.count_bullets("* a\n*b\n - c\n   * d") == 2  # needs "* " at a line start
    assert aif.count_highlights("*a* b *c*") == 2
    assert aif.count_keyword("Sound, sounds, SOUND.", "sound") == 2  # whole words only
    assert aif.count_capital_words("I AM here OK.") == 3  # "I" counts, as str.isupper says


def test_official_defaults_for_missing_kwargs():
    assert aif.check("Number Words (range)", "word " * 999, {}, "") is True  # N1 = 0, N2 = 999
    assert aif.check("Number Words (range)", "word " * 1000, {}, "") is False
    assert aif.check("Keyword Frequency", "anything", {}, "") is False  # keyword "" found N > 0 times
    assert aif.check("Include Keywords", "anything", {}, "") is True  # "" is in every text


def test_kwargs_from_parquet_struct_or_json_string():
    struct = {"N": 2, "N1": None, "N2": None, "keyword": None}
    assert aif.clean_kwargs(struct) == {"N": 2}
    assert aif.clean_kwargs(json.dumps({"N": 2})) == {"N": 2}
    assert aif.clean_kwargs(None) == {} and aif.clean_kwargs("") == {}
    assert aif.check("Number Words (range)", "a b c", {"N1": None, "N2": None}, "") is True
    with pytest.raises(ValueError, match="dict or a JSON object"):
        aif.clean_kwargs(3)


def test_unknown_identifier_is_reported_not_failed_silently():
    with pytest.raises(KeyError, match="unknown AIF task_identifier 'Haiku'"):
        aif.check("Haiku", "text", {}, "")


def test_sentence_splitter_is_named():
    assert "punkt" in aif.sentence_splitter().lower()
    assert aif.count_sentences("One. Two! Three?") == 3
