"""Rank a finished nightly batch's tickers by mean decision score, with newer reruns applied."""

from __future__ import annotations

import statistics
from collections import defaultdict

from pydantic import BaseModel
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from agents.decision import contradicts
from app.db.batchsettings import BatchSettings
from app.db.models import (
    FINISHED_STATUSES,
    Batch,
    Decision,
    TickerRun,
    batch_row,
    nights_newest_first,
)
from app.errors import NoNightYet
from app.morning.summary import applied_reruns, plain_error
from app.quality.grades import Grade, consensus

RATING_ORDER = ("Buy", "Overweight", "Hold", "Underweight", "Sell")


class RankRow(BaseModel):
    """One ticker of a ranked night. The one definition of a ranking row's fields: the rows
    ``app.morning.changes.RankedRow`` and ``app.morning.views.HistoryPoint`` serve extend
    it, so a field added here appears in their JSON too, in this order. No field has a
    default, so the API schema keeps listing every one as required."""

    rank: int | None
    ticker: str
    rating: str | None
    score: float | None
    confidence: float | None
    summary: str
    batch_id: int
    samples: int
    spread: float | None  # max − min score over samples: how much the samples disagree
    status: str
    contradicting: int  # samples whose own rating contradicts their own score


def _newest_finished(session: Session) -> Batch | None:
    """Return the newest finished nightly batch of the latest as-of date that has one."""
    # A partial night still ranks what it has (and lists what it lacks).
    return session.scalars(nights_newest_first(Batch.status.in_(FINISHED_STATUSES))
                           .limit(1)).first()


def _pick_batch(engine: Engine, batch_id: int | None) -> Batch:
    if batch_id is not None:
        return batch_row(engine, batch_id)
    with Session(engine) as session:
        found = _newest_finished(session)
    if found is None:
        raise NoNightYet("no finished nightly batch yet")
    return found


def ranked_night(engine: Engine) -> int | None:
    """Return the id of the batch the ranking shows by default (None: no finished night)."""
    with Session(engine) as session:
        found = _newest_finished(session)
        return None if found is None else found.id


def earlier_nights(engine: Engine, batch_id: int) -> list[tuple[int, bool]]:
    """Return the finished nightly batches of as-of dates before ``batch_id``'s, in the one
    order of nights (the night before first), each with whether it ran on DEMO data."""
    current = batch_row(engine, batch_id)
    with Session(engine) as session:
        return [(b.id, BatchSettings.read(b.settings).demo_data) for b in session.scalars(
            nights_newest_first(Batch.status.in_(FINISHED_STATUSES),
                                Batch.as_of < current.as_of))]


def _aggregate(ticker: str, batch_id: int, decisions: list[Decision], status: str,
               error: str | None) -> RankRow:
    if not decisions:
        return RankRow(rank=None, ticker=ticker, rating=None, score=None, confidence=None,
                       summary=error or "no decision", batch_id=batch_id, samples=0,
                       spread=None, status=status, contradicting=0)
    scores = [d.score for d in decisions]
    # One sample: the model's own rating; several: the band of the mean (app.quality.grades).
    rating, mean = consensus([Grade(d.sample, d.rating, d.score, False) for d in decisions])
    nearest = min(decisions, key=lambda d: abs(d.score - mean))
    return RankRow(
        rank=None, ticker=ticker, rating=rating, score=round(mean, 4),
        confidence=round(statistics.fmean(d.confidence for d in decisions), 4),
        summary=" ".join(nearest.summary.split())[:160], batch_id=batch_id,
        samples=len(decisions), spread=round(max(scores) - min(scores), 4), status=status,
        contradicting=sum(bool(d.contradicts) if d.contradicts is not None
                          else contradicts(d.rating, d.score) for d in decisions),
    )


def ranking(engine: Engine, batch_id: int | None = None) -> tuple[Batch, list[RankRow]]:
    """Return the batch ranked by mean score; failed tickers are listed last, never dropped."""
    batch = _pick_batch(engine, batch_id)
    with Session(engine) as conn:
        runs = {r.ticker: r for r in conn.execute(
            select(TickerRun).where(TickerRun.batch_id == batch.id)).scalars()}
        decisions: dict[str, list[Decision]] = defaultdict(list)
        for d in conn.execute(select(Decision).where(Decision.batch_id == batch.id)).scalars():
            decisions[d.ticker].append(d)
        rows = {t: _aggregate(t, batch.id, decisions[t], r.status, plain_error(r.error))
                for t, r in runs.items()}
        if batch.kind == "nightly":
            reruns = conn.execute(applied_reruns(batch.id, batch.as_of)).scalars().all()
            for rerun in reruns:
                for d_ticker in {d.ticker for d in conn.execute(
                        select(Decision).where(Decision.batch_id == rerun.id)).scalars()}:
                    if d_ticker in rows:
                        ds = list(conn.execute(select(Decision).where(
                            Decision.batch_id == rerun.id, Decision.ticker == d_ticker)).scalars())
                        rows[d_ticker] = _aggregate(d_ticker, rerun.id, ds, "succeeded", None)
    ranked = sorted((r for r in rows.values() if r.score is not None),
                    key=lambda r: (-(r.score or 0.0), r.ticker))
    for i, row in enumerate(ranked, 1):
        row.rank = i
    failed = sorted((r for r in rows.values() if r.score is None), key=lambda r: r.ticker)
    return batch, ranked + failed


def from_reruns(batch_id: int, rows: list[RankRow]) -> list[str]:
    """Name each row of batch ``batch_id``'s ranking whose result a rerun gave: ``A from
    rerun #5``, as every face says it (``ranking``'s "reruns applied", the page's)."""
    return [f"{r.ticker} from rerun #{r.batch_id}" for r in rows if r.batch_id != batch_id]

