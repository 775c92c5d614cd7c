"""Intervals and paired tests against hand-computed and analytic values."""

from __future__ import annotations

import math

import pytest

from harness import stats


def mean(xs):
    return sum(xs) / len(xs)


def test_mcnemar_matches_hand_computed_binomial():
    # A right/B wrong on 1 item, A wrong/B right on 6, 3 concordant. Discordant m = 7;
    # p = 2 * P[Bin(7, 1/2) <= 1] = 2 * (1 + 7) / 128 = 0.125.
    a = [1, 0, 0, 0, 0, 0, 0, 1, 1, 0]
    b = [0, 1, 1, 1, 1, 1, 1, 1, 1, 0]
    r = stats.mcnemar_exact(a, b)
    assert (r.b, r.c) == (1, 6)
    assert r.p_value == pytest.approx(0.125)
    # 0 vs 5 discordant: p = 2 / 32.
    assert stats.mcnemar_exact([0] * 5, [1] * 5).p_value == pytest.approx(0.0625)
    # No discordant pairs: nothing to test, p = 1.
    assert stats.mcnemar_exact([1, 0], [1, 0]).p_value == 1.0


def test_mcnemar_agrees_with_scipy_binomtest():
    scipy_stats = pytest.importorskip("scipy.stats")
    a = [1] * 9 + [0] * 21 + [1] * 40
    b = [0] * 9 + [1] * 21 + [1] * 40
    assert stats.mcnemar_exact(a, b).p_value == pytest.approx(scipy_stats.binomtest(9, 30, 0.5).pvalue)


def test_bootstrap_ci_of_a_proportion_matches_the_normal_interval():
    # 50 ones, 50 zeros: mean 0.5, standard error sqrt(0.25 / 100) = 0.05, 95% ~ 0.5 +- 0.098.
    low, high = stats.bootstrap_ci([1] * 50 + [0] * 50, mean, n_resamples=2000, seed=1)
    assert low == pytest.approx(0.5 - 1.96 * 0.05, abs=0.02)
    assert high == pytest.approx(0.5 + 1.96 * 0.05, abs=0.02)


def test_bootstrap_ci_of_a_constant_is_the_constant_and_tiny_samples_have_none():
    assert stats.bootstrap_ci([3.0] * 10, mean) == (3.0, 3.0)
    assert stats.bootstrap_ci([3.0], mean) == (None, None)


def test_bootstrap_of_a_ratio_statistic_like_perplexity():
    # Windows (nll_sum, n_tokens); ppl = exp(sum nll / sum n). The interval brackets the point value.
    windows = [(200.0, 100), (260.0, 100), (150.0, 100), (310.0, 100), (220.0, 100)]

    def ppl(ws):
        return math.exp(sum(w[0] for w in ws) / sum(w[1] for w in ws))

    point = ppl(windows)
    low, high = stats.bootstrap_ci(windows, ppl, seed=0)
    assert point == pytest.approx(math.exp(1140 / 500))
    assert low < point < high
    assert low >= math.exp(1.5) and high <= math.exp(3.1)  # bounded by the best and worst window


def test_paired_bootstrap_shift_and_null():
    a = [0.1 * i for i in range(30)]
    shifted = stats.paired_bootstrap(a, [x + 1.0 for x in a], mean, seed=0)
    assert shifted.delta == pytest.approx(1.0)
    assert (shifted.ci_low, shifted.ci_high) == pytest.approx((1.0, 1.0))
    assert shifted.p_value == pytest.approx(2 / (stats.DEFAULT_RESAMPLES + 1))  # the smallest it can show
    same = stats.paired_bootstrap(a, list(a), mean, seed=0)
    assert same.delta == 0 and same.p_value == 1.0


def test_paired_bootstrap_uses_the_pairing():
    # Large item-to-item spread, constant small gain: pairing makes the gain significant.
    a = [float(i * 10) for i in range(40)]
    b = [x + 0.5 for x in a]
    r = stats.paired_bootstrap(a, b, mean, seed=0)
    assert r.ci_low > 0 and r.p_value < 0.01


def test_paired_inputs_must_align():
    with pytest.raises(ValueError, match="differ in length: 2 vs 3"):
        stats.paired_bootstrap([1, 2], [1, 2, 3], mean)


def test_bootstrap_cis_several_statistics_at_once():
    cis = stats.bootstrap_cis([1, 2, 3, 4, 5, 6], lambda xs: {"mean": mean(xs), "max": max(xs)}, seed=0)
    assert set(cis) == {"mean", "max"}
    assert cis["max"][1] == 6 and cis["mean"][0] < 3.5 < cis["mean"][1]


def test_is_binary():
    assert stats.is_binary([0, 1, 1.0, None]) and not stats.is_binary([0, 0.5]) and not stats.is_binary([])
