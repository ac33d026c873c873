"""Check each quality statistic against a hand computation, and the undefined cases."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from app.quality.statistics import (
    agreement,
    bootstrap_interval,
    compare,
    flip_rate,
    ic_test,
    jackknife_interval,
    quadratic_kappa,
    spearman,
    spearman_brown,
    total_variation,
)
from tests.unit.support.quality_rows import kappa_by_hand, spearman_by_hand

A = ["Buy", "Hold", "Hold", "Sell", "Overweight", "Underweight", "Hold", "Buy"]
B = ["Overweight", "Hold", "Underweight", "Sell", "Buy", "Hold", "Hold", "Hold"]


def test_quadratic_kappa_matches_its_formula() -> None:
    assert quadratic_kappa(A, B) == pytest.approx(kappa_by_hand(A, B))
    assert quadratic_kappa(A, A) == pytest.approx(1.0)
    # A one-step disagreement costs (1/4)² of a full one; the hand formula knows nothing of
    # scikit-learn's implementation.
    shifted = ["Overweight" if r == "Buy" else r for r in A]
    assert quadratic_kappa(A, shifted) == pytest.approx(kappa_by_hand(A, shifted))


def test_kappa_is_undefined_without_variation_or_with_one_ticker() -> None:
    assert quadratic_kappa(["Hold"] * 5, ["Hold"] * 5) is None  # all Hold
    assert quadratic_kappa(["Hold"] * 5, ["Buy"] * 5) is None  # both constant
    assert quadratic_kappa(["Buy"], ["Buy"]) is None  # a single ticker
    # One side constant is defined: the other side's grades are no better than chance.
    assert quadratic_kappa(["Hold"] * 4, ["Buy", "Hold", "Sell", "Hold"]) == pytest.approx(0.0)


def test_spearman_matches_ranks_then_pearson_with_ties() -> None:
    x = [0.3, -0.2, 0.3, 0.9, -0.7, 0.0, 0.1]
    y = [0.1, 0.2, 0.25, 0.8, -0.5, 0.2, -0.3]
    assert spearman(x, y) == pytest.approx(spearman_by_hand(x, y))


def test_spearman_undefined_for_constant_scores_and_short_lists() -> None:
    assert spearman([0.2, 0.2, 0.2], [0.1, 0.5, 0.9]) is None
    assert spearman([0.1, 0.5, 0.9], [0.0, 0.0, 0.0]) is None
    assert spearman([0.1, 0.5], [0.2, 0.3]) is None
    assert spearman([], []) is None


def test_agreement_and_flips_counted_by_hand() -> None:
    same = sum(x == y for x, y in zip(A, B, strict=True))  # Hold, Sell, Hold: 3 of 8
    assert agreement(A, B) == pytest.approx(same / len(A)) == pytest.approx(3 / 8)
    # Both non-Hold: (Buy, Overweight) same side, (Sell, Sell) same, (Overweight, Buy) same:
    # no flip among 3.
    assert flip_rate(A, B) == (0.0, 3)
    assert flip_rate(["Buy", "Sell", "Hold"], ["Sell", "Sell", "Buy"]) == (0.5, 2)
    assert flip_rate(["Hold"] * 3, ["Buy"] * 3) == (None, 0)
    assert agreement([], []) is None


def test_compare_collects_the_same_numbers() -> None:
    x = [0.7, 0.0, -0.1, -0.8, 0.3, -0.4, 0.05, 0.6]
    y = [0.4, 0.1, -0.3, -0.9, 0.55, 0.0, 0.1, 0.0]
    stats = compare(A, B, x, y)
    assert stats.n == 8
    assert stats.qwk == pytest.approx(kappa_by_hand(A, B))
    assert stats.spearman == pytest.approx(spearman_by_hand(x, y))
    assert stats.agreement == pytest.approx(3 / 8)


def test_ic_t_statistic_and_p_value() -> None:
    scores = [0.9, 0.5, 0.1, -0.2, -0.6, 0.3]
    returns = [0.04, 0.01, 0.02, -0.03, -0.01, -0.02]
    ic = spearman(scores, returns)
    by_hand = spearman_by_hand(scores, returns)
    assert ic == pytest.approx(by_hand)
    t = by_hand * math.sqrt((6 - 2) / (1 - by_hand**2))
    t_stat, p = ic_test(scores, returns)
    assert t_stat == pytest.approx(t)
    # The permutation p by hand: the share of the 720 orders of the returns whose |IC| is at
    # least this one's.
    orders = [spearman_by_hand(scores, list(o)) for o in itertools.permutations(returns)]
    assert p == pytest.approx(sum(abs(r) >= abs(by_hand) - 1e-12 for r in orders) / 720)
    assert ic_test(scores[:2], returns[:2]) == (None, None)
    assert ic_test([0.5] * 6, returns) == (None, None)


@pytest.mark.parametrize("n", [5, 6])
def test_the_ic_p_value_keeps_its_level_over_every_order(n: int) -> None:
    # Under "no relation" every order of the returns against the scores is equally likely,
    # so the share of orders with p < 5% is the test's exact size. Student's t on n − 2 df
    # gave 10 of 120 at 5 tickers and 40 of 720 at 6.
    scores = [0.1 * i for i in range(n)]
    rejected = [ic_test(scores, [float(r) for r in order])[1] < 0.05
                for order in itertools.permutations(range(n))]
    assert sum(rejected) / len(rejected) <= 0.05


def test_spearman_brown_and_the_samples_it_calls_for() -> None:
    # r_k = k·r/(1+(k−1)·r); at r = 0.12 a mean of 4 reaches 0.48/1.36.
    assert spearman_brown(0.12, 4) == pytest.approx(0.48 / 1.36)
    assert spearman_brown(0.5, 1) == pytest.approx(0.5)
    assert spearman_brown(None, 4) is None
    assert spearman_brown(-0.2, 2) is None  # a negative reliability has no such reading
    assert spearman_brown(0.0, 4) == 0.0


def test_total_variation_distance() -> None:
    p = {"Buy": 1, "Overweight": 1, "Hold": 8, "Underweight": 0, "Sell": 0}
    q = {"Buy": 2, "Overweight": 4, "Hold": 4, "Underweight": 0, "Sell": 0}
    # shares (0.1, 0.1, 0.8) vs (0.2, 0.4, 0.4): ½(0.1 + 0.3 + 0.4) = 0.4
    assert total_variation(p, q) == pytest.approx(0.4)
    assert total_variation(p, p) == pytest.approx(0.0)
    assert total_variation(p, dict.fromkeys(q, 0)) is None


def test_bootstrap_interval_of_a_mean_is_near_the_normal_one() -> None:
    values = np.random.default_rng(7).normal(1.0, 2.0, size=60)
    interval = bootstrap_interval(60, lambda i: float(values[i].mean()), resamples=4000)
    assert interval is not None
    half = 1.96 * values.std(ddof=1) / math.sqrt(60)
    assert interval[0] == pytest.approx(values.mean() - half, abs=0.12)
    assert interval[1] == pytest.approx(values.mean() + half, abs=0.12)
    again = bootstrap_interval(60, lambda i: float(values[i].mean()), resamples=4000)
    assert again == interval  # seeded: a report repeats


def test_bootstrap_interval_withheld_when_often_undefined() -> None:
    # Undefined whenever item 0 is drawn: in about 1 − (1 − 1/4)⁴ ≈ 68% of resamples.
    assert bootstrap_interval(4, lambda i: None if 0 in i else 1.0, resamples=200) is None
    assert bootstrap_interval(2, lambda i: 1.0, resamples=200) is None
    assert bootstrap_interval(10, lambda i: 1.0, resamples=0) is None


def test_jackknife_interval_is_fishers_z_plus_or_minus_t_times_the_jackknife_error() -> None:
    # Four items: θ = 0.5 on all of them, and leave-one-out values whose z = atanh(θ) are
    # atanh(0.5) − 0.1, + 0, + 0, + 0.1. The jackknife error of z is
    # sqrt(3/4 · (0.01 + 0.01)) = 0.12247; Student's t on 3 df at 97.5% is 3.18245; so the
    # interval is tanh(0.549306 ± 0.389768) = [0.15820, 0.73480], leaning away from 1.
    shifts = [-0.1, 0.0, 0.0, 0.1]

    def statistic(index: np.ndarray) -> float:
        if len(index) == 4:
            return 0.5
        (missing,) = set(range(4)) - set(index.tolist())
        return math.tanh(math.atanh(0.5) + shifts[missing])

    low, high = jackknife_interval(4, statistic)  # type: ignore[misc]
    assert low == pytest.approx(0.15820, abs=1e-5) and high == pytest.approx(0.73480, abs=1e-5)
    assert 0.5 - low > high - 0.5


def test_jackknife_interval_widened_multiplies_its_half_width_on_z() -> None:
    # The case above widened by 1.1: tanh(0.549306 ± 1.1 · 0.389768) = [0.11998, 0.75222].
    def statistic(index: np.ndarray) -> float:
        if len(index) == 4:
            return 0.5
        (missing,) = set(range(4)) - set(index.tolist())
        return math.tanh(math.atanh(0.5) + [-0.1, 0.0, 0.0, 0.1][missing])

    low, high = jackknife_interval(4, statistic, widen=1.1)  # type: ignore[misc]
    assert low == pytest.approx(0.11998, abs=1e-5) and high == pytest.approx(0.75222, abs=1e-5)


def test_jackknife_interval_is_withheld_where_z_is_infinite_or_the_statistic_undefined() -> None:
    assert jackknife_interval(5, lambda i: 1.0) is None  # perfect agreement: z is infinite
    assert jackknife_interval(5, lambda i: None if len(i) < 5 else 0.3) is None
    assert jackknife_interval(2, lambda i: 0.3) is None
