"""What a batch was and how it went, from its rows: status, as-of, tickers n/m, duration,
and the tickers that did not succeed with their errors.

One summary for ``nightdesk batches``, the head of ``nightdesk report``, the morning digest
and the metrics, so they all say the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, PlainSerializer
from sqlalchemy import Engine, select

from app.db.models import Batch, TickerRun
from app.errors import InputError

# Ticker states that are no failure: done, or not reached yet by a batch still running.
NOT_FAILED = ("succeeded", "queued", "running")


def duration_s(started_at: datetime | None, finished_at: datetime | None,
               heartbeat_at: datetime | None) -> float | None:
    """Return a batch's duration: start to finish, or to the last heartbeat while it runs;
    None before it started. The one definition every page, command and digest shows."""
    end = finished_at or heartbeat_at
    if end is None or started_at is None:
        return None
    return (end - started_at).total_seconds()


def _iso(value: date) -> str:
    return value.isoformat()


IsoDate = Annotated[date, PlainSerializer(_iso, return_type=str, when_used="json")]
"""A date (``IsoDatetime``: a time with its offset) written by ``isoformat()`` in JSON.

nightdesk's JSON writes UTC as ``+00:00``, not as pydantic's ``Z``: every model of its
JSON types its dates and times with these two."""
IsoDatetime = Annotated[datetime, PlainSerializer(_iso, return_type=str, when_used="json")]


class BatchSummary(BaseModel):
    """One batch as the operator reads it: ``nightdesk batches``, the head of ``report``,
    every page's and ``/api/…``'s batch, the digest and the metrics (one serializer: the
    model's JSON, its fields in this order). ``duration_s``: see ``duration_s()``;
    ``tickers``: "n/m", tickers succeeded of tickers planned."""

    model_config = ConfigDict(frozen=True)

    id: int
    kind: str
    label: str | None
    status: str
    as_of: IsoDate
    created_at: IsoDatetime | None
    started_at: IsoDatetime | None
    finished_at: IsoDatetime | None
    heartbeat_at: IsoDatetime | None
    duration_s: float | None
    tickers: str
    tickers_total: int
    tickers_succeeded: int
    tickers_failed: int
    error: str | None
    demo: bool  # the engine marks batches run on DEMO data
    samples: int | None
    model: str | None
    server_profile: str | None
    strategy: str | None
    source_batch_id: int | None  # a replay's recorded batch

    @classmethod
    def csv_fields(cls) -> tuple[str, ...]:
        return tuple(cls.model_fields)

    def to_csv(self) -> dict[str, str | int | float | bool]:
        """Return one CSV row: the JSON fields, None as an empty cell."""
        data = self.model_dump(mode="json")
        return {key: "" if value is None else value for key, value in data.items()}


@dataclass(frozen=True)
class FailedTicker:
    ticker: str
    status: str  # failed | interrupted
    error: str | None


def summarize(batch: Any) -> BatchSummary:
    """Return the summary of a ``batches`` row (an ORM object or a selected row)."""
    settings = batch.settings or {}
    return BatchSummary(
        id=batch.id, kind=batch.kind, label=batch.label, status=batch.status,
        as_of=batch.as_of, created_at=batch.created_at, started_at=batch.started_at,
        finished_at=batch.finished_at, heartbeat_at=batch.heartbeat_at,
        duration_s=duration_s(batch.started_at, batch.finished_at, batch.heartbeat_at),
        tickers=f"{batch.tickers_succeeded or 0}/{batch.tickers_total or 0}",
        tickers_total=batch.tickers_total or 0,
        tickers_succeeded=batch.tickers_succeeded or 0,
        tickers_failed=batch.tickers_failed or 0, error=batch.error,
        demo=bool(settings.get("demo_data")), samples=settings.get("samples"),
        model=settings.get("model"), server_profile=settings.get("server_profile"),
        strategy=settings.get("strategy"), source_batch_id=batch.source_batch_id)


def batch_summary(engine: Engine, batch_id: int) -> BatchSummary:
    """Return one batch's summary; InputError when there is no such batch."""
    with engine.connect() as conn:
        row = conn.execute(select(Batch).where(Batch.id == batch_id)).first()
    if row is None:
        raise InputError(f"no batch with id {batch_id}")
    return summarize(row)


def list_batches(engine: Engine, limit: int = 20, kind: str | None = None
                 ) -> list[BatchSummary]:
    """Return the newest ``limit`` batches (of ``kind`` when given), newest first."""
    stmt = select(Batch).order_by(Batch.id.desc()).limit(limit)
    if kind is not None:
        stmt = stmt.where(Batch.kind == kind)
    with engine.connect() as conn:
        return [summarize(row) for row in conn.execute(stmt)]


def failed_tickers(engine: Engine, batch_id: int) -> list[FailedTicker]:
    """Return the batch's tickers that ended without a result, with the error recorded.

    Tickers still queued or running in a batch that runs are not failures and are left out.
    """
    with engine.connect() as conn:
        rows = conn.execute(select(TickerRun.ticker, TickerRun.status, TickerRun.error)
                            .where(TickerRun.batch_id == batch_id,
                                   TickerRun.status.not_in(NOT_FAILED))
                            .order_by(TickerRun.ticker)).all()
    return [FailedTicker(r.ticker, r.status, r.error) for r in rows]
