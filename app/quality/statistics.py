"""Compute every quality statistic in one place; an undefined statistic is None, never 0 or NaN.

Conventions, so that each report reads the same:

- Ratings are compared on the ordered 5-tier scale (Buy … Sell), coded 0 … 4.
- Quadratic weighted kappa (scikit-learn) needs at least 2 tickers and is None when it has
  no chance-expected disagreement to compare with (both runs gave one and the same grade
  throughout) or when both runs are constant (each gave a single grade): there is then
  nothing for the grades to agree about beyond what the raw agreement already says.
- Spearman correlations (scipy) need at least 3 pairs — with two, any ordering is ±1 — and
  are None when either side is constant.
- Kappa's interval is a jackknife one on Fisher's z scale (``jackknife_interval``), widened
  by ``KAPPA_INTERVAL_WIDEN``, given from ``MIN_KAPPA_INTERVAL_N`` tickers with
  ``MIN_KAPPA_OFF_HOLD`` of them graded off Hold by each side (docs/quality.md says what it
  holds, and with fewer).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import sklearn
from scipy import stats
from sklearn.metrics import cohen_kappa_score

from agents.decision import RATINGS

MIN_KAPPA_N = 2
# Kappa's 95% interval is given from this many tickers, this many of them graded off Hold
# by each side: with fewer it held less than 95% (module notes).
MIN_KAPPA_INTERVAL_N = 40
MIN_KAPPA_OFF_HOLD = 10
# ... and its half-width on z is this many times Student's t times the jackknife error, so
# that it holds 95% where kappa's estimate is biased (docs/quality.md).
KAPPA_INTERVAL_WIDEN = 1.10
MIN_CORRELATION_N = 3
MAX_UNDEFINED_SHARE = 0.10  # of bootstrap resamples, before an interval is withheld
BULLISH = frozenset({"Buy", "Overweight"})
BEARISH = frozenset({"Underweight", "Sell"})
_CODES = {rating: i for i, rating in enumerate(RATINGS)}


def finite(value: float | None) -> float | None:
    """Return ``value`` as a float, or None when it is missing, NaN or infinite."""
    if value is None:
        return None
    number = float(value)
    return number if np.isfinite(number) else None


def mean_defined(values: Sequence[float | None]) -> float | None:
    """Return the mean of the defined values, or None when none is defined."""
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def agreement(a: Sequence[str], b: Sequence[str]) -> float | None:
    """Return the share of positions where the two rating lists agree exactly."""
    if not a:
        return None
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def quadratic_kappa(a: Sequence[str], b: Sequence[str]) -> float | None:
    """Return Cohen's kappa with quadratic weights on the 5-tier scale (see module notes)."""
    if len(a) < MIN_KAPPA_N or (len(set(a)) == 1 and len(set(b)) == 1):
        return None
    codes = list(range(len(RATINGS)))
    # Inputs are coded here, so scikit-learn's per-call validation is only overhead (the
    # bootstrap calls this thousands of times).
    with sklearn.config_context(skip_parameter_validation=True), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value = cohen_kappa_score([_CODES[r] for r in a], [_CODES[r] for r in b],
                                  labels=codes, weights="quadratic")
    return finite(value)


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Return Spearman's rank correlation, or None (fewer than 3 pairs, or a constant side)."""
    if len(x) < MIN_CORRELATION_N or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return finite(stats.spearmanr(x, y).statistic)


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Return Spearman's correlation of each row of ``x`` with the same row of ``y``.

    The same figure as ``spearman`` row by row (average ranks for ties), NaN where a row
    has fewer than 3 columns or either side is constant; for many equal-length series at
    once (the simulations of app/quality/simulation.py).
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape[-1] < MIN_CORRELATION_N:
        return np.full(x.shape[:-1], np.nan)
    rx, ry = stats.rankdata(x, axis=-1), stats.rankdata(y, axis=-1)
    rx -= rx.mean(axis=-1, keepdims=True)
    ry -= ry.mean(axis=-1, keepdims=True)
    scale = np.sqrt((rx * rx).sum(axis=-1) * (ry * ry).sum(axis=-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(scale > 0, (rx * ry).sum(axis=-1) / scale, np.nan)


def direction(rating: str) -> int:
    """Return +1 for Buy/Overweight, -1 for Underweight/Sell, 0 for Hold."""
    return 1 if rating in BULLISH else -1 if rating in BEARISH else 0


def flip_rate(a: Sequence[str], b: Sequence[str]) -> tuple[float | None, int]:
    """Return the share of opposite directions among pairs where both grades are non-Hold.

    The second value is that denominator: how many pairs had a direction in both runs.
    """
    both = [(direction(x), direction(y)) for x, y in zip(a, b, strict=True)
            if direction(x) and direction(y)]
    if not both:
        return None, 0
    return sum(x != y for x, y in both) / len(both), len(both)


PERMUTATIONS = 9999  # orders drawn for the IC's p-value when there are more than this


def ic_test(x: Sequence[float], y: Sequence[float]) -> tuple[float | None, float | None]:
    """Return (t, two-sided p) of the rank IC of ``x`` against ``y`` (Spearman) against zero.

    t = ic·sqrt((n−2)/(1−ic²)), shown as the size of the evidence (None at |ic| = 1, where it
    is infinite). p is the permutation test's, the level of which holds at any n and with
    ties: the share of orders of ``y`` against ``x`` whose |IC| is at least the observed one,
    over every order when there are at most ``PERMUTATIONS`` (up to 7 tickers), else over that
    many drawn (fixed seed) as (1 + hits) / (1 + draws); Student's t on n−2 df is too
    generous below about 11 tickers (docs/quality.md). Both None below 3 tickers or when the
    IC is undefined (a constant side).
    """
    ic = spearman(x, y)
    if ic is None:
        return None, None
    n = len(x)
    t = None if abs(ic) >= 1.0 - 1e-12 else float(ic * np.sqrt((n - 2) / (1.0 - ic * ic)))
    ranks_x, ranks_y = stats.rankdata(x), stats.rankdata(y)

    def size(ry: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.abs(spearman_rows(np.broadcast_to(ranks_x, ry.shape), ry))

    result = stats.permutation_test((ranks_y,), size, permutation_type="pairings",
                                    n_resamples=PERMUTATIONS, alternative="greater",
                                    vectorized=True, rng=np.random.default_rng(0))
    return t, float(result.pvalue)


def welch_p(a: Sequence[float], b: Sequence[float]) -> tuple[float, int] | None:
    """Return (the two-sided p that ``a`` and ``b`` have the same mean, its degrees of
    freedom): Welch's t statistic against Student's t on min(len(a), len(b)) − 1 df.

    Unequal variances allowed. The conservative df (not Welch–Satterthwaite's) keeps the
    test's size at most its level under normal noise whatever the variance ratio. None when
    either side has fewer than 2 values, or when neither side varies: there is then no
    variance to test the difference against.
    """
    if len(a) < 2 or len(b) < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0):
        return None
    t = finite(stats.ttest_ind(a, b, equal_var=False).statistic)
    if t is None:
        return None
    df = min(len(a), len(b)) - 1
    return float(2 * stats.t.sf(abs(t), df)), df


def newey_west_error(values: Sequence[float], lag: int) -> float | None:
    """Return the standard error of a series' mean, serial correlation up to ``lag`` allowed.

    Newey–West with Bartlett weights: S = T/(T−1)·[γ₀ + 2·Σ_{l=1..lag} (1 − l/(lag+1))·γ_l],
    γ_l = (1/T)·Σ_t e_t·e_{t−l} with e the deviations from the mean, and the error is
    sqrt(S/T). The factor T/(T−1) makes lag 0 the ordinary sd/√T. None when T < 2 or
    lag ≥ T, and when the series does not vary (S = 0).
    """
    x = np.asarray(values, dtype=float)
    count = len(x)
    if count < 2 or not 0 <= lag < count:
        return None
    e = x - x.mean()
    gamma = [float(e[j:] @ e[:count - j]) / count for j in range(lag + 1)]
    long_run = gamma[0] + 2 * sum((1 - j / (lag + 1)) * gamma[j] for j in range(1, lag + 1))
    long_run *= count / (count - 1)
    if long_run <= 1e-15 * max(1.0, float(np.mean(x * x))):
        return None
    return float(np.sqrt(long_run / count))


def newey_west_t(values: Sequence[float], lag: int) -> tuple[float | None, float | None]:
    """Return (t, two-sided p) of a series' mean against zero: mean ÷ newey_west_error.

    On T−1 degrees of freedom; at lag 0 the ordinary one-sample t-test. None, None when the
    error is undefined (a series that does not vary has an infinite t).
    """
    error = newey_west_error(values, lag)
    if error is None:
        return None, None
    t = float(np.mean(values) / error)
    return t, float(2 * stats.t.sf(abs(t), len(values) - 1))


def overlap_error(values: Sequence[float], days: int) -> float | None:
    """Return a standard error of a nightly series' mean that holds however scores persist.

    Nights are one session apart and each value covers the next ``days`` sessions, so only
    values at least ``days`` nights apart are independent (under no skill). The mean of all
    T values is an average of the ``days`` interleaved sub-series of such values, each of at
    least K = ⌊T/days⌋, so its variance is at most σ²/K, reached when a night's value
    repeats over its overlap. σ² is estimated as Σ(x − x̄)²/(T − days): unbiased in that
    case (T values in K repeated groups keep K − 1 of their T − 1 degrees of freedom) and
    larger than unbiased otherwise. None when K < 2 or the series does not vary.
    """
    x = np.asarray(values, dtype=float)
    blocks = len(x) // days
    if blocks < 2:
        return None
    spread = float(((x - x.mean()) ** 2).sum()) / (len(x) - days)
    if spread <= 1e-30 * max(1.0, float(np.mean(x * x))):
        return None
    return float(np.sqrt(spread / blocks))


def overlap_t(values: Sequence[float], days: int) -> tuple[float | None, float | None]:
    """Return (t, two-sided p) of a series' mean against zero: mean ÷ overlap_error.

    On K − 1 degrees of freedom, K = ⌊T/days⌋ the independent values; at days = 1 the
    ordinary one-sample t-test. None, None when the error is undefined.
    """
    error = overlap_error(values, days)
    if error is None:
        return None, None
    t = float(np.mean(values) / error)
    return t, float(2 * stats.t.sf(abs(t), len(values) // days - 1))


def spearman_brown(r1: float | None, k: float) -> float | None:
    """Return the reliability of a mean of ``k`` parallel measures whose single one is ``r1``."""
    # A reliability is a share of variance: a negative estimate (noise around zero) has no
    # parallel-measures reading to extrapolate.
    if r1 is None or r1 < 0:
        return None
    return k * r1 / (1 + (k - 1) * r1)


def distribution(ratings: Sequence[str]) -> dict[str, int]:
    """Count the ratings, every grade present (zero when unused), in scale order."""
    return {rating: sum(r == rating for r in ratings) for rating in RATINGS}


def total_variation(p: dict[str, int], q: dict[str, int]) -> float | None:
    """Return ½·Σ|p−q| over the grades' shares: the share of grades that would have to move."""
    np_, nq = sum(p.values()), sum(q.values())
    if not np_ or not nq:
        return None
    return 0.5 * sum(abs(p.get(r, 0) / np_ - q.get(r, 0) / nq) for r in RATINGS)


@dataclass(frozen=True)
class PairStats:
    """How two runs' grades of the same tickers agree."""

    n: int
    agreement: float | None
    qwk: float | None
    spearman: float | None
    flip_rate: float | None
    directional: int  # pairs where both grades are non-Hold: the flip rate's denominator


def compare(a_ratings: Sequence[str], b_ratings: Sequence[str], a_scores: Sequence[float],
            b_scores: Sequence[float]) -> PairStats:
    """Return every agreement statistic of two aligned runs (same tickers, same order)."""
    flips, directional = flip_rate(a_ratings, b_ratings)
    return PairStats(
        n=len(a_ratings), agreement=agreement(a_ratings, b_ratings),
        qwk=quadratic_kappa(a_ratings, b_ratings), spearman=spearman(a_scores, b_scores),
        flip_rate=flips, directional=directional,
    )


def bootstrap_interval(n: int, statistic: Callable[[np.ndarray], float | None], *,
                       resamples: int, seed: int = 0, level: float = 0.95,
                       ) -> tuple[float, float] | None:
    """Return a percentile bootstrap interval of ``statistic`` over ``n`` resampled items.

    ``statistic`` gets an array of item indices (drawn with replacement by scipy). Resamples
    where it is undefined (e.g. every drawn ticker graded Hold in both runs) are left out of
    the percentiles; when more than ``MAX_UNDEFINED_SHARE`` of them are, or with fewer than
    3 items or no resamples, there is no interval (None): it would describe other data.
    """
    if resamples <= 0 or n < MIN_CORRELATION_N:
        return None

    def wrapped(index: np.ndarray) -> float:
        value = statistic(index.astype(int))
        return np.nan if value is None else value

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = stats.bootstrap((np.arange(n),), wrapped, n_resamples=resamples,
                                 vectorized=False, method="percentile",
                                 confidence_level=level, rng=np.random.default_rng(seed))
    values = np.asarray(result.bootstrap_distribution, dtype=float)
    if np.isnan(values).mean() > MAX_UNDEFINED_SHARE:
        return None
    tail = (1 - level) / 2 * 100
    low, high = np.nanpercentile(values, [tail, 100 - tail])
    return float(low), float(high)


def jackknife_interval(n: int, statistic: Callable[[np.ndarray], float | None], *,
                       level: float = 0.95, widen: float = 1.0,
                       ) -> tuple[float, float] | None:
    """Return an interval of a statistic in (−1, 1) (a kappa, a correlation) over ``n`` items.

    The statistic's Fisher z = atanh(θ) gets its jackknife standard error over the n
    leave-one-out subsets (``statistic`` gets their item indices); the interval is
    tanh(z ± widen·t·se), t Student's on n − 1 df, so it stays inside (−1, 1) and leans away from
    the bound near it, as kappa's spread does. None with fewer than 3 items, or when θ or
    any leave-one-out value is undefined or ±1 (z is then infinite).
    """
    if n < MIN_CORRELATION_N:
        return None
    everyone = np.arange(n)
    values = [statistic(everyone), *(statistic(np.delete(everyone, i)) for i in range(n))]
    if any(v is None or not abs(v) < 1 for v in values):
        return None
    z = np.arctanh(np.asarray(values, dtype=float))
    left_out = z[1:]
    error = float(np.sqrt((n - 1) / n * ((left_out - left_out.mean()) ** 2).sum()))
    half = widen * float(stats.t.ppf(0.5 + level / 2, n - 1)) * error
    return float(np.tanh(z[0] - half)), float(np.tanh(z[0] + half))
