"""Score a batch's grades against the returns that followed: rank IC, hit rates, buckets.

A ticker's forward return over h sessions is close(h-th trading day after the as-of date) /
close(last trading day on or before it) − 1, from the provider's own price rows after the
as-of date (a snapshot's prices.csv runs past it; the pipeline never sees those rows). With a
benchmark ticker, every figure uses the excess return (ticker − benchmark over the same days).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import date
from typing import Any

import numpy as np
from sqlalchemy import Engine

from agents.data import DataProvider
from agents.decision import RATINGS
from app.errors import DataError, InputError
from app.quality.grades import load_grades
from app.quality.repro import BatchSummary, summarize
from app.quality.statistics import BEARISH, BULLISH, ic_t_statistic, spearman_test

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
    forward_return: float
    excess_return: float | None  # over the benchmark, when one is set


@dataclass(frozen=True)
class Bucket:
    """The tickers of one rating: how many, their mean return, how often the call was right."""

    rating: str
    n: int
    mean_return: float | None
    hit_rate: float | None  # None for Hold (no direction) and for an empty bucket


@dataclass
class ForwardReport:
    """Forward returns of one batch's grades at one horizon."""

    batch: BatchSummary
    horizon_days: int
    benchmark: str | None
    benchmark_return: float | None
    n: int
    rank_ic: float | None
    t_stat: float | None
    p_value: float | None
    hit_rate: float | None  # over every Buy/Overweight/Underweight/Sell
    buckets: list[Bucket]
    tickers: list[TickerReturn]
    missing: dict[str, str] = field(default_factory=dict)  # ticker -> why it has no return

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def forward_return(provider: DataProvider, ticker: str, as_of: date, days: int,
                   ) -> tuple[str, str, float]:
    """Return (start date, end date, return) over ``days`` sessions after ``as_of``.

    DataError saying how many sessions there are when the prices stop too early.
    """
    past = provider.load(ticker, as_of).prices
    ahead = provider.forward_prices(ticker, as_of, days)
    if len(ahead) < days:
        raise DataError(f"only {len(ahead)} of {days} sessions after {as_of}")
    start, end = past.index[-1], ahead.index[days - 1]
    value = float(ahead["close"].iloc[days - 1] / past["close"].iloc[-1] - 1.0)
    return start.date().isoformat(), end.date().isoformat(), value


def forward_report(engine: Engine, provider: DataProvider, batch_id: int, days: int, *,
                   benchmark: str | None = None) -> ForwardReport:
    """Score one batch's consensus grades against the next ``days`` sessions' returns."""
    grades = load_grades(engine, batch_id)
    bench_return = None
    if benchmark:
        try:
            bench_return = forward_return(provider, benchmark, grades.as_of, days)[2]
        except DataError as error:
            raise DataError(f"benchmark {benchmark}: {error}") from None
    rows: list[TickerReturn] = []
    missing = {t: "no decision in this batch" for t in grades.without_decision}
    for ticker in grades.tickers:
        rating, score = grades.consensus(ticker)
        try:
            start, end, value = forward_return(provider, ticker, grades.as_of, days)
        except DataError as error:
            missing[ticker] = str(error).removeprefix(f"{ticker}: ")
            continue
        excess = None if bench_return is None else value - bench_return
        rows.append(TickerReturn(ticker, rating, score, start, end, value, excess))
    target = [r.forward_return if r.excess_return is None else r.excess_return for r in rows]
    ic, p_value = spearman_test([r.score for r in rows], target)
    called = [(r.rating, x) for r, x in zip(rows, target, strict=True)
              if r.rating in BULLISH | BEARISH]
    return ForwardReport(
        batch=summarize(grades), horizon_days=days, benchmark=benchmark,
        benchmark_return=bench_return, n=len(rows), rank_ic=ic,
        t_stat=ic_t_statistic(ic, len(rows)), p_value=p_value,
        hit_rate=_hits(called), buckets=[_bucket(rating, rows, target) for rating in RATINGS],
        tickers=rows, missing=dict(sorted(missing.items())),
    )


def _hit(rating: str, value: float) -> bool:
    return value > 0 if rating in BULLISH else value < 0


def _hits(called: list[tuple[str, float]]) -> float | None:
    return sum(_hit(r, x) for r, x in called) / len(called) if called else None


def _bucket(rating: str, rows: list[TickerReturn], target: list[float]) -> Bucket:
    values = [x for r, x in zip(rows, target, strict=True) if r.rating == rating]
    if not values:
        return Bucket(rating, 0, None, None)
    hit = None if rating == "Hold" else _hits([(rating, x) for x in values])
    return Bucket(rating, len(values), float(np.mean(values)), hit)
