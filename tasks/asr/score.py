"""Scoring speech recognition as the Open ASR Leaderboard does: Whisper's English text normaliser on both sides, then
word-level edit distance, summed over the corpus.

Normaliser: transformers' `EnglishTextNormalizer` (transformers.models.whisper.english_normalizer: lower case,
brackets and fillers dropped, contractions and titles expanded, numbers written as digits, British spellings mapped
to American) given Whisper's English spelling map, `english.json`. That map is data this project does not ship: it is
read from an installed distribution that carries it (`SPELLING_SOURCES`: openai-whisper, installed without its
dependencies by `make setup`, else the copy inside lmms-eval), never imported as code.

WER: word errors (substitutions + deletions + insertions of the minimal alignment) over reference words, both after
normalisation; the corpus WER sums errors and reference words over the items before dividing (a long utterance weighs
more than a short one), in percent.
"""

from __future__ import annotations

import hashlib
import json
import math
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

from tasks.base import TaskNotReady

# (distribution, file inside it) holding Whisper's English spelling map, in order of preference.
SPELLING_SOURCES = (
    ("openai-whisper", "whisper/normalizers/english.json"),
    ("lmms-eval", "lmms_eval/tasks/librispeech/whisper_normalizer/english.json"),
)
INSTALL_SPELLING = "pip install --no-deps openai-whisper==20250625 (make setup does)"


def spelling_map_file() -> tuple[Path, str] | None:
    """(path of english.json, "distribution version") from the first installed SPELLING_SOURCES entry, or None."""
    for dist_name, rel in SPELLING_SOURCES:
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            continue
        path = Path(str(dist.locate_file(rel)))
        if path.is_file():
            return path, f"{dist_name} {dist.version}"
    return None


def check_normalizer() -> None:
    """TaskNotReady naming the install command when Whisper's spelling map is not installed."""
    if spelling_map_file() is None:
        wanted = " or ".join(f"{d} ({rel})" for d, rel in SPELLING_SOURCES)
        raise TaskNotReady(
            f"asr scores with Whisper's English normaliser, whose spelling map {wanted} is not "
            f"installed; {INSTALL_SPELLING}"
        )


@lru_cache(maxsize=1)
def _normalizer():
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    check_normalizer()
    path, _ = spelling_map_file()
    return EnglishTextNormalizer(json.loads(path.read_text(encoding="utf-8")))


def normalizer_info() -> dict[str, Any]:
    """Where the normaliser's rules and spelling map come from (recorded in a result's settings)."""
    import transformers

    found = spelling_map_file()
    info: dict[str, Any] = {"rules": f"transformers {transformers.__version__} EnglishTextNormalizer"}
    if found:
        path, source = found
        info["spelling_map"] = source
        info["spelling_map_sha1"] = hashlib.sha1(path.read_bytes()).hexdigest()
    else:
        info["spelling_map"] = None
    return info


def normalize(text: str) -> str:
    """Whisper's English normalisation of `text` (TaskNotReady when the spelling map is missing)."""
    return _normalizer()(text)


def word_errors(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    """Minimum substitutions + deletions + insertions turning `reference` into `hypothesis` (Levenshtein over words),
    computed row by row in O(len(reference) * len(hypothesis)) time and O(len(hypothesis)) memory."""
    previous = list(range(len(hypothesis) + 1))  # distance from an empty reference prefix: insert every word
    for i, ref_word in enumerate(reference, 1):
        current = [i]  # delete the first i reference words
        for j, hyp_word in enumerate(hypothesis, 1):
            substitute = previous[j - 1] + (ref_word != hyp_word)
            current.append(min(substitute, previous[j] + 1, current[j - 1] + 1))
        previous = current
    return previous[-1]


def score_transcript(reference: str, prediction: str) -> dict[str, Any]:
    """{"errors", "words", "wer" (percent, None for a reference with no words after normalisation), and both
    normalised texts} of one item."""
    ref, hyp = normalize(reference), normalize(prediction)
    ref_words, hyp_words = ref.split(), hyp.split()
    errors = word_errors(ref_words, hyp_words)
    wer = 100.0 * errors / len(ref_words) if ref_words else None
    return {
        "errors": errors,
        "words": len(ref_words),
        "wer": wer,
        "reference_normalized": ref,
        "prediction_normalized": hyp,
    }


def _summary(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Corpus WER (percent) and NLL per reference token of scored records."""
    errors = sum(r["scores"]["errors"] for r in records)
    words = sum(r["scores"]["words"] for r in records)
    nll = sum(r["scores"]["nll_sum"] for r in records)
    tokens = sum(r["scores"]["n_tokens"] for r in records)
    return {
        "wer": 100.0 * errors / words if words else math.nan,
        "nll": nll / tokens if tokens else math.nan,
        "tokens": tokens,
    }


def aggregate(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """{"metrics": {"wer", "nll", "tokens", "n", "failed"}, "categories": {category: {"wer", "nll", "n"}}}.

    wer: corpus WER in percent over the scored items; nll: mean negative log-likelihood per reference token of the
    teacher-forced references. Failed items (no transcript or no likelihood) are counted in "failed" and left out,
    as perplexity leaves out a failed window; items whose reference normalises to no words are left out too. Cheap:
    it only sums the per-item counts, so the harness' bootstrap can call it on every resample."""
    ok = [r for r in records if "error" not in r]
    # The Open ASR Leaderboard drops an utterance whose reference normalises to nothing ("hmm", "<noise>"): every
    # word of its hypothesis would count as an insertion against no reference. Counted in "empty_references".
    scored = [r for r in ok if r["scores"]["words"] > 0]
    metrics = {
        **_summary(scored),
        "n": len(records),
        "failed": len(records) - len(ok),
        "empty_references": len(ok) - len(scored),
    }
    by_category: dict[str, list[dict[str, Any]]] = {}
    for r in scored:
        if r.get("category"):
            by_category.setdefault(r["category"], []).append(r)
    categories = {}
    for name, rs in sorted(by_category.items()):
        summary = _summary(rs)
        categories[name] = {"wer": summary["wer"], "nll": summary["nll"], "n": len(rs)}
    return {"metrics": metrics, "categories": categories}
