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
    out = {}
    for name in names:
        values = _finite(draws[name])
        if values.size == 0:
            out[name] = (None, None)
            continue
        low, high = np.quantile(values, [alpha / 2, 1 - alpha / 2])
        out[name] = (float(low), float(high))
    return out


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
