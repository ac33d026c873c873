"""Report how a batch's samples of the same ticker agree, and how stable their mean is."""

from __future__ import annotations

import itertools
from dataclasses import field
from functools import partial

from pydantic import model_serializer
from pydantic.dataclasses import dataclass
from sqlalchemy import Engine

from app.errors import InputError
from app.quality.averaging import KRow, agreement_by_k, k_values, split_halves
from app.quality.grades import load_grades
from app.quality.repro import BatchSummary, stats_beside, summarize
from app.quality.statistics import PairStats, compare, distribution, mean_defined


@dataclass(frozen=True)
class SamplePair:
    """Sample i against sample j of the same batch, over the tickers."""

    i: int
    j: int
    stats: PairStats

    _flat = model_serializer(mode="wrap")(stats_beside)


# `quality samples --format json`'s schema: raised when a field of SamplesReport changes.
SCHEMA = "quality-samples/1"


@dataclass
class SamplesReport:
    """Agreement among one batch's samples and the split-half stability of their mean; its
    JSON is ``nightdesk quality samples --format json``."""

    batch: BatchSummary
    samples: int
    tickers: list[str]  # tickers with all N samples: the ones compared
    incomplete: list[str]  # tickers with fewer samples than N, left out and named
    sample_distribution: dict[str, int]  # every sample's own rating
    pairs: list[SamplePair]
    mean: dict[str, float | None]
    split_half: list[KRow] = field(default_factory=list)


def samples_report(engine: Engine, batch_id: int, *, resamples: int = 1000) -> SamplesReport:
    """Compare every pair of samples of a batch run with ``--samples N`` (N ≥ 2)."""
    grades = load_grades(engine, batch_id)
    n = grades.samples
    if n < 2:
        raise InputError(
            f"batch {batch_id} has {n} sample(s) per ticker: comparing samples needs a batch "
            "run with --samples 2 or more")
    full = {t: g for t, g in grades.tickers.items() if len(g) >= n}
    tickers = sorted(full)
    pairs = []
    for i, j in itertools.combinations(range(n), 2):
        a = [full[t][i] for t in tickers]
        b = [full[t][j] for t in tickers]
        pairs.append(SamplePair(i, j, compare([g.rating for g in a], [g.rating for g in b],
                                              [g.score for g in a], [g.score for g in b])))
    mean = {name: mean_defined([getattr(p.stats, name) for p in pairs])
            for name in ("agreement", "qwk", "spearman", "flip_rate")}
    return SamplesReport(
        batch=summarize(grades), samples=n, tickers=tickers,
        incomplete=sorted(set(grades.tickers) - set(full)),
        sample_distribution=distribution([g.rating for g in grades.decisions()]),
        pairs=pairs, mean=mean,
        split_half=agreement_by_k(full, full, partial(split_halves, n),
                                  k_values(n, split=True), resamples=resamples),
    )
