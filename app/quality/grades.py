"""Read a batch's decisions as grades, and turn a ticker's samples into one rating and score.

One grading rule for any number of samples: the score is the mean of the samples' scores
and the rating is the band of that mean (agents.decision.SCORE_BANDS), so the ranking's
order and the rating never contradict (docs/quality.md, "Score bands"). The model's own
rating stays on the decision row, and a row whose rating contradicts its score is flagged.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from agents.decision import contradicts, rating_for_score
from app.db.batchsettings import BatchSettings
from app.db.models import (
    FINISHED_STATUSES,
    Batch,
    Decision,
    TickerRun,
    batch_row,
    nights_newest_first,
)
from app.errors import InputError, NoNightYet


@dataclass(frozen=True)
class Grade:
    """One sample's decision, as the quality reports need it."""

    sample: int
    rating: str
    score: float
    contradicts: bool


@dataclass
class BatchGrades:
    """Every decision of one batch, per ticker in sample order."""

    batch_id: int
    kind: str
    as_of: date
    status: str
    settings: BatchSettings
    tickers: dict[str, list[Grade]] = field(default_factory=dict)
    """Tickers with at least one decision, sorted; their grades sorted by sample."""
    without_decision: list[str] = field(default_factory=list)
    """Tickers of the batch that produced no decision (failed, interrupted)."""

    @property
    def samples(self) -> int:
        """Return the most samples any ticker has (the batch's N)."""
        return max((len(g) for g in self.tickers.values()), default=0)

    def consensus(self, ticker: str) -> tuple[str, float]:
        """Return the ticker's rating and score over all its samples."""
        return consensus(self.tickers[ticker])

    def decisions(self) -> list[Grade]:
        """Return every sample's grade, ticker by ticker."""
        return [g for grades in self.tickers.values() for g in grades]


def consensus(grades: Sequence[Grade]) -> tuple[str, float]:
    """Return (band of the mean score, mean score), whatever the number of samples."""
    if not grades:
        raise ValueError("no grades to aggregate")
    mean = statistics.fmean(g.score for g in grades)
    return rating_for_score(mean), mean


def load_grades(engine: Engine, batch_id: int) -> BatchGrades:
    """Read one batch's decisions; InputError when there is no such batch."""
    batch = batch_row(engine, batch_id)
    with engine.connect() as conn:
        rows = conn.execute(select(Decision.ticker, Decision.sample, Decision.rating,
                                   Decision.score, Decision.contradicts)
                            .where(Decision.batch_id == batch_id)
                            .order_by(Decision.ticker, Decision.sample)).all()
        planned = conn.execute(select(TickerRun.ticker)
                               .where(TickerRun.batch_id == batch_id)).scalars().all()
    grades = BatchGrades(batch.id, batch.kind, batch.as_of, batch.status,
                         BatchSettings.read(batch.settings))
    for row in rows:
        # A row written before the bands existed has no stored verdict: judge it now.
        flag = row.contradicts if row.contradicts is not None else contradicts(row.rating,
                                                                               row.score)
        grades.tickers.setdefault(row.ticker, []).append(
            Grade(row.sample, row.rating, row.score, bool(flag)))
    grades.without_decision = sorted(set(planned) - set(grades.tickers))
    return grades


def newest_nightly(engine: Engine, count: int) -> list[int]:
    """Return the ids of the newest ``count`` finished nightly batches of one as-of date.

    They share the as-of date of the newest one, so they saw the same inputs. InputError
    when there are fewer.
    """
    with Session(engine) as session:
        rows = session.scalars(nights_newest_first(Batch.status.in_(FINISHED_STATUSES))).all()
    if not rows:
        raise NoNightYet("no finished nightly batch yet")
    same = [r.id for r in rows if r.as_of == rows[0].as_of][:count]
    if len(same) < count:
        raise InputError(
            f"needs {count} finished nightly batches of as-of {rows[0].as_of}, found "
            f"{len(same)}: run the same universe again, or name batches with --batches")
    return sorted(same)


def newest_batch(engine: Engine) -> int:
    """Return the id of the night the ranking shows (``nights_newest_first``, finished);
    InputError when there is none."""
    with Session(engine) as session:
        found = session.scalars(nights_newest_first(Batch.status.in_(FINISHED_STATUSES))
                                .limit(1)).first()
    if found is None:
        raise NoNightYet("no finished nightly batch yet")
    return found.id
