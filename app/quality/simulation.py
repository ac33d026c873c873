"""Simulate nights with a known truth and count how often the quality verdicts fire.

Every figure goes through the product's own functions: a simulated night's IC comes from
``statistics.spearman_rows`` (``night_ic``'s Spearman, for all nights of a run at once: the
unit tests check the two agree), counted as ``night_ic`` counts it (``track.judged_ic``: a
night of fewer than ``TRACK_MIN_TICKERS`` tickers is not judged), and the verdict from
``track.ic_verdict``; a simulated rating distribution is judged by ``monitor.findings``, and
a run of nights by ``monitor.reference_window`` as ``check_batch`` chooses references.

The worlds: every ticker's daily return is i.i.d. normal; a ticker's score is an AR(1)
over nights (``persistence`` 0: a fresh score every night; 0.95: ratings that persist, as
real ones do) banded into ratings by the product's score bands. With ``skill`` > 0 the next
session's return of every ticker moves with its score (a daily IC of about ``skill``).
Nights are one session apart, so an h-session return overlaps the next h − 1 nights'.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from agents.decision import RATINGS, rating_for_score
from app.config import Settings
from app.quality.monitor import MOVED, Finding, NightRecord, findings, reference_window
from app.quality.statistics import newey_west_t, spearman_rows
from app.quality.track import NightReturns, ic_verdict, judged_ic

DAILY_SD = 0.02
SCORE_SD = 0.45


@dataclass(frozen=True)
class World:
    """One simulated desk: its universe, how long it runs, and what its scores are worth."""

    tickers: int
    nights: int
    persistence: float
    skill: float = 0.0


def simulate_ics(world: World, horizons: Sequence[int],
                 rng: np.random.Generator) -> dict[int, list[float]]:
    """Return each horizon's nightly rank ICs of one simulated run, the nights the product
    judges only (``night_ic``: none below ``TRACK_MIN_TICKERS`` tickers, none undefined)."""
    longest = max(horizons)
    z = np.empty((world.nights, world.tickers))
    z[0] = rng.standard_normal(world.tickers)
    fresh = math.sqrt(1 - world.persistence ** 2)
    for t in range(1, world.nights):
        z[t] = world.persistence * z[t - 1] + fresh * rng.standard_normal(world.tickers)
    scores = scores_of(z)
    daily = DAILY_SD * rng.standard_normal((world.nights + longest, world.tickers))
    daily[:world.nights] += world.skill * DAILY_SD * z  # session t + 1 follows night t
    path = np.vstack([np.zeros(world.tickers), np.cumsum(daily, axis=0)])
    out: dict[int, list[float]] = {}
    for days in horizons:
        ics = spearman_rows(scores, path[days:days + world.nights] - path[:world.nights])
        judged = (judged_ic(world.tickers, functools.partial(float, ic)) for ic in ics)
        out[days] = [ic for ic in judged if ic is not None]
    return out


def scores_of(z: np.ndarray) -> np.ndarray:
    """Return the scores a latent standard normal gives: ±1 at about 2.2 sd."""
    return np.clip(SCORE_SD * z, -1, 1)


def night_of(scores: np.ndarray, returns: np.ndarray, night: int = 0) -> NightReturns:
    """Return one simulated night as the product reads it (ratings by the score bands)."""
    return NightReturns(night, str(night), [rating_for_score(float(s)) for s in scores],
                        scores.tolist(), returns.tolist())


# The alternatives measured against the chosen verdict (docs/quality.md, "How the verdict
# was chosen"). Each returns True when it would call the mean IC different from 0 at 5%.

def newey_west_plain(ics: Sequence[float], days: int) -> bool:
    """Newey–West, Bartlett lag h − 1, against Student t on nights − 1 (the old verdict)."""
    _, p = newey_west_t(ics, days - 1)
    return p is not None and p < 0.05


def fixed_b_critical(b: float) -> float:
    """Return the two-sided 5% critical value of the Bartlett fixed-b t (b = bandwidth/T).

    Kiefer and Vogelsang (2005), the cubic in b fitted to the 97.5% quantile.
    """
    return 1.96 + 2.9694 * b + 0.4160 * b ** 2 - 0.5324 * b ** 3


def newey_west_fixed_b(ics: Sequence[float], days: int, bandwidth: int) -> bool:
    """Newey–West with Bartlett bandwidth ``bandwidth`` nights, fixed-b critical values."""
    if bandwidth > len(ics):
        return False
    t, _ = newey_west_t(ics, bandwidth - 1)
    return t is not None and abs(t) > fixed_b_critical(bandwidth / len(ics))


def one_subsample(ics: Sequence[float], days: int) -> bool:
    """The plain t-test of every h-th night only (returns that do not overlap)."""
    kept = list(ics)[::-1][::days]
    if len(kept) < 3 or np.ptp(kept) == 0:
        return False
    return bool(stats.ttest_1samp(kept, 0.0).pvalue < 0.05)


CANDIDATES: dict[str, Callable[[Sequence[float], int], bool]] = {
    "newey-west lag h-1, t(T-1)": newey_west_plain,
    "newey-west bandwidth h, fixed-b": lambda x, h: newey_west_fixed_b(x, h, h),
    "newey-west bandwidth 2h, fixed-b": lambda x, h: newey_west_fixed_b(x, h, 2 * h),
    "one non-overlapping sub-sample": one_subsample,
}


def chosen(ics: Sequence[float], days: int) -> bool | None:
    """Return whether the product's verdict finds skill (None: it withholds judgement)."""
    result = ic_verdict(ics, days)
    return None if result.withheld else result.significant


def verdict_rates(world: World, horizons: Sequence[int], prefixes: Sequence[int], runs: int,
                  seed: int) -> list[dict[str, Any]]:
    """Return, per horizon and night count, how often each rule calls skill over ``runs``.

    One simulated run of ``world.nights`` nights serves every shorter night count as its
    first nights, so the rows of one world share their runs.
    """
    rng = np.random.default_rng(seed)
    counts: Counter[tuple[int, int, str]] = Counter()
    withheld: Counter[tuple[int, int]] = Counter()
    for _ in range(runs):
        ics = simulate_ics(world, horizons, rng)
        for days in horizons:
            for nights in prefixes:
                head = ics[days][:nights]
                for name, rule in CANDIDATES.items():
                    counts[days, nights, name] += bool(rule(head, days))
                found = chosen(head, days)
                counts[days, nights, "chosen"] += bool(found)
                withheld[days, nights] += found is None
    rows = []
    for (days, nights, name), hits in sorted(counts.items()):
        rate = hits / runs
        rows.append({"horizon_days": days, "nights": nights, "rule": name, "runs": runs,
                     "rate": rate, "mc_error": math.sqrt(rate * (1 - rate) / runs),
                     "withheld": withheld[(days, nights)] / runs if name == "chosen" else None})
    return rows


def draw_night(rng: np.random.Generator, shares: Sequence[float],
               tickers: int) -> dict[str, int]:
    """Return one night's grade counts drawn from ``shares`` (in RATINGS order)."""
    counts = rng.multinomial(tickers, shares)
    return {r: int(c) for r, c in zip(RATINGS, counts, strict=True)}


def monitor_rates(tickers: int, null: Sequence[float], moved: Sequence[float] | None,
                  runs: int, settings: Settings, seed: int) -> dict[str, float]:
    """Return how often each warning fires on a night drawn from ``moved`` (None: ``null``).

    The reference is ``monitor_trailing_batches`` nights drawn from ``null``, as on a desk
    whose trailing nights were unchanged.
    """
    rng = np.random.default_rng(seed)
    fired: Counter[str] = Counter()
    for i in range(runs):
        trailing = [draw_night(rng, null, tickers)
                    for _ in range(settings.quality.trailing_batches)]
        tonight = draw_night(rng, moved if moved is not None else null, tickers)
        kinds = {f.kind for f in findings(tonight, trailing, settings, seed=i)}
        if kinds:
            fired.update(kinds | {"any"} | ({"moved"} if kinds & MOVED else set()))
    return {kind: count / runs for kind, count in sorted(fired.items())}


def rebaseline_run(tickers: int, before: Sequence[float], after: Sequence[float],
                   nights_before: int, nights_after: int, settings: Settings,
                   seed: int) -> list[list[Finding]]:
    """Return each night's findings over a run whose mix changes for good after a while.

    The references come from ``reference_window`` over the nights so far, as ``check_batch``
    chooses them from the database.
    """
    rng = np.random.default_rng(seed)
    history: list[NightRecord] = []
    out = []
    for night in range(nights_before + nights_after):
        tonight = draw_night(rng, before if night < nights_before else after, tickers)
        window = reference_window(history, settings)
        found = findings(tonight, [r.distribution or {} for r in window.nights], settings,
                         seed=night, moved_run=window.moved_run, batch_id=night)
        history.append(NightRecord.judged(night, tonight, found))
        out.append(found)
    return out
