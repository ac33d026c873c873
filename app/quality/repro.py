"""Report how well two or more batches of the same tickers reproduce each other's grades."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pydantic
from pydantic import SerializerFunctionWrapHandler, model_serializer
from sqlalchemy import Engine

from app.quality.averaging import KRow, agreement_by_k, between, k_values
from app.quality.grades import BatchGrades, load_grades
from app.quality.statistics import (
    PairStats,
    compare,
    distribution,
    mean_defined,
    spearman_brown,
)


@dataclass(frozen=True)
class BatchSummary:
    """One batch as the quality reports describe it."""

    batch_id: int
    kind: str
    as_of: str
    status: str
    samples: int
    tickers: int  # tickers with a decision
    without_decision: list[str]
    distribution: dict[str, int]  # the tickers' consensus ratings
    decisions: int  # sample rows
    contradicting: int  # sample rows whose rating contradicts their own score
    demo: bool  # the batch ran on synthetic DEMO data


def summarize(grades: BatchGrades) -> BatchSummary:
    """Describe a batch: its grade distribution and how many decisions contradict themselves."""
    rows = grades.decisions()
    return BatchSummary(
        batch_id=grades.batch_id, kind=grades.kind, as_of=grades.as_of.isoformat(),
        status=grades.status, samples=grades.samples, tickers=len(grades.tickers),
        without_decision=grades.without_decision,
        distribution=distribution([grades.consensus(t)[0] for t in grades.tickers]),
        decisions=len(rows), contradicting=sum(g.contradicts for g in rows),
        demo=grades.settings.demo_data,
    )


def stats_beside(self: Any, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
    """Write a pair's statistics beside its two ids (``a`` and ``b``, ``i`` and ``j``),
    not nested."""
    data = handler(self)
    stats = data.pop("stats")
    return {**data, **stats}


@pydantic.dataclasses.dataclass(frozen=True)
class PairRow:
    """Two batches compared on their common tickers, each ticker's grade over all samples."""

    a: int
    b: int
    stats: PairStats

    _flat = model_serializer(mode="wrap")(stats_beside)


# `quality repro --format json`'s schema: raised when a field of ReproReport changes.
SCHEMA = "quality-repro/1"


@pydantic.dataclasses.dataclass
class ReproReport:
    """Agreement between batches, pair by pair, their mean, and (with samples) by k; its
    JSON is ``nightdesk quality repro --format json``."""

    batches: list[BatchSummary]
    common: list[str]
    only_in: dict[int, list[str]]
    pairs: list[PairRow]
    mean: dict[str, float | None]
    by_k: list[KRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def repro(engine: Engine, batch_ids: list[int], *, resamples: int = 1000) -> ReproReport:
    """Compare the batches' grades over the tickers every one of them graded."""
    loaded = [load_grades(engine, i) for i in batch_ids]
    common = sorted(set.intersection(*(set(g.tickers) for g in loaded)))
    notes = []
    if len({g.as_of for g in loaded}) > 1:
        notes.append("the batches have different as-of dates: differences mix noise with "
                     "changed inputs")
    if all(g.settings.request_seeds for g in loaded):
        notes.append("every batch sent per-call seeds, which derive from (ticker, node, "
                     "sample): the same sample index repeats the same random draws, so these "
                     "are not independent runs and their agreement may be overstated; measure "
                     "with NIGHTDESK_REQUEST_SEEDS=false")
    if not common:
        notes.append("no ticker was graded by every batch: nothing to compare")
    pairs = []
    for a, b in itertools.combinations(loaded, 2):
        left = [a.consensus(t) for t in common]
        right = [b.consensus(t) for t in common]
        pairs.append(PairRow(a.batch_id, b.batch_id, compare(
            [r for r, _ in left], [r for r, _ in right],
            [s for _, s in left], [s for _, s in right])))
    mean = {name: mean_defined([getattr(p.stats, name) for p in pairs])
            for name in ("agreement", "qwk", "spearman", "flip_rate")}
    report = ReproReport(
        batches=[summarize(g) for g in loaded], common=common,
        only_in={g.batch_id: sorted(set(g.tickers) - set(common)) for g in loaded},
        pairs=pairs, mean=mean, notes=notes,
    )
    fewest = min(g.samples for g in loaded)
    if fewest > 1 and common:
        report.by_k = _by_k(loaded, fewest, resamples)
    return report


def _by_k(loaded: list[BatchGrades], samples: int, resamples: int) -> list[KRow]:
    """Average the by-k rows over every pair of batches."""
    per_pair = [
        agreement_by_k(a.tickers, b.tickers, partial(between, samples, samples),
                       k_values(samples, split=False), resamples=resamples)
        for a, b in itertools.combinations(loaded, 2)
    ]
    if len(per_pair) == 1:
        return per_pair[0]
    # Several pairs: the mean of each figure over pairs; an interval does not average, so
    # none is given (run the pairs one by one for theirs).
    rows: list[KRow] = []
    for same_k in zip(*per_pair, strict=True):
        first = same_k[0]
        qwk = mean_defined([r.qwk for r in same_k])
        rho = mean_defined([r.spearman for r in same_k])
        errors = [r.choice_error for r in same_k]
        rows.append(KRow(
            k=first.k, choices=sum(r.choices for r in same_k),
            exhaustive=all(r.exhaustive for r in same_k),
            # The mean of independent estimates: its error is the root sum of squares / pairs.
            choice_error=None if None in errors else
            math.sqrt(sum(e * e for e in errors if e is not None)) / len(errors),
            n=min(r.n for r in same_k),
            agreement=mean_defined([r.agreement for r in same_k]), qwk=qwk, qwk_ci=None,
            spearman=rho, spearman_ci=None,
            spearman_predicted=spearman_brown(rows[0].spearman, first.k) if rows else None,
            qwk_predicted=spearman_brown(rows[0].qwk, first.k) if rows else None,
        ))
    return rows
