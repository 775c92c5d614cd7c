"""Confidence intervals and paired significance tests over per-item records.

Every metric of a task is a function `statistic(records) -> float` (the task's own `aggregate`), so
one resampling scheme serves all of them: perplexity exp(sum nll / sum tokens), OCRBench's summed
points, MMAU-Pro's count-weighted category means.

- `bootstrap_ci`: percentile bootstrap over items. Draw B index vectors of length n with replacement,
  evaluate the statistic on each resample, report the alpha/2 and 1 - alpha/2 quantiles.
- `paired_bootstrap`: the same draws applied to both runs at once (items matched by id), giving the
  distribution of delta = stat(B) - stat(A); two-sided p = min(1, 2 * min(P*(delta <= 0), P*(delta >= 0)))
  with P* the bootstrap share (+1 smoothing so p is never 0).
- `mcnemar_exact`: for 0/1 scores. With b = #(A right, B wrong) and c = #(A wrong, B right), under H0
  the discordant pairs split Binomial(b + c, 1/2); p = min(1, 2 * P[X <= min(b, c)]).
- `bootstrap_cis_clustered`: the percentile bootstrap over clusters of items (a record's `cluster`: OCRBench's
  source dataset, an MMAU-Pro audio clip, a NIAH haystack). Items of one cluster are not independent draws; drawing
  whole clusters with replacement (all their items each time) keeps that dependence in the interval. With every item
  its own cluster it is `bootstrap_cis` itself (the same draws).
- `token_agreement`: how often two runs of the same items generated the same tokens, and where they first differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

Statistic = Callable[[Sequence], float]
DEFAULT_RESAMPLES = 1000
DEFAULT_ALPHA = 0.05


def ci_method_text(n_resamples: int = DEFAULT_RESAMPLES, alpha: float = DEFAULT_ALPHA) -> str:
    return f"percentile bootstrap over items, {n_resamples} resamples, {100 * (1 - alpha):g}%"


def _resample_indices(n: int, n_resamples: int, seed: int) -> np.ndarray:
    """[n_resamples, n] int indices drawn with replacement from a seeded generator."""
    return np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))


def _finite(values: list[float | None]) -> np.ndarray:
    arr = np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    return arr[np.isfinite(arr)]


def bootstrap_ci(
    items: Sequence,
    statistic: Statistic,
    n_resamples: int = DEFAULT_RESAMPLES,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
) -> tuple[float | None, float | None]:
    """(low, high) percentile interval of `statistic` over item resamples; (None, None) if n < 2."""
    return bootstrap_cis(items, lambda xs: {"x": statistic(xs)}, n_resamples, alpha, seed)["x"]


def bootstrap_cis(
    items: Sequence,
    statistics: Callable[[Sequence], dict[str, float | None]],
    n_resamples: int = DEFAULT_RESAMPLES,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
) -> dict[str, tuple[float | None, float | None]]:
    """Intervals for several statistics computed together on each resample (one `aggregate` call each).

    `statistics(items)` returns {name: value}; the names of the full-sample call are the keys of the
    answer. Resamples on which a statistic is undefined (None / NaN) are dropped for that statistic.
    """
    names = list(statistics(items))
    if len(items) < 2:
        return {name: (None, None) for name in names}
    draws: dict[str, list[float | None]] = {name: [] for name in names}
    for idx in _resample_indices(len(items), n_resamples, seed):
        values = statistics([items[i] for i in idx])
        for name in names:
            draws[name].append(values.get(name))
    return _percentiles(draws, alpha)


def _percentiles(draws: dict[str, list[float | None]], alpha: float) -> dict[str, tuple[float | None, float | None]]:
    """(alpha/2, 1 - alpha/2) quantiles of each statistic's finite draws; (None, None) where none is finite."""
    out = {}
    for name, drawn in draws.items():
        values = _finite(drawn)
        if values.size == 0:
            out[name] = (None, None)
            continue
        low, high = np.quantile(values, [alpha / 2, 1 - alpha / 2])
        out[name] = (float(low), float(high))
    return out


def ci_method_clustered_text(
    n_clusters: int, n_resamples: int = DEFAULT_RESAMPLES, alpha: float = DEFAULT_ALPHA
) -> str:
    return f"percentile bootstrap over {n_clusters} clusters of items, {n_resamples} resamples, {100 * (1 - alpha):g}%"


def clusters_of(records: Sequence) -> list | None:
    """Each record's cluster (its `cluster` field; a record without one is a cluster of its own), or None when no
    record has one."""
    if not any(isinstance(r, dict) and r.get("cluster") is not None for r in records):
        return None
    return [r["cluster"] if r.get("cluster") is not None else ("item", i) for i, r in enumerate(records)]


def bootstrap_cis_clustered(
    items: Sequence,
    clusters: Sequence,
    statistics: Callable[[Sequence], dict[str, float | None]],
    n_resamples: int = DEFAULT_RESAMPLES,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
) -> dict[str, tuple[float | None, float | None]]:
    """`bootstrap_cis` drawing clusters instead of items: each resample draws as many clusters as there are, with
    replacement, and holds every item of each drawn cluster (clusters in order of first appearance, so singleton
    clusters in item order draw exactly the items `bootstrap_cis` draws). (None, None) with fewer than 2 clusters:
    one cluster says nothing of the spread between clusters."""
    if len(clusters) != len(items):
        raise ValueError(f"{len(clusters)} clusters for {len(items)} items")
    members: dict = {}
    for i, c in enumerate(clusters):
        members.setdefault(c, []).append(i)
    groups = list(members.values())
    names = list(statistics(items))
    if len(groups) < 2:
        return {name: (None, None) for name in names}
    draws: dict[str, list[float | None]] = {name: [] for name in names}
    for idx in _resample_indices(len(groups), n_resamples, seed):
        values = statistics([items[i] for g in idx for i in groups[g]])
        for name in names:
            draws[name].append(values.get(name))
    return _percentiles(draws, alpha)


@dataclass(frozen=True)
class PairedResult:
    """delta = stat(B) - stat(A) on the matched items, with its bootstrap interval and p-value."""

    delta: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    n: int


def paired_bootstrap(
    items_a: Sequence,
    items_b: Sequence,
    statistic: Statistic,
    n_resamples: int = DEFAULT_RESAMPLES,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
) -> PairedResult:
    """Paired bootstrap of stat(B) - stat(A); items_a[i] and items_b[i] must be the same item."""
    if len(items_a) != len(items_b):
        raise ValueError(f"paired samples differ in length: {len(items_a)} vs {len(items_b)}")
    n = len(items_a)
    delta = _delta(statistic, items_a, items_b)
    if n < 2 or delta is None:
        return PairedResult(delta, None, None, None, n)
    draws = []
    for idx in _resample_indices(n, n_resamples, seed):
        draws.append(_delta(statistic, [items_a[i] for i in idx], [items_b[i] for i in idx]))
    values = _finite(draws)
    if values.size == 0:
        return PairedResult(delta, None, None, None, n)
    low, high = np.quantile(values, [alpha / 2, 1 - alpha / 2])
    # +1 smoothing: a bootstrap with B draws cannot show p below 1 / (B + 1).
    below = (np.sum(values <= 0) + 1) / (values.size + 1)
    above = (np.sum(values >= 0) + 1) / (values.size + 1)
    return PairedResult(delta, float(low), float(high), float(min(1.0, 2 * min(below, above))), n)


def _delta(statistic: Statistic, a: Sequence, b: Sequence) -> float | None:
    sa, sb = statistic(a), statistic(b)
    if sa is None or sb is None or not (math.isfinite(sa) and math.isfinite(sb)):
        return None
    return float(sb) - float(sa)


@dataclass(frozen=True)
class McNemarResult:
    """b = A right & B wrong, c = A wrong & B right; exact two-sided binomial p-value."""

    b: int
    c: int
    p_value: float


def mcnemar_exact(scores_a: Sequence[float], scores_b: Sequence[float]) -> McNemarResult:
    """Exact McNemar test on paired 0/1 scores (any value > 0.5 counts as right)."""
    if len(scores_a) != len(scores_b):
        raise ValueError(f"paired samples differ in length: {len(scores_a)} vs {len(scores_b)}")
    right_a = np.asarray(scores_a, dtype=np.float64) > 0.5
    right_b = np.asarray(scores_b, dtype=np.float64) > 0.5
    b = int(np.sum(right_a & ~right_b))
    c = int(np.sum(~right_a & right_b))
    m = b + c
    if m == 0:
        return McNemarResult(b, c, 1.0)
    # P[X <= k] for X ~ Binomial(m, 1/2), summed exactly with integers.
    tail = sum(math.comb(m, i) for i in range(min(b, c) + 1)) / 2**m
    return McNemarResult(b, c, min(1.0, 2 * tail))


def is_binary(values: Sequence[float | None]) -> bool:
    """True when every non-missing value is 0 or 1 (and there is at least one)."""
    seen = [v for v in values if v is not None]
    return bool(seen) and all(v in (0, 1, 0.0, 1.0, True, False) for v in seen)


# ---------------------------------------------------------------- agreement of generated tokens


def _requests_tokens(tokens) -> list[list[int]]:
    """A record's `tokens` as one list per request (a record of one request holds a flat list)."""
    if tokens and isinstance(tokens[0], list):
        return tokens
    return [list(tokens)]


def first_divergence(a, b) -> int | None:
    """The number of the first generated token (1 = the first) where two records' tokens differ, over their requests
    in order (a request's count starts at 1 again); where one answer is the other's beginning, the token after the
    shorter one's end. None when they are equal."""
    ra, rb = _requests_tokens(a), _requests_tokens(b)
    for x, y in zip(ra, rb):
        if x != y:
            n = min(len(x), len(y))
            return next((i + 1 for i in range(n) if x[i] != y[i]), n + 1)
    return None if len(ra) == len(rb) else 1


def token_agreement(reference: Sequence[dict], other: Sequence[dict]) -> dict | None:
    """How `other`'s generated tokens agree with `reference`'s over the items both ran without error (matched by id).

    {"n": items compared, "same": items with equal tokens, "share": same / n, "diverged": n - same, "mean_first":
    the mean of `first_divergence` over the diverged items (None when none diverged or a record lacks `tokens`),
    "by": "tokens" or "tokens_sha1"}. Records without `tokens` (older results) are compared by `tokens_sha1`, which
    gives the share but no step. None when no item has either."""
    theirs = {str(r["id"]): r for r in other if "error" not in r}
    pairs = [(r, theirs[str(r["id"])]) for r in reference if "error" not in r and str(r["id"]) in theirs]
    if pairs and all("tokens" in a and "tokens" in b for a, b in pairs):
        steps = [first_divergence(a["tokens"], b["tokens"]) for a, b in pairs]
        diverged = [s for s in steps if s is not None]
        mean = sum(diverged) / len(diverged) if diverged else None
        return _agreement(len(pairs), len(pairs) - len(diverged), mean, "tokens")
    if pairs and all(a.get("tokens_sha1") and b.get("tokens_sha1") for a, b in pairs):
        same = sum(a["tokens_sha1"] == b["tokens_sha1"] for a, b in pairs)
        return _agreement(len(pairs), same, None, "tokens_sha1")
    return None


def _agreement(n: int, same: int, mean_first: float | None, by: str) -> dict:
    return {"n": n, "same": same, "share": same / n, "diverged": n - same, "mean_first": mean_first, "by": by}
