"""MMAU-Pro scoring, after the official evaluator (sonalkum/MMAUPro, evaluate_mmau_pro_comprehensive.py).

Three kinds of item, told apart by `category`:
- "open": an LLM judge rates the answer; `judge_prompt` and `parse_judge_scores` follow the
  official prompt and parsing. Open-ended = mean OVERALL / 5 x 100; Good Rate = share (x100) of
  items with OVERALL >= 4.
- "instruction following": rule checks (tasks.mmau_pro.aif); AIF = share passed x 100.
- any other category with more than one choice (closed form): the answer and the choices are
  embedded and L2-normalized, the most similar choice (cosine x 100, first on ties) is the model's
  pick, correct when it equals `answer`. A bare option letter ("B", "(B)", "B.") is first replaced by
  that option's text, since a lone letter embeds close to nothing. Accuracy per category x 100.
- overall = item-count-weighted mean of the category scores (open: mean OVERALL / 5), x 100.
Items that failed (records with "error") are left out of every mean and counted in n_errors.
All functions here are pure.
"""
from __future__ import annotations

import json
import re
from typing import Any, Sequence

OPEN = "open"
AIF = "instruction following"
JUDGE_SYSTEM = "You are a helpful and objective evaluator."
CRITERIA = ("correctness", "relevance", "completeness", "clarity")
NEUTRAL = 3.0  # the official score for a criterion the judge did not give
GOOD = 4.0  # OVERALL at or above this counts as a good answer

# The official script passes task_type "open" for every open item, hence this context.
_JUDGE_TEMPLATE = """You are an expert evaluator for general open-ended question answering tasks. Please evaluate the quality of a model's response to a question.

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
RELEVANCE: [score] - [justification] 
COMPLETENESS: [score] - [justification]
CLARITY: [score] - [justification]
OVERALL: [average score] - [overall assessment]"""


def kind(item: dict[str, Any]) -> str:
    """"open", "aif" or "closed" (closed needs more than one choice, as officially)."""
    if item["category"] == OPEN:
        return "open"
    if item["category"] == AIF:
        return "aif"
    if len(item.get("choices") or []) > 1:
        return "closed"
    return "unscorable"  # the official script drops these; the task reports them as errors


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
_LETTER = re.compile(r"^\s*(?:(?i:the\s+)?(?i:answer)(?i:\s+is)?\s*[:\-]?\s*)?(?:\(([A-Z])\)|([A-Z])(?:[.):](?=\s|$)|\s*$))")


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
    """Index of the most similar choice; the first one on ties, like torch.argmax."""
    best = 0
    for i, s in enumerate(similarities):
        if s > similarities[best]:
            best = i
    return best


def _category_summary(kind_name: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Score (0-100) and counts of one category's scored records."""
    n = len(records)
    if kind_name == "open":
        overall = [r["scores"]["overall"] for r in records]
        mean = sum(overall) / n
        return {"type": "open", "n": n, "score": mean / 5 * 100, "open_ended": mean / 5 * 100,
                "avg_overall": mean, "good_rate": 100 * sum(o >= GOOD for o in overall) / n}
    passed = sum(r["scores"]["correct" if kind_name == "closed" else "passed"] for r in records)
    return {"type": kind_name, "n": n, "score": 100 * passed / n}


def aggregate(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Records -> {"metrics": {...}, "categories": {category: {...}}, "scorers": [...]}.

    metrics: open_ended, good_rate, aif, closed (accuracy over all closed items), overall (weighted
    as officially), all 0-100 or None when no item of that kind was scored; n, n_errors.
    """
    by_category: dict[str, list[dict[str, Any]]] = {}
    errors: dict[str, int] = {}
    for r in records:
        if "error" in r:
            errors[r.get("category", "?")] = errors.get(r.get("category", "?"), 0) + 1
        else:
            by_category.setdefault(r["category"], []).append(r)
    categories = {c: _category_summary(rs[0]["kind"], rs) for c, rs in sorted(by_category.items())}
    for c, n_err in errors.items():
        categories.setdefault(c, {"type": None, "n": 0, "score": None})["n_errors"] = n_err
    for c in categories:
        categories[c].setdefault("n_errors", 0)
    scored = [c for c in categories.values() if c["n"]]
    closed = [r for rs in by_category.values() for r in rs if r["kind"] == "closed"]
    open_cat = categories.get(OPEN, {})
    metrics = {
        "open_ended": open_cat.get("open_ended"),
        "good_rate": open_cat.get("good_rate"),
        "aif": categories.get(AIF, {}).get("score"),
        "closed": 100 * sum(r["scores"]["correct"] for r in closed) / len(closed) if closed else None,
        "overall": sum(c["score"] * c["n"] for c in scored) / sum(c["n"] for c in scored) if scored else None,
        "n": len(records),
        "n_errors": sum(errors.values()),
    }
    scorers = sorted({json.dumps(r.get("scorer", {}), sort_keys=True) for rs in by_category.values() for r in rs})
    return {"metrics": metrics, "categories": categories, "scorers": [json.loads(s) for s in scorers]}

