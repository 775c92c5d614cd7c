"""The project's LongBench-E-style set: the 13 sets in the official row schema, built offline from one seed.

Writes <cache>/longbench-e-generated-v<GENERATOR_VERSION>/data/<name>_e.jsonl (<cache>: $OSCAR_EVAL_CACHE or
~/.cache/oscar-eval). Each set gets one item per length bucket, sized by LENGTH_WORDS (0-4k, 4-8k, 8k+ words), and
`length` is the honest word count of input + context + answers, so the buckets are the real ones. The prose comes
from the license texts Debian ships in /usr/share/common-licenses (base-files); the questions, facts, dialogues and code
are written here. Every answer can be read off the item: a fact stated in the context (qasper, multifieldqa_en, the
two-hop passages of hotpotqa / 2wikimqa), the count of distinct paragraphs, the paragraph an abstract was cut from, the
next entry of a regular code block, a few-shot pattern; so a real model gets some right, at least in the short
items or with a prompt budget that keeps them whole. Long items are cut in their middle by the task's prompt budget,
which keeps a CPU run of them short (tests set a small one).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any, Callable

from tasks.base import TaskDataError
from tasks.common import COMPLETE_MARKER, ensure_built
from tasks.longbench_e.data import file_name
from tasks.longbench_e.prompts import DATASETS

GENERATOR_VERSION = 1  # bump when the generated content changes
SEED = 20250817
LICENSE_DIR = Path("/usr/share/common-licenses")
LICENSE_FILES = ("GPL-3", "LGPL-2.1", "GFDL-1.3", "MPL-2.0", "Apache-2.0", "CC0-1.0", "Artistic", "GPL-2", "MPL-1.1")
LENGTH_WORDS = ((1200, 2400), (4600, 6000), (8600, 9800))  # one item per bucket: a word budget drawn in each range

PEOPLE = "Alma Bruno Clara Dmitri Elena Farid Greta Hugo Ines Jonas Kira Lars Mona Niko Olga Pavel Rosa Tomas".split()
PLACES = "Arden Belmont Corvin Dunmore Elstow Fairholt Glenrock Harwick Ivydale Kestrel Linmouth Marlow".split()
COUNTIES = "Ashford Brackley Colwood Dorran Easterby Fenwick Greyhaven Hollins".split()
CLASSES = (
    "Abbreviation",
    "Animal",
    "City",
    "Color",
    "Country",
    "Date",
    "Definition of something",
    "Description of a person",
    "Description of something",
    "Event",
    "Individual",
    "Number of something",
    "Reason",
)
TREC_TEMPLATES = (
    ("Abbreviation", "What does the abbreviation {U} stand for ?"),
    ("Animal", "What animal is shown on the flag of {P} ?"),
    ("City", "What city did {N} move to after the {w} ?"),
    ("Color", "What color is the {w} of the old {w2} ?"),
    ("Country", "Which country produced the first {w} ?"),
    ("Date", "When was the {w} of {P} signed ?"),
    ("Definition of something", "What is a {w} ?"),
    ("Description of a person", "Who was {N} ?"),
    ("Description of something", "How does a {w} work ?"),
    ("Event", "What happened in {P} during the {w} ?"),
    ("Individual", "Who wrote the {w} about {P} ?"),
    ("Number of something", "How many {w}s are there in {P} ?"),
    ("Reason", "Why did {N} leave the {w} ?"),
)


def license_paragraphs() -> list[str]:
    """The license texts as paragraphs of 20+ words (whitespace collapsed), in a fixed order."""
    paths = [LICENSE_DIR / name for name in LICENSE_FILES]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise TaskDataError(
            f"the generated LongBench-E set is built from Debian's license texts; missing {missing} (install the "
            "base-files package, or use the official data: --data <folder>)"
        )
    out = []
    for path in paths:
        for block in re.split(r"\n\s*\n", path.read_text(encoding="utf-8", errors="replace")):
            words = block.split()
            if len(words) >= 20:
                out.append(" ".join(words))
    return out


class Source:
    """Seeded draws of prose, words and names for one build."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.paragraphs = license_paragraphs()
        words = {w for p in self.paragraphs for w in re.findall(r"\b[a-z]{5,10}\b", p)}
        self.words = sorted(words)

    def prose(self, n_words: int) -> list[str]:
        """Consecutive paragraphs from a random start (wrapping) until `n_words` words."""
        start, out, count = self.rng.randrange(len(self.paragraphs)), [], 0
        while count < n_words:
            paragraph = self.paragraphs[(start + len(out)) % len(self.paragraphs)]
            out.append(paragraph)
            count += len(paragraph.split())
        return out

    def word(self) -> str:
        return self.rng.choice(self.words)

    def insert(self, paragraphs: list[str], sentence: str) -> list[str]:
        """`sentence` as its own paragraph at a random place."""
        at = self.rng.randrange(len(paragraphs) + 1)
        return paragraphs[:at] + [sentence] + paragraphs[at:]


def _fact_qa(src: Source, words: int) -> dict[str, Any]:
    """A stated fact in prose (qasper, multifieldqa_en): a name, a number, a yes/no or an unanswerable question."""
    name, place, number = src.rng.choice(PEOPLE), src.rng.choice(PLACES), str(src.rng.randint(12, 950))
    kind = src.rng.randrange(4)
    facts = [
        (f"The {src.word()} survey was led by {name} of {place}.", "Who led the survey?", name),
        (f"In total, {number} {src.word()} records were reviewed.", "How many records were reviewed?", number),
        (f"The review committee approved the {src.word()} draft.", "Did the committee approve the draft?", "yes"),
        (f"The {src.word()} notice was sent to {place}.", "What did the board decide about funding?", "unanswerable"),
    ]
    sentence, question, answer = facts[kind]
    context = "\n\n".join(src.insert(src.prose(words), sentence))
    return {"input": question, "context": context, "answers": [answer]}


def _passages(src: Source, words: int, facts: list[tuple[str, str]]) -> str:
    """'Passage k:' blocks of a title and prose, the fact passages among them."""
    blocks = [(src.word().title(), p) for p in src.prose(words)]
    for title, text in facts:
        at = src.rng.randrange(len(blocks) + 1)
        blocks.insert(at, (title, text))
    return "\n".join(f"Passage {k}:\n{title}\n{text}" for k, (title, text) in enumerate(blocks, start=1))


def _hotpot(src: Source, words: int) -> dict[str, Any]:
    person, town, county = src.rng.choice(PEOPLE), src.rng.choice(PLACES), src.rng.choice(COUNTIES)
    facts = [(person, f"{person} was born in {town}."), (town, f"{town} is a town in {county} County.")]
    question = f"In which county was {person} born?"
    return {"input": question, "context": _passages(src, words, facts), "answers": [f"{county} County", county]}


def _wiki2(src: Source, words: int) -> dict[str, Any]:
    a, b = src.rng.sample(PEOPLE, 2)
    ya, yb = src.rng.sample(range(1850, 1990), 2)
    facts = [
        (a, f"{a} (born {ya}) was a writer from {src.rng.choice(PLACES)}."),
        (b, f"{b} (born {yb}) was a painter."),
    ]
    question = f"Who was born first, {a} or {b}?"
    return {"input": question, "context": _passages(src, words, facts), "answers": [a if ya < yb else b]}


def _summary(src: Source, words: int, news: bool) -> dict[str, Any]:
    """A report (news: numbered passages) and a summary made of its paragraphs' first sentences."""
    paragraphs = src.prose(words)
    firsts = [re.split(r"(?<=[.!?])\s+(?=[A-Z])", p)[0] for p in paragraphs]
    firsts = [f for f in firsts if len(f.split()) >= 6 and f.endswith(".")] or firsts
    summary = " ".join(firsts[:: max(1, len(firsts) // 6)][:6])
    if news:
        context = "\n\n".join(f"Passage {k}:\n{p}" for k, p in enumerate(paragraphs, start=1))
        return {"input": "", "context": context, "answers": ["– " + summary]}
    return {"input": "", "context": "\n".join(paragraphs), "answers": [summary]}


def _trec_question(src: Source) -> tuple[str, str]:
    label, template = src.rng.choice(TREC_TEMPLATES)
    fill = {"U": src.word()[:3].upper(), "P": src.rng.choice(PLACES), "N": src.rng.choice(PEOPLE)}
    return label, template.format(w=src.word(), w2=src.word(), **fill)


def _trec(src: Source, words: int) -> dict[str, Any]:
    shots, count = [], 0
    while count < words:
        label, question = _trec_question(src)
        shots.append(f"Question: {question}\nType: {label}\n")
        count += len(shots[-1].split())
    label, question = _trec_question(src)
    return {"input": f"Question: {question}\nType:", "context": "".join(shots), "answers": [label]}


def _trivia_shot(src: Source) -> tuple[str, str, str]:
    paragraph, person, place = src.prose(1)[0], src.rng.choice(PEOPLE), src.rng.choice(PLACES)
    passage = f"{paragraph} The {src.word()} archive of {place} was founded by {person}."
    return passage, f"Who founded the archive of {place}?", person


def _triviaqa(src: Source, words: int) -> dict[str, Any]:
    shots, count = [], 0
    while count < words:
        passage, question, answer = _trivia_shot(src)
        shots.append(f"Passage: {passage}\nQuestion: {question}\nAnswer: {answer}")
        count += len(shots[-1].split())
    passage, question, answer = _trivia_shot(src)
    return {"input": f"Passage: {passage}\nQuestion: {question}\nAnswer:", "context": "\n\n".join(shots),
            "answers": [answer, answer.lower()]}  # fmt: skip


def _dialogue(src: Source) -> tuple[str, str]:
    a, b = src.rng.sample(PEOPLE, 2)
    day = src.rng.choice(("Monday", "Tuesday", "Friday", "Saturday"))
    thing, event = src.word(), src.rng.choice(("party", "meeting", "concert", "match"))
    lines = [f"{a}: Are you coming to the {event} on {day}?", f"{b}: Yes, and I'll bring the {thing}.", f"{a}: Great!"]
    return "\n".join(lines), f"{b} is coming to the {event} on {day} and will bring the {thing}."


def _samsum(src: Source, words: int) -> dict[str, Any]:
    shots, count = [], 0
    while count < words:
        dialogue, summary = _dialogue(src)
        shots.append(f"Dialogue: {dialogue}\nSummary: {summary}")
        count += len(shots[-1].split())
    dialogue, summary = _dialogue(src)
    return {"input": f"Dialogue: {dialogue}\nSummary: ", "context": "\n\n".join(shots), "answers": [summary]}


def _numbered(paragraphs: list[str]) -> str:
    return "\n\n".join(f"Paragraph {k}: {p}" for k, p in enumerate(paragraphs, start=1))


def _passage_count(src: Source, words: int) -> dict[str, Any]:
    unique = src.prose(words * 2 // 3)
    extra = [src.rng.choice(unique) for _ in range(max(1, len(unique) // 2))]
    paragraphs = unique + extra
    src.rng.shuffle(paragraphs)
    return {"input": "", "context": _numbered(paragraphs), "answers": [str(len(set(paragraphs)))]}


def _passage_retrieval(src: Source, words: int) -> dict[str, Any]:
    stream = " ".join(src.prose(words)).split()
    size = len(stream) // 30
    paragraphs = [" ".join(stream[k * size : (k + 1) * size]) for k in range(30)]
    target = src.rng.randrange(30)
    abstract = " ".join(paragraphs[target].split()[: min(40, size)])
    return {"input": abstract, "context": _numbered(paragraphs), "answers": [f"Paragraph {target + 1}"]}


def _code_block(src: Source, n: int) -> list[str]:
    name = f"{src.word()}_{src.word()}"
    return [
        f"def {name}(self, key, default={n}):",
        f'    """{src.prose(1)[0][:70]}"""',
        f"    value = self.{src.word()}.get(key, default)",
        f"    if value > {n * 3}:",
        f"        return value - {n}",
        "    return value",
        "",
    ]


def _code(src: Source, words: int) -> tuple[list[str], list[str], str]:
    """Python source of about `words` words: methods, then a regular table whose next entry is the answer."""
    lines: list[str] = []
    while sum(len(line.split()) for line in lines) < words:
        lines += _code_block(src, src.rng.randint(2, 90))
    keys = [src.word() for _ in range(src.rng.randint(4, 8))]
    table = ["LIMITS = {"] + [f'    "{k}": {10 * (i + 1)},' for i, k in enumerate(keys)]
    answer = f'    "{src.word()}": {10 * (len(keys) + 1)},'
    return lines, table, answer


def _lcc(src: Source, words: int) -> dict[str, Any]:
    lines, table, answer = _code(src, words)
    return {"input": "", "context": "\n".join(["import os", ""] + lines + table) + "\n", "answers": [answer]}


def _repobench(src: Source, words: int) -> dict[str, Any]:
    lines, table, answer = _code(src, words)
    half = len(lines) // 2
    context = "# Path: pkg/helpers.py\n" + "\n".join(lines[:half]) + "\n"
    code = "# Path: pkg/limits.py\nfrom pkg.helpers import *\n\n" + "\n".join(lines[half:] + table) + "\n"
    return {"input": code, "context": context, "answers": [answer]}


MAKERS: dict[str, Callable[[Source, int], dict[str, Any]]] = {
    "qasper": _fact_qa,
    "multifieldqa_en": _fact_qa,
    "hotpotqa": _hotpot,
    "2wikimqa": _wiki2,
    "gov_report": lambda src, words: _summary(src, words, news=False),
    "multi_news": lambda src, words: _summary(src, words, news=True),
    "trec": _trec,
    "triviaqa": _triviaqa,
    "samsum": _samsum,
    "passage_count": _passage_count,
    "passage_retrieval_en": _passage_retrieval,
    "lcc": _lcc,
    "repobench-p": _repobench,
}


def word_length(row: dict[str, Any]) -> int:
    """LongBench's `length` for English and code: words of input, context and answers."""
    return len(row["input"].split()) + len(row["context"].split()) + sum(len(a.split()) for a in row["answers"])


def build(target: Path, seed: int = SEED) -> dict[str, list[dict[str, Any]]]:
    """Write data/<name>_e.jsonl for the 13 sets into `target`; return the rows by set."""
    src = Source(seed)
    (target / "data").mkdir(parents=True, exist_ok=True)
    out = {}
    for name in DATASETS:
        rows = []
        for low, high in LENGTH_WORDS:
            row = MAKERS[name](src, src.rng.randint(low, high) - 60)  # the template and question take some words
            row.update(dataset=name, language="en", all_classes=list(CLASSES) if name == "trec" else None)
            row.update(length=word_length(row), _id=f"gen-{name}-{len(rows)}")
            rows.append(row)
        lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        (target / "data" / file_name(name)).write_text(lines, encoding="utf-8")
        out[name] = rows
    (target / COMPLETE_MARKER).write_text(str(GENERATOR_VERSION))
    return out


def ensure_generated(root: Path | None = None) -> Path:
    """The generated set's folder, built first when missing (tasks.common.ensure_built)."""
    return ensure_built(f"longbench-e-generated-v{GENERATOR_VERSION}", build, root)
