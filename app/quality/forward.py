"""Score a batch's grades against the returns that followed: rank IC, hit rates, buckets.

A ticker's forward return over h sessions is close(h-th trading day after the as-of date) /
close(last trading day on or before it) − 1, from the provider's own price rows after the
as-of date (a snapshot's prices.csv runs past it; the pipeline never sees those rows). With a
benchmark ticker, every figure uses the excess return (ticker − benchmark over the same days).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date

import numpy as np
import pydantic
from sqlalchemy import Engine

from agents.data import DataProvider
from agents.data.base import Closes
from agents.decision import RATINGS
from app.errors import DataError, InputError
from app.quality.grades import BatchGrades, load_grades
from app.quality.repro import BatchSummary, summarize
from app.quality.statistics import direction, finite, ic_test, spearman

HORIZON = re.compile(r"^([1-9][0-9]{0,2})d$")


def parse_horizon(text: str) -> int:
    """Return the sessions in a horizon like ``5d`` or ``20d``; InputError otherwise."""
    found = HORIZON.fullmatch(text.strip().lower())
    if found is None:
        raise InputError(f"--horizon takes trading days like 5d or 20d (got {text!r})")
    return int(found.group(1))


@dataclass(frozen=True)
class TickerReturn:
    """One ticker's grade and what its price did next."""

    ticker: str
    rating: str
    score: float
    start: str  # the last session on or before the as-of date
    end: str  # the h-th session after it
    forward_return: float | None  # None: undefined (the start close is not a positive price)
    excess_return: float | None  # over the benchmark, when one is set and the return defined


@dataclass(frozen=True)
class Bucket:
    """The tickers of one rating: how many, their mean return, how often the call was right."""

    rating: str
    n: int
    mean_return: float | None
    hit_rate: float | None  # None for Hold (no direction) and for an empty bucket


# `quality forward --format json`'s schema: raised when a field of ForwardReport changes.
SCHEMA = "quality-forward/1"


@pydantic.dataclasses.dataclass
class ForwardReport:
    """Forward returns of one batch's grades at one horizon."""

    batch: BatchSummary
    horizon_days: int
    benchmark: str | None
    benchmark_return: float | None
    n: int  # tickers with a defined forward return: the ones every figure is over
    rank_ic: float | None
    t_stat: float | None
    p_value: float | None
    hit_rate: float | None  # over every Buy/Overweight/Underweight/Sell
    buckets: list[Bucket]
    tickers: list[TickerReturn]
    missing: dict[str, str] = field(default_factory=dict)  # ticker -> why it has no return


class PriceCache:
    """Each (ticker, as-of date)'s closes, read from the provider once for every horizon.

    A report over many nights and horizons asks for the same prices again and again. Only
    the closes are read (``DataProvider.closes``: no indicators, news or fundamentals). Read
    failures are kept too, so a missing ticker is reported the same way at every horizon.
    """

    def __init__(self, provider: DataProvider, longest: int) -> None:
        self.provider = provider
        self.longest = longest
        self._seen: dict[tuple[str, date], Closes | DataError] = {}

    def closes(self, ticker: str, as_of: date) -> Closes:
        """Return the ticker's closes around ``as_of``; DataError when they cannot be read."""
        key = (ticker, as_of)
        if key not in self._seen:
            try:
                self._seen[key] = self.provider.closes(ticker, as_of, self.longest)
            except DataError as error:
                self._seen[key] = error
        found = self._seen[key]
        if isinstance(found, DataError):
            raise found
        return found

    def forward_return(self, ticker: str, as_of: date, days: int,
                       ) -> tuple[str, str, float | None]:
        """Return (start date, end date, return) over ``days`` sessions after ``as_of``.

        The return is None (undefined) when the start close is not a positive finite price
        — a zero close would make it infinite — or the end close is not finite. DataError
        saying how many sessions there are when the prices stop too early.
        """
        if days > self.longest:
            raise ValueError(f"{days} sessions asked of a cache of {self.longest}")
        found = self.closes(ticker, as_of)
        if len(found.ahead) < days:
            raise DataError(f"only {len(found.ahead)} of {days} sessions after {as_of}")
        end, last = found.ahead[days - 1]
        first = found.close
        value = last / first - 1.0 if first > 0 and math.isfinite(first) else None
        return found.start.isoformat(), end.isoformat(), finite(value)


def benchmark_return(prices: PriceCache, benchmark: str, as_of: date, days: int) -> float:
    """Return the benchmark's return over the horizon; InputError (exit 2) naming it once."""
    try:
        start, _, value = prices.forward_return(benchmark, as_of, days)
    except DataError as error:
        raise InputError(f"benchmark {benchmark}: "
                         f"{str(error).removeprefix(f'{benchmark}: ')}") from None
    if value is None:
        raise InputError(f"benchmark {benchmark}: return undefined (close on {start} is not a "
                         "positive price)")
    return value


def ticker_returns(prices: PriceCache, grades: BatchGrades, days: int,
                   bench_return: float | None) -> tuple[list[TickerReturn], dict[str, str]]:
    """Return each graded ticker's forward return, and why the others have none."""
    rows: list[TickerReturn] = []
    missing = {t: "no decision in this batch" for t in grades.without_decision}
    for ticker in grades.tickers:
        rating, score = grades.consensus(ticker)
        try:
            start, end, value = prices.forward_return(ticker, grades.as_of, days)
        except DataError as error:
            missing[ticker] = str(error).removeprefix(f"{ticker}: ")
            continue
        excess = None if bench_return is None or value is None else value - bench_return
        rows.append(TickerReturn(ticker, rating, score, start, end, value, excess))
    return rows, dict(sorted(missing.items()))


def scored(rows: list[TickerReturn]) -> tuple[list[TickerReturn], list[float]]:
    """Return the rows whose return is defined and the return each is judged by."""
    kept, target = [], []
    for r in rows:
        value = r.forward_return if r.excess_return is None else r.excess_return
        if value is not None:
            kept.append(r)
            target.append(value)
    return kept, target


def forward_report(engine: Engine, provider: DataProvider, batch_id: int, days: int, *,
                   benchmark: str | None = None) -> ForwardReport:
    """Score one batch's consensus grades against the next ``days`` sessions' returns."""
    grades = load_grades(engine, batch_id)
    prices = PriceCache(provider, days)
    bench_return = (benchmark_return(prices, benchmark, grades.as_of, days)
                    if benchmark else None)
    rows, missing = ticker_returns(prices, grades, days, bench_return)
    kept, target = scored(rows)
    ic = spearman([r.score for r in kept], target)
    t_stat, p_value = ic_test([r.score for r in kept], target)
    return ForwardReport(
        batch=summarize(grades), horizon_days=days, benchmark=benchmark,
        benchmark_return=bench_return, n=len(kept), rank_ic=ic, t_stat=t_stat,
        p_value=p_value, hit_rate=hit_rate([r.rating for r in kept], target),
        buckets=[bucket(rating, [r.rating for r in kept], target) for rating in RATINGS],
        tickers=rows, missing=missing,
    )


def directional_hits(ratings: Sequence[str], target: Sequence[float]) -> tuple[int, int]:
    """Return (hits, calls): the non-Hold ratings, and those whose return had their sign."""
    called = [direction(r) * x > 0 for r, x in zip(ratings, target, strict=True)
              if direction(r)]
    return sum(called), len(called)


def hit_rate(ratings: Sequence[str], target: Sequence[float]) -> float | None:
    """Return the share of directional calls (non-Hold) whose return had their sign."""
    hits, calls = directional_hits(ratings, target)
    return hits / calls if calls else None


def bucket(rating: str, ratings: list[str], target: list[float]) -> Bucket:
    """Return one rating's tickers: how many, their mean return, their hit rate."""
    values = [x for r, x in zip(ratings, target, strict=True) if r == rating]
    if not values:
        return Bucket(rating, 0, None, None)
    hit = None if rating == "Hold" else hit_rate([rating] * len(values), values)
    return Bucket(rating, len(values), float(np.mean(values)), hit)
