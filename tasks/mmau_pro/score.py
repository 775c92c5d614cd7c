"""MMAU-Pro scoring, as the official evaluator (sonalkum/MMAUPro, evaluate_mmau_pro_comprehensive.py).

Three kinds of item, told apart by `category`:
- "open": an LLM judge rates the answer; `judge_prompt` and `parse_judge_scores` follow the
  official prompt and parsing. Open-ended = mean OVERALL / 5 x 100; Good Rate = share (x100) of
  items with OVERALL >= 4.
- "instruction following": rule checks (tasks.mmau_pro.aif); AIF = share passed x 100.
- any other category with more than one choice (closed form): the raw answer and the choices are
  embedded and L2-normalized, the most similar choice (cosine x 100, first on ties) is the model's
  pick, correct when it equals `answer`. Accuracy per category x 100. Closed items with fewer than
  two choices are left out of every number, as officially ("excluded" records).
- overall = item-count-weighted mean of the category scores (open: mean OVERALL / 5), x 100.
Every other row counts: an item whose answer is missing (audio or generation failed) is scored as
the official script scores a missing answer, "" for open and closed items and str(None) = "None"
for AIF (`standin`), and counted among the failures of its category.

One metric of ours sits beside the official ones, under its own name: `closed_letters_mapped` /
`overall_letters_mapped`, where a leading option label ("B", "(B)", "Answer: B") is replaced by that
option's text before embedding (`map_letter`). RULES says which rule produced each metric.
All functions here are pure.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Sequence

OPEN = "open"
AIF = "instruction following"
JUDGE_SYSTEM = "You are a helpful and objective evaluator."
CRITERIA = ("correctness", "relevance", "completeness", "clarity")
NEUTRAL = 3.0  # the official score for a criterion the judge did not give
GOOD = 4.0  # OVERALL at or above this counts as a good answer

# The official script passes task_type "open" for every open item, hence this context. Verbatim: the first line is
# one line there (joined here by the backslash), and RELEVANCE's line ends in a space there (written \x20).
_JUDGE_TEMPLATE = """You are an expert evaluator for general open-ended question answering tasks. \
Please evaluate the quality of a model's response to a question.

Question: {question}

Reference Answer: {reference}

Model Response: {response}

Please evaluate the model response on the following criteria and provide scores from 1-5 (where 5 is best):

1. **Correctness**: How factually accurate is the response compared to the reference?
2. **Relevance**: How well does the response address the specific question asked?
3. **Completeness**: Does the response cover all important aspects mentioned in the reference?
4. **Clarity**: How clear and well-structured is the response?

For each criterion, provide:
- A score from 1-5
- A brief justification (1-2 sentences)

Format your response as:

CORRECTNESS: [score] - [justification]
RELEVANCE: [score] - [justification]\x20
COMPLETENESS: [score] - [justification]
CLARITY: [score] - [justification]
OVERALL: [average score] - [overall assessment]"""


OFFICIAL_RULE = "official (sonalkum/MMAUPro evaluate_mmau_pro_comprehensive.py at bf12804)"
LETTERS_RULE = "ours, not official: a leading option label is replaced by that option's text before embedding"
RULES = {
    "open_ended": f"{OFFICIAL_RULE}: mean judge OVERALL / 5 x 100 over every open item, a missing answer judged as ''",
    "good_rate": f"{OFFICIAL_RULE}: share x 100 of open items with OVERALL >= 4",
    "aif": f"{OFFICIAL_RULE}: share x 100 of AIF items passing their check, a missing answer checked as 'None', "
    "an unknown task_identifier failing, None kwargs passed through; sentences by NLTK English punkt_tab",
    "closed": f"{OFFICIAL_RULE}: accuracy x 100 over closed items, the raw answer (a missing one as '') embedded "
    "against the choices, most similar choice picked",
    "overall": f"{OFFICIAL_RULE}: item-count-weighted mean of the category scores x 100",
    "closed_letters_mapped": f"{LETTERS_RULE}; otherwise as closed",
    "overall_letters_mapped": f"{LETTERS_RULE}; otherwise as overall",
}


def kind(item: dict[str, Any]) -> str:
    """ "open", "aif" or "closed" (closed needs more than one choice, as officially)."""
    if item["category"] == OPEN:
        return "open"
    if item["category"] == AIF:
        return "aif"
    if len(item.get("choices") or []) > 1:
        return "closed"
    return "excluded"  # the official script leaves these out of every number


def standin(item_kind: str) -> str:
    """What the official script scores for a missing answer: fillna("") for open and closed items,
    str(None) for AIF (it reads the row's answer with str())."""
    return str(None) if item_kind == "aif" else ""


def judge_prompt(question: str, reference: str, response: str) -> str:
    """The user message the judge sees (the official wording)."""
    return _JUDGE_TEMPLATE.format(question=question, reference=reference, response=response)


def parse_judge_scores(text: str) -> dict[str, float]:
    """Scores from the judge's text, by the official rules.

    Each criterion is the first integer after "NAME:" (case-insensitive), OVERALL may be a decimal;
    a missing one counts NEUTRAL (3.0). When OVERALL is missing or exactly 3.0 it is replaced by the
    mean of the four criteria.
    """
    scores: dict[str, float] = {}
    for name in CRITERIA:
        match = re.search(rf"{name.upper()}:\s*(\d+)", text, re.IGNORECASE)
        scores[name] = float(match.group(1)) if match else NEUTRAL
    match = re.search(r"OVERALL:\s*(\d+(?:\.\d+)?)", text, re.IGNORECASE)
    scores["overall"] = float(match.group(1)) if match else NEUTRAL
    if scores["overall"] == NEUTRAL:
        scores["overall"] = sum(scores[c] for c in CRITERIA) / len(CRITERIA)
    return scores


# An option label at the start: "B", "B.", "B)", "B:", "(B)", optionally after "Answer:" / "answer is".
# The letter must be upper case and followed by punctuation or the end, so "A dog barks" is prose.
_LETTER = re.compile(
    r"^\s*(?:(?i:the\s+)?(?i:answer)(?i:\s+is)?\s*[:\-]?\s*)?"
    r"(?:\(([A-Z])\)|([A-Z])(?:[.):](?=\s|$)|\s*$))"
)


def map_letter(prediction: str, choices: Sequence[str]) -> tuple[str, int | None]:
    """(text to embed, option index or None): a prediction that opens with an option label of an
    existing option is replaced by that option's text; anything else is embedded as it is."""
    match = _LETTER.match(prediction)
    if not match:
        return prediction, None
    index = ord(match.group(1) or match.group(2)) - ord("A")
    if index >= len(choices):
        return prediction, None
    return str(choices[index]), index


def pick_choice(similarities: Sequence[float]) -> int:
    """Index of the most similar choice; the first one on ties, like torch.argmax. A NaN or infinite
    similarity raises ValueError (torch.argmax would pick a NaN: a broken embedding, not an answer)."""
    if not all(math.isfinite(s) for s in similarities):
        raise ValueError(f"similarities {list(similarities)} are not all finite")
    best = 0
    for i, s in enumerate(similarities):
        if s > similarities[best]:
            best = i
    return best


def _category_summary(kind_name: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Score (0-100), counts and failure counts of one category's scored records."""
    n = len(records)
    out: dict[str, Any] = {"type": kind_name, "n": n}
    if kind_name == "open":
        overall = [r["scores"]["overall"] for r in records]
        mean = sum(overall) / n
        out.update(
            score=mean / 5 * 100,
            open_ended=mean / 5 * 100,
            avg_overall=mean,
            good_rate=100 * sum(o >= GOOD for o in overall) / n,
        )
    elif kind_name == "aif":
        out["score"] = 100 * sum(r["scores"]["passed"] for r in records) / n
        out["n_noted"] = sum(1 for r in records if r.get("note"))  # unknown identifier, check raised
    else:
        out["score"] = 100 * sum(r["scores"]["correct"] for r in records) / n
        out["score_letters_mapped"] = 100 * sum(r["scores"]["correct_letters_mapped"] for r in records) / n
    failed = [r for r in records if "error" in r]
    out["n_failed"] = len(failed)
    for r in failed:
        key = f"n_failed_{r.get('failure', 'other')}"
        out[key] = out.get(key, 0) + 1
    return out


def _weighted(categories: dict[str, dict[str, Any]], closed_key: str) -> float | None:
    """Item-count-weighted mean of the category scores; closed categories read `closed_key`."""
    scored = [c for c in categories.values() if c.get("n")]
    if not scored:
        return None
    total = sum((c[closed_key] if c["type"] == "closed" else c["score"]) * c["n"] for c in scored)
    return total / sum(c["n"] for c in scored)


def aggregate(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Records -> {"metrics": {...}, "categories": {category: {...}}, "scorers": [...], "rules": RULES}.

    metrics: open_ended, good_rate, aif, closed, overall (official), closed_letters_mapped and
    overall_letters_mapped (ours), all 0-100 or None when no item of that kind was scored; n (records),
    n_errors (failed items, scored with the official stand-in answer). categories[c]: type, n (items
    scored), score, n_failed and n_failed_<why>, n_excluded, and per type open_ended / good_rate /
    avg_overall, n_noted (AIF), score_letters_mapped (closed).
    """
    by_category: dict[str, list[dict[str, Any]]] = {}
    excluded: dict[str, int] = {}
    unscored = 0
    for r in records:
        if r.get("kind") == "excluded":
            excluded[r["category"]] = excluded.get(r["category"], 0) + 1
        elif r.get("unscored"):  # a random-weight model's closed / open answer (MMAUProTask.model_scoring)
            unscored += 1
        elif "scores" not in r:
            raise ValueError(
                f"MMAU-Pro record {r.get('id')!r} has no scores; every row is scored officially "
                "(re-score old results with python -m harness.rescore)"
            )
        else:
            by_category.setdefault(r["category"], []).append(r)
    categories = {c: _category_summary(rs[0]["kind"], rs) for c, rs in sorted(by_category.items())}
    for c, n in excluded.items():
        categories.setdefault(c, {"type": "closed", "n": 0, "score": None, "n_failed": 0})["n_excluded"] = n
    for c in categories.values():
        c.setdefault("n_excluded", 0)
    closed = [r for rs in by_category.values() for r in rs if r["kind"] == "closed"]
    open_cat = categories.get(OPEN, {})

    def closed_share(key: str) -> float | None:
        return 100 * sum(r["scores"][key] for r in closed) / len(closed) if closed else None

    metrics = {
        "open_ended": open_cat.get("open_ended"),
        "good_rate": open_cat.get("good_rate"),
        "aif": categories.get(AIF, {}).get("score"),
        "closed": closed_share("correct"),
        "overall": _weighted(categories, "score"),
        "closed_letters_mapped": closed_share("correct_letters_mapped"),
        "overall_letters_mapped": _weighted(categories, "score_letters_mapped"),
        "n": len(records),
        "n_errors": sum(1 for r in records if "error" in r),
        "n_unscored": unscored,
    }
    if unscored:  # the official weighting over every category cannot be formed without them
        metrics["overall"] = metrics["overall_letters_mapped"] = None
    scorers = sorted({json.dumps(r.get("scorer", {}), sort_keys=True) for rs in by_category.values() for r in rs})
    return {"metrics": metrics, "categories": categories, "scorers": [json.loads(s) for s in scorers], "rules": RULES}
