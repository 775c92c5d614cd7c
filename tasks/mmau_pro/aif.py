"""MMAU-Pro instruction following (AIF): rule checks keyed by `task_identifier`, with `kwargs`.

Written after the official evaluator (sonalkum/MMAUPro, evaluate_mmau_pro_comprehensive.py): the
same identifiers, the same counting rules and the same defaults for missing kwargs. Each checker is
    check(response: str, kwargs: dict, question: str) -> bool
and AIF = share of items whose check passes. Sentences are counted with NLTK's English Punkt model
when its data is installed (what the official script downloads), else with an untrained Punkt
tokenizer (same boundary rules, no abbreviation list); `sentence_splitter()` says which, and runs
record it.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, Callable

Checker = Callable[[str, dict, str], bool]


@lru_cache(maxsize=1)
def _sentence_tokenizer() -> tuple[str, Callable[[str], list[str]]]:
    import nltk
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
        return "nltk punkt_tab (english)", nltk.tokenize.sent_tokenize
    except LookupError:
        return "nltk PunktSentenceTokenizer (untrained: punkt_tab data not installed)", PunktSentenceTokenizer().tokenize


def sentence_splitter() -> str:
    """Which sentence splitter `count_sentences` uses here."""
    return _sentence_tokenizer()[0]


def count_words(text: str) -> int:
    return len(text.split())


def count_sentences(text: str) -> int:
    return len(_sentence_tokenizer()[1](text))


def count_paragraphs(text: str) -> int:
    """Paragraphs are separated by ***; empty ones do not count."""
    return sum(1 for p in text.split("***") if p.strip())


def count_bullets(text: str) -> int:
    """Markdown bullets "* " at the start of the text or of a line."""
    return len(re.findall(r"(?:^|\n)\s*\*\s+", text))


def count_highlights(text: str) -> int:
    """*highlighted* spans."""
    return len(re.findall(r"\*([^*]+)\*", text))


def count_placeholders(text: str) -> int:
    """[placeholder] spans."""
    return len(re.findall(r"\[[^\]]+\]", text))


def count_capital_words(text: str) -> int:
    return sum(1 for word in text.split() if word.isupper())


def count_keyword(text: str, keyword: str) -> int:
    """Whole-word, case-insensitive occurrences of `keyword`."""
    return len(re.findall(r"\b" + re.escape(keyword.lower()) + r"\b", text.lower()))


def _letters(text: str, keep_spaces: bool) -> str:
    """Lower-case `text` with everything but ASCII letters (and spaces, if kept) removed."""
    return re.sub(r"[^a-zA-Z ]" if keep_spaces else r"[^a-zA-Z]", "", text).lower()


def _split_list(value: Any) -> list[str]:
    """Officially keywords come as one ", "-separated string; accept a list too."""
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else str(value).split(", ")


def _sections_ok(response: str, kwargs: dict) -> bool:
    pieces = re.split(rf"\s*{re.escape(kwargs.get('section_splitter', ''))}\s*", response.strip())
    return len([p for p in pieces if p.strip()]) == kwargs.get("N", 0)


def _two_responses(response: str) -> bool:
    parts = response.split("******")
    return len(parts) == 2 and parts[0].lower().strip() != parts[1].lower().strip()


def _in_range(n1: str, n2: str, count: Callable[[str], int]) -> Checker:
    return lambda r, k, q: k.get(n1, 0) <= count(r) <= k.get(n2, 999)


CHECKERS: dict[str, Checker] = {
    "Include Keywords": lambda r, k, q: all(w.lower() in r.lower() for w in _split_list(k.get("keywords", ""))),
    "Keyword Frequency": lambda r, k, q: count_keyword(r, k.get("keyword", "")) == k.get("N", 0),
    "Forbidden Words": lambda r, k, q: not any(w.lower() in r.lower() for w in _split_list(k.get("forbidden_words", ""))),
    "Number Paragraphs": lambda r, k, q: count_paragraphs(r) == k.get("N", 0),
    "Number Words (at least)": lambda r, k, q: count_words(r) >= k.get("N", 0),
    "Number Words (at most)": lambda r, k, q: count_words(r) <= k.get("N", 0),
    "Number Words (range)": _in_range("N1", "N2", count_words),
    "Number Sentences (at least)": lambda r, k, q: count_sentences(r) >= k.get("N", 0),
    "Number Sentences (at most)": lambda r, k, q: count_sentences(r) <= k.get("N", 0),
    "Number Sentences (range)": _in_range("N1", "N2", count_sentences),
    "Postscript": lambda r, k, q: _letters(k.get("postscript_marker", ""), False) in _letters(r, False),
    "Number Placeholder": lambda r, k, q: count_placeholders(r) >= k.get("N", 0),
    "Number Bullets": lambda r, k, q: count_bullets(r) == k.get("N", 0),
    "Title": lambda r, k, q: bool(re.search(r"<<[^>]+>>", r)),
    "Minimum Number Highlighted Section": lambda r, k, q: count_highlights(r) >= k.get("N", 0),
    "Multiple Sections": lambda r, k, q: _sections_ok(r, k),
    # The official script compares against the item's question, its "prompt transcription".
    "Repeat Prompt": lambda r, k, q: r.strip().lower().startswith(q.strip().lower()),
    "Two Responses": lambda r, k, q: _two_responses(r),
    "All Uppercase": lambda r, k, q: r.isupper(),
    "All Lowercase": lambda r, k, q: r.islower(),
    "All-capital Words (at least)": lambda r, k, q: count_capital_words(r) >= k.get("N", 0),
    "All-capital Words (at most)": lambda r, k, q: count_capital_words(r) <= k.get("N", 0),
    "All-capital Words (range)": _in_range("N1", "N2", count_capital_words),
    "Start Checker": lambda r, k, q: _letters(r, True).startswith(_letters(k.get("start_phrase", ""), True)),
    "End Checker": lambda r, k, q: _letters(r, True).endswith(_letters(k.get("end_phrase", ""), True)),
    "Quotation": lambda r, k, q: r.strip().startswith('"') and r.strip().endswith('"'),
    "No Commas": lambda r, k, q: "," not in r,
}


def clean_kwargs(kwargs: Any) -> dict[str, Any]:
    """kwargs as a dict: parquet gives a struct (dict with None for absent keys) or a JSON string.
    None values are dropped so the official defaults apply, as when the key is absent."""
    if kwargs is None:
        return {}
    if isinstance(kwargs, str):
        kwargs = json.loads(kwargs) if kwargs.strip() else {}
    if not isinstance(kwargs, dict):
        raise ValueError(f"AIF kwargs must be a dict or a JSON object string, got {type(kwargs).__name__}")
    return {k: v for k, v in kwargs.items() if v is not None}


def check(task_identifier: str, response: str, kwargs: Any, question: str) -> bool:
    """Whether `response` follows the instruction `task_identifier` with `kwargs`.

    Raises KeyError for an identifier the official evaluator does not know (it would silently count
    a failure; we report it so a data or typo problem shows).
    """
    if task_identifier not in CHECKERS:
        raise KeyError(f"unknown AIF task_identifier {task_identifier!r}; known: {sorted(CHECKERS)}")
    return bool(CHECKERS[task_identifier](response, clean_kwargs(kwargs), question))
