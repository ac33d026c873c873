"""Measure how agreement grows when each side averages k samples per ticker.

Two sides are compared ticker by ticker: two batches (reproducibility) or two disjoint halves
of one batch's samples (split-half stability). A side's grade for a ticker is the consensus of
k of its samples (app.quality.grades.consensus: one sample's own rating, or the band of the
mean score). With N samples there are many ways to choose the k; every statistic is the mean
over up to ``MAX_CHOICES`` of them (chosen with a fixed seed, so a report repeats), which
spends the samples a batch has instead of looking at one arbitrary choice.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from app.quality.grades import Grade, consensus
from app.quality.statistics import (
    agreement,
    bootstrap_interval,
    mean_defined,
    quadratic_kappa,
    spearman,
    spearman_brown,
)

MAX_CHOICES = 6
Choice = tuple[tuple[int, ...], tuple[int, ...]]  # sample positions of the left and right side


def k_values(samples: int, *, split: bool) -> list[int]:
    """Return 1, 2, 4, … up to ``samples`` (up to half of it for a split of one batch)."""
    limit = samples // 2 if split else samples
    values, k = [], 1
    while k <= limit:
        values.append(k)
        k *= 2
    return values


def _capped(choices: list[Choice], seed: int) -> list[Choice]:
    if len(choices) <= MAX_CHOICES:
        return choices
    return sorted(random.Random(seed).sample(choices, MAX_CHOICES))


def between(n_left: int, n_right: int, k: int, seed: int = 0) -> list[Choice]:
    """Return choices of k samples on each of two batches (any k of N on either side)."""
    left = list(itertools.combinations(range(n_left), k))
    right = list(itertools.combinations(range(n_right), k))
    return _capped(list(itertools.product(left, right)), seed)


def split_halves(n: int, k: int, seed: int = 0) -> list[Choice]:
    """Return unordered pairs of disjoint k-sample subsets of one batch's N samples."""
    choices = [(s, t) for s in itertools.combinations(range(n), k)
               for t in itertools.combinations(range(n), k)
               if s < t and not set(s) & set(t)]
    return _capped(choices, seed)


@dataclass(frozen=True)
class KRow:
    """Agreement between the two sides when each averages k samples."""

    k: int
    choices: int  # how many choices of k samples the figures are the mean over
    n: int  # tickers compared
    agreement: float | None
    qwk: float | None
    qwk_ci: tuple[float, float] | None
    spearman: float | None
    spearman_ci: tuple[float, float] | None
    spearman_predicted: float | None  # Spearman–Brown from the k = 1 row's Spearman
    qwk_predicted: float | None  # the same formula applied to the k = 1 row's QWK


def agreement_by_k(left: dict[str, list[Grade]], right: dict[str, list[Grade]],
                   choices_for: Callable[[int], list[Choice]], ks: Sequence[int], *,
                   resamples: int, seed: int = 0) -> list[KRow]:
    """Return one KRow per k over the tickers both sides graded with enough samples.

    Intervals are 95% percentile bootstraps over tickers (resampled with replacement).
    """
    rows: list[KRow] = []
    for k in ks:
        choices = choices_for(k)
        tickers = sorted(t for t in set(left) & set(right)
                         if all(max(s, default=-1) < len(left[t]) and
                                max(u, default=-1) < len(right[t]) for s, u in choices))
        sides = [_aligned(left, right, tickers, s, u) for s, u in choices]
        grades_of = partial(_mean_over, sides, scores=False)
        scores_of = partial(_mean_over, sides, scores=True)
        everyone = np.arange(len(tickers))
        base = rows[0] if rows else None
        rows.append(KRow(
            k=k, choices=len(choices), n=len(tickers),
            agreement=grades_of(agreement, everyone),
            qwk=grades_of(quadratic_kappa, everyone),
            qwk_ci=bootstrap_interval(len(tickers), partial(grades_of, quadratic_kappa),
                                      resamples=resamples, seed=seed),
            spearman=scores_of(spearman, everyone),
            spearman_ci=bootstrap_interval(len(tickers), partial(scores_of, spearman),
                                           resamples=resamples, seed=seed),
            spearman_predicted=spearman_brown(base.spearman, k) if base else None,
            qwk_predicted=spearman_brown(base.qwk, k) if base else None,
        ))
    return rows


_Sides = tuple[list[str], list[str], list[float], list[float]]


def _mean_over(sides: list[_Sides], stat: Callable[..., float | None], index: np.ndarray, *,
               scores: bool) -> float | None:
    """Return the mean over the choices of ``stat`` on the tickers at ``index``."""
    values = []
    for a_r, b_r, a_s, b_s in sides:
        if scores:
            values.append(stat([a_s[i] for i in index], [b_s[i] for i in index]))
        else:
            values.append(stat([a_r[i] for i in index], [b_r[i] for i in index]))
    return mean_defined(values)


def _aligned(left: dict[str, list[Grade]], right: dict[str, list[Grade]], tickers: list[str],
             s: tuple[int, ...], u: tuple[int, ...]) -> _Sides:
    a = [consensus([left[t][i] for i in s]) for t in tickers]
    b = [consensus([right[t][i] for i in u]) for t in tickers]
    return [r for r, _ in a], [r for r, _ in b], [x for _, x in a], [x for _, x in b]
