"""Measure how agreement grows when each side averages k samples per ticker.

Two sides are compared ticker by ticker: two batches (reproducibility) or two disjoint halves
of one batch's samples (split-half stability). At every k a side's grade for a ticker is the
band of the mean score of its k samples (app.quality.grades.consensus); each figure is the
mean over the choices of k samples, exact up to ``ALL_CHOICES`` choices, else drawn (fixed
seed) in rounds of ``DRAW_ROUND`` until its standard error is below ``TARGET_ERROR``
(docs/quality.md, "`quality repro`").
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from app.quality.grades import Grade, consensus
from app.quality.statistics import (
    KAPPA_INTERVAL_WIDEN,
    MIN_KAPPA_INTERVAL_N,
    MIN_KAPPA_OFF_HOLD,
    agreement,
    bootstrap_interval,
    jackknife_interval,
    mean_defined,
    quadratic_kappa,
    spearman,
    spearman_brown,
)

ALL_CHOICES = 100  # up to this many choices of the k samples, every one is used
DRAW_ROUND = 50  # random choices added at a time beyond that
TARGET_ERROR = 0.01  # the standard error each figure's mean over the draws is brought below
MAX_DRAWS = 20_000  # a bound: a figure in [−1, 1] has sd ≤ 1, so its error is then ≤ 0.007
INTERVAL_CHOICES = 6  # choices each bootstrap resample averages over (intervals cost more)
Choice = tuple[tuple[int, ...], tuple[int, ...]]  # sample positions of the left and right side


@dataclass(frozen=True)
class Choices:
    """Every way to pick the k samples of each side: how many, all of them, or one at random."""

    count: int
    left_samples: int  # samples a ticker needs on the left side to be compared
    right_samples: int
    every: Callable[[], list[Choice]]
    draw: Callable[[random.Random], Choice]


def k_values(samples: int, *, split: bool) -> list[int]:
    """Return 1, 2, 4, … up to ``samples`` (up to half of it for a split of one batch)."""
    limit = samples // 2 if split else samples
    return [2 ** i for i in range(limit.bit_length())]


def between(n_left: int, n_right: int, k: int) -> Choices:
    """Return the choices of k samples on each of two batches (any k of N on either side)."""

    def every() -> list[Choice]:
        return list(itertools.product(itertools.combinations(range(n_left), k),
                                      itertools.combinations(range(n_right), k)))

    def draw(rng: random.Random) -> Choice:
        return (tuple(sorted(rng.sample(range(n_left), k))),
                tuple(sorted(rng.sample(range(n_right), k))))

    return Choices(math.comb(n_left, k) * math.comb(n_right, k), n_left, n_right, every, draw)


def split_halves(n: int, k: int) -> Choices:
    """Return the unordered pairs of disjoint k-sample subsets of one batch's N samples."""

    def every() -> list[Choice]:
        return [(s, t) for s in itertools.combinations(range(n), k)
                for t in itertools.combinations(range(n), k)
                if s < t and not set(s) & set(t)]

    def draw(rng: random.Random) -> Choice:
        picked = rng.sample(range(n), 2 * k)
        s, t = tuple(sorted(picked[:k])), tuple(sorted(picked[k:]))
        return (s, t) if s < t else (t, s)

    return Choices(math.comb(n, k) * math.comb(n - k, k) // 2, n, n, every, draw)


@dataclass(frozen=True)
class KRow:
    """Agreement between the two sides when each averages k samples."""

    k: int
    choices: int  # how many choices of k samples the figures are the mean over
    exhaustive: bool  # every choice was used: the means are exact, not estimates
    choice_error: float | None  # the largest figure's standard error over the draws (0: exact)
    n: int  # tickers compared
    agreement: float | None
    qwk: float | None
    qwk_ci: tuple[float, float] | None
    spearman: float | None
    spearman_ci: tuple[float, float] | None
    spearman_predicted: float | None  # Spearman–Brown from the k = 1 row's Spearman
    qwk_predicted: float | None  # the same formula applied to the k = 1 row's QWK
    qwk_ci_withheld: str | None = None  # why QWK has no interval, when it has a value


_Sides = tuple[list[str], list[str], list[float], list[float]]
_FIGURES = ("agreement", "qwk", "spearman")


def agreement_by_k(left: dict[str, list[Grade]], right: dict[str, list[Grade]],
                   choices_for: Callable[[int], Choices], ks: Sequence[int], *,
                   resamples: int, seed: int = 0) -> list[KRow]:
    """Return one KRow per k over the tickers both sides graded with enough samples.

    Intervals are of the mean over ``INTERVAL_CHOICES`` of the choices, over tickers:
    Spearman's a 95% percentile bootstrap (tickers resampled with replacement), QWK's a
    jackknife one on Fisher's z widened by ``KAPPA_INTERVAL_WIDEN``, given only from
    ``MIN_KAPPA_INTERVAL_N`` tickers with ``MIN_KAPPA_OFF_HOLD`` graded off Hold by each
    side in every choice shown (else ``qwk_ci_withheld`` says why). ``resamples`` 0: none.
    """
    rows: list[KRow] = []
    for k in ks:
        space = choices_for(k)
        tickers = sorted(t for t in set(left) & set(right)
                         if len(left[t]) >= space.left_samples
                         and len(right[t]) >= space.right_samples)
        align = partial(_aligned, left, right, tickers)
        exhaustive = space.count <= ALL_CHOICES
        if not exhaustive:
            chosen, sides, values, error = _drawn(space, align, random.Random(f"{seed}:{k}"))
            # As many draws as there are choices: every choice gives the exact mean instead.
            exhaustive = len(chosen) >= space.count
        if exhaustive:
            chosen = space.every()
            sides = [align(s, u) for s, u in chosen]
            values = [_figures(side) for side in sides]
            error = 0.0
        means = {name: mean_defined([v[name] for v in values]) for name in _FIGURES}
        shown = sides if len(sides) <= INTERVAL_CHOICES else [
            sides[i] for i in sorted(random.Random(seed).sample(range(len(sides)),
                                                                INTERVAL_CHOICES))]
        grades_of = partial(_mean_over, shown, scores=False)
        scores_of = partial(_mean_over, shown, scores=True)
        base = rows[0] if rows else None
        qwk_ci, withheld = None, None
        if resamples > 0 and means["qwk"] is not None:
            withheld = _kappa_withheld(shown, len(tickers), k)
            qwk_ci = None if withheld else jackknife_interval(
                len(tickers), partial(grades_of, quadratic_kappa), widen=KAPPA_INTERVAL_WIDEN)
            if not withheld and qwk_ci is None:
                withheld = (f"QWK's 95% interval is undefined at k = {k}: QWK, or QWK "
                            "with a ticker left out, is ±1")
        rows.append(KRow(
            k=k, choices=len(chosen), exhaustive=exhaustive,
            choice_error=error, n=len(tickers), agreement=means["agreement"],
            qwk=means["qwk"],
            qwk_ci=qwk_ci, qwk_ci_withheld=withheld,
            spearman=means["spearman"],
            spearman_ci=bootstrap_interval(len(tickers), partial(scores_of, spearman),
                                           resamples=resamples, seed=seed),
            spearman_predicted=spearman_brown(base.spearman, k) if base else None,
            qwk_predicted=spearman_brown(base.qwk, k) if base else None,
        ))
    return rows


def _kappa_withheld(shown: list[_Sides], tickers: int, k: int) -> str | None:
    """Return why QWK's interval is not given for these tickers, or None when it is."""
    if tickers < MIN_KAPPA_INTERVAL_N:
        return f"QWK's 95% interval needs {MIN_KAPPA_INTERVAL_N} tickers, here {tickers}"
    off_hold = min(sum(r != "Hold" for r in side[j]) for side in shown for j in (0, 1))
    if off_hold < MIN_KAPPA_OFF_HOLD:
        return (f"QWK's 95% interval needs {MIN_KAPPA_OFF_HOLD} tickers graded off Hold by "
                f"each side, here {off_hold} at k = {k}")
    return None


def _drawn(space: Choices, align: Callable[[tuple[int, ...], tuple[int, ...]], _Sides],
           rng: random.Random,
           ) -> tuple[list[Choice], list[_Sides], list[dict[str, float | None]], float | None]:
    """Draw choices until every figure's standard error is below TARGET_ERROR.

    Stops too at ``MAX_DRAWS``, or once there are as many draws as choices.
    """
    chosen: list[Choice] = []
    sides: list[_Sides] = []
    values: list[dict[str, float | None]] = []
    error: float | None = None
    while len(chosen) < min(MAX_DRAWS, space.count):
        for _ in range(DRAW_ROUND):
            choice = space.draw(rng)
            chosen.append(choice)
            sides.append(align(*choice))
            values.append(_figures(sides[-1]))
        error = _largest_error(values)
        if error is not None and error < TARGET_ERROR:
            break
    return chosen, sides, values, error


def _largest_error(values: list[dict[str, float | None]]) -> float | None:
    """Return the largest standard error of a figure's mean over the draws (defined ones)."""
    errors = []
    for name in _FIGURES:
        defined = [x for x in (v[name] for v in values) if x is not None]
        if len(defined) >= 2:
            errors.append(float(np.std(defined, ddof=1) / math.sqrt(len(defined))))
    return max(errors) if errors else None


def _figures(side: _Sides) -> dict[str, float | None]:
    a_r, b_r, a_s, b_s = side
    return {"agreement": agreement(a_r, b_r), "qwk": quadratic_kappa(a_r, b_r),
            "spearman": spearman(a_s, b_s)}


def _mean_over(sides: list[_Sides], stat: Callable[..., float | None], index: np.ndarray, *,
               scores: bool) -> float | None:
    """Return the mean over the choices of ``stat`` on the tickers at ``index``."""
    a, b = (2, 3) if scores else (0, 1)  # a _Sides' scores, else its ratings
    return mean_defined([stat([side[a][i] for i in index], [side[b][i] for i in index])
                         for side in sides])


def _aligned(left: dict[str, list[Grade]], right: dict[str, list[Grade]], tickers: list[str],
             s: tuple[int, ...], u: tuple[int, ...]) -> _Sides:
    a = [consensus([left[t][i] for i in s]) for t in tickers]
    b = [consensus([right[t][i] for i in u]) for t in tickers]
    return [r for r, _ in a], [r for r, _ in b], [x for _, x in a], [x for _, x in b]
