"""Reopen a stopped batch where it left off: the point it continues from, its tickers'
status, and its rows set running again (``reopen``). Which batch to resume, and which died,
is the night's to decide (app/runs/resumable.py).

A resume leaves finished tickers as they are; the others continue from their last
checkpointed node. A ticker failed to the infrastructure (app/batch/faults.py) is not
finished: a resume takes it up too. One failed on its own account is, unless the resume is
asked to ``retry_failed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import Engine, func, select, update

from agents.graph import thread_id
from app.db.lock import Runner
from app.db.models import Batch, TickerRun
from app.db.retry import retried
from app.morning import summary as batches

FINISHED_TICKER = batches.FINISHED_TICKER


@dataclass(frozen=True)
class ResumePoint:
    """A batch to continue: what it was, and the tickers it has left."""

    batch_id: int
    kind: str
    as_of: date
    label: str | None
    settings: dict[str, Any]
    tickers: list[str]  # left to do, in the batch's order
    finished: int  # tickers already finished (succeeded, or failed for good)
    status: str  # how it stood before this resume
    infrastructure: int = 0  # of ``tickers``: failed to the infrastructure, taken up again
    retried: int = 0  # of ``tickers``: failed on their own, taken up as asked

    @property
    def total(self) -> int:
        return self.finished + len(self.tickers)


def tickers_left(engine: Engine, batch_id: int) -> list[str]:
    """Return the batch's tickers that did not finish, in its order."""
    with engine.connect() as conn:
        return batches.tickers_left(conn, batch_id)


@retried
def reopen(engine: Engine, point: ResumePoint) -> None:
    """Set the batch running again and its unfinished tickers queued for another attempt."""
    now = datetime.now(UTC)
    with engine.begin() as conn:
        settings = dict(point.settings)
        settings["resumes"] = [*settings.get("resumes", []), now.isoformat()]
        settings["runner"] = Runner.current().model_dump()
        conn.execute(update(Batch).where(Batch.id == point.batch_id)
                     .values(status="running", heartbeat_at=now, finished_at=None, error=None,
                             settings=settings))
        conn.execute(update(TickerRun)
                     .where(TickerRun.batch_id == point.batch_id,
                            TickerRun.ticker.in_(point.tickers))
                     .values(status="queued", error=None, failure_class=None,
                             finished_at=None, attempt=TickerRun.attempt + 1))
        # The failed tickers taken up again are no longer counted failed.
        conn.execute(update(Batch).where(Batch.id == point.batch_id).values(
            tickers_failed=select(func.count()).select_from(TickerRun)
            .where(TickerRun.batch_id == point.batch_id, TickerRun.status == "failed")
            .scalar_subquery()))


def finished_tickers(engine: Engine, batch_id: int) -> tuple[list[str], dict[str, str]]:
    """Return the batch's tickers that succeeded, and those that failed with their error."""
    with engine.connect() as conn:
        rows = conn.execute(select(TickerRun.ticker, TickerRun.status, TickerRun.error)
                            .where(TickerRun.batch_id == batch_id,
                                   TickerRun.status.in_(FINISHED_TICKER))
                            .order_by(TickerRun.id)).all()
    return ([r.ticker for r in rows if r.status == "succeeded"],
            {r.ticker: r.error or "failed" for r in rows if r.status == "failed"})


def threads_of(engine: Engine, batch_id: int) -> list[str]:
    """Return the checkpoint thread of every (ticker, sample) of a batch, but for tickers a
    resume still takes up (failed to the infrastructure): a resume continues those."""
    with engine.connect() as conn:
        rows = conn.execute(select(TickerRun.ticker, TickerRun.samples)
                            .where(TickerRun.batch_id == batch_id)).all()
        left = set(batches.tickers_left(conn, batch_id))
    return [thread_id(batch_id, ticker, s) for ticker, samples in rows if ticker not in left
            for s in range(samples)]
