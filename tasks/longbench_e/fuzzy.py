"""`fuzz.ratio` of fuzzywuzzy 0.18.0, the similarity LongBench's code_sim_score takes, with either of its two matchers.

fuzzywuzzy picks its matcher when it is imported: python-Levenshtein's ratio when that package imports, else the
stdlib's difflib.SequenceMatcher. The two disagree on about one partial match in five, and neither LongBench
(requirements.txt: plain `fuzzywuzzy`) nor the OScaR repository (`fuzzywuzzy[speedup]`, i.e. with Levenshtein)
says which one made a published number, so the backend is a task setting that every result records.

- "difflib": `SequenceMatcher(None, a, b).ratio()` of the stdlib, exactly what fuzzywuzzy calls (Ratcliff-Obershelp
  matching blocks, with difflib's automatic junk heuristic for a second string of 200 characters or more).
- "levenshtein": python-Levenshtein's `ratio`, the normalized Indel similarity 1 - (insertions + deletions) /
  (len(a) + len(b)); the Indel distance is len(a) + len(b) - 2 * LCS(a, b), the LCS found here with a bit-parallel
  scan (one big-integer step per character of b) whose plain dynamic-programming reference is in the tests.

Both then go through fuzzywuzzy's guards: 100 for equal strings ("" and "" too), 0 when one is empty, else
int(round(100 * ratio)) (Python's round: halves go to the even integer).
"""

from __future__ import annotations

from difflib import SequenceMatcher

BACKENDS = ("difflib", "levenshtein")
DEFAULT_BACKEND = "difflib"


def lcs_length(a: str, b: str) -> int:
    """Length of the longest common subsequence of `a` and `b` (Hyyrö's bit-vector form: bit i of `v` is 0 where
    position i of `a` ends a new LCS element; each character of `b` updates all positions at once)."""
    if not a or not b:
        return 0
    masks: dict[str, int] = {}
    for i, ch in enumerate(a):
        masks[ch] = masks.get(ch, 0) | (1 << i)
    full = (1 << len(a)) - 1
    v = full
    for ch in b:
        u = v & masks.get(ch, 0)
        v = ((v + u) | (v - u)) & full
    return len(a) - bin(v).count("1")


def indel_ratio(a: str, b: str) -> float:
    """python-Levenshtein's ratio (rapidfuzz's Indel.normalized_similarity), the same float expression:
    1.0 - distance / (len(a) + len(b))."""
    total = len(a) + len(b)
    if total == 0:
        return 1.0
    distance = total - 2 * lcs_length(a, b)
    return 1.0 - distance / total


def difflib_ratio(a: str, b: str) -> float:
    return SequenceMatcher(None, a, b).ratio()


def ratio(a: str, b: str, backend: str = DEFAULT_BACKEND) -> int:
    """fuzzywuzzy 0.18.0's `fuzz.ratio(a, b)` (0..100) with the given matcher."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown fuzzy backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if a is None or b is None:
        return 0
    if a == b:
        return 100
    if not a or not b:
        return 0
    r = difflib_ratio(a, b) if backend == "difflib" else indel_ratio(a, b)
    return int(round(100 * r))
