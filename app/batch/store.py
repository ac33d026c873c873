"""Write a batch's lifecycle to the database: the batch row, ticker runs, decisions, node texts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import Connection, Engine, ScalarSelect, func, insert, select, update

from agents.decision import contradicts
from agents.graph import TickerResult
from app.db.batchsettings import BatchSettings
from app.db.models import INFRASTRUCTURE, Batch, Decision, LLMCall, NodeText, TickerRun
from app.db.retry import retried, retrying
from app.usage import insert_ignoring_duplicates


def now() -> datetime:
    return datetime.now(UTC)


@dataclass
class DecisionRow:
    ticker: str
    sample: int
    rating: str
    score: float
    confidence: float
    summary: str


def create_batch(engine: Engine, *, kind: str, as_of: date, tickers: list[str], samples: int,
                 settings: BatchSettings, server_facts: dict[str, Any] | None,
                 label: str | None = None, source_batch_id: int | None = None) -> int:
    """Insert the batch (status running) and one queued ticker run per ticker; return its id.

    Retried whole; its start, fixed before the first try, finds the row of a try whose
    commit was stored but not acknowledged (the connection lost): never a second batch."""
    started = now()

    def insert_batch() -> int:
        with engine.begin() as conn:
            stored = conn.execute(select(Batch.id).where(Batch.created_at == started,
                                                         Batch.kind == kind)).scalar()
            if stored is not None:
                return int(stored)
            batch_id = conn.execute(
                insert(Batch).values(
                    kind=kind, label=label, as_of=as_of, status="running", created_at=started,
                    started_at=started, heartbeat_at=now(), settings=settings.stored(),
                    server_facts=server_facts, source_batch_id=source_batch_id,
                    tickers_total=len(tickers), tickers_succeeded=0, tickers_failed=0,
                ).returning(Batch.id)
            ).scalar_one()
            if tickers:
                conn.execute(insert(TickerRun), [
                    {"batch_id": batch_id, "ticker": t, "status": "queued", "attempt": 1,
                     "samples": samples} for t in tickers
                ])
        return int(batch_id)

    return retrying(insert_batch)


@retried
def heartbeat(engine: Engine, batch_id: int) -> None:
    with engine.begin() as conn:
        conn.execute(update(Batch).where(Batch.id == batch_id).values(heartbeat_at=now()))


@retried
def ticker_started(engine: Engine, batch_id: int, ticker: str) -> None:
    with engine.begin() as conn:
        conn.execute(update(TickerRun)
                     .where(TickerRun.batch_id == batch_id, TickerRun.ticker == ticker)
                     .values(status="running", started_at=now()))


@retried
def ticker_finished(engine: Engine, batch_id: int, ticker: str, decisions: list[DecisionRow],
                    error: str | None, failure_class: str | None = None) -> None:
    """Store the ticker's decisions and its final status in one transaction; a failed
    one's ``failure_class`` says whose failure it was (app/batch/faults.py)."""
    rows = [{"batch_id": batch_id, "created_at": now(), **d.__dict__,
             "contradicts": contradicts(d.rating, d.score)} for d in decisions]
    with engine.begin() as conn:
        # The batch's row locked first: two tickers ending at once would each count the
        # other's status before it committed (PostgreSQL's read committed), one lost.
        conn.execute(select(Batch.id).where(Batch.id == batch_id).with_for_update())
        # In the same transaction as the status: never decisions of a ticker not succeeded.
        insert_ignoring_duplicates(conn, Decision.__table__, rows)  # type: ignore[arg-type]
        conn.execute(update(TickerRun)
                     .where(TickerRun.batch_id == batch_id, TickerRun.ticker == ticker)
                     .values(status="failed" if error else "succeeded", finished_at=now(),
                             error=error, failure_class=failure_class if error else None))
        # Counted from the ticker rows, not incremented: a write retried after a lost
        # acknowledgement (a database restart) must not count a ticker twice.
        conn.execute(update(Batch).where(Batch.id == batch_id)
                     .values(heartbeat_at=now(), tickers_succeeded=_count(batch_id, "succeeded"),
                             tickers_failed=_count(batch_id, "failed")))


@retried
def record_outputs(engine: Engine, batch_id: int, results: list[TickerResult]) -> None:
    """Store every node's text of a ticker's samples, numbered in the graph's order
    (``node_outputs``); a repeated store (a resume) adds nothing."""
    at = now()
    rows = [{"batch_id": batch_id, "ticker": result.ticker, "sample": result.sample,
             "node": node, "position": position, "text": out.text,
             "prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
             "finish_reason": out.finish_reason, "attempts": out.attempts, "created_at": at}
            for result in results
            for position, (node, out) in enumerate(result.outputs.items())]
    insert_ignoring_duplicates(engine, NodeText.__table__, rows)  # type: ignore[arg-type]


@retried
def finish_batch(engine: Engine, batch_id: int, status: str, error: str | None = None,
                 extra_settings: dict[str, Any] | None = None) -> None:
    """Write the batch's end. A batch that did not end well always says why: without an
    ``error`` given, its failed tickers' count and the first one's reason."""
    with engine.begin() as conn:
        if not error and status not in ("succeeded", "partial"):
            error = _failures(conn, batch_id)
        values: dict[str, Any] = {"status": status, "finished_at": now(), "error": error}
        if extra_settings:
            current = conn.execute(select(Batch.settings).where(Batch.id == batch_id)).scalar()
            values["settings"] = BatchSettings.read(current).updated(**extra_settings).stored()
        conn.execute(update(Batch).where(Batch.id == batch_id).values(values))
        # A ticker left queued or running did not finish: say so rather than leave it hanging.
        # Not finishing is never the ticker's own verdict: a resume takes it up.
        ended = status in ("succeeded", "partial")
        conn.execute(update(TickerRun)
                     .where(TickerRun.batch_id == batch_id,
                            TickerRun.status.in_(("queued", "running")))
                     .values(status="failed" if ended else "interrupted",
                             failure_class=INFRASTRUCTURE if ended else None,
                             error=error or "not finished"))


def expected_work(engine: Engine, tickers: list[str]) -> dict[str, float]:
    """Return each ticker's tokens in its newest recorded run (0 when never run)."""
    newest = (select(LLMCall.ticker, func.max(LLMCall.batch_id).label("batch_id"))
              .where(LLMCall.ticker.in_(tickers)).group_by(LLMCall.ticker).subquery())
    stmt = (select(LLMCall.ticker,
                   func.sum(func.coalesce(LLMCall.prompt_tokens, 0)
                            + 8 * func.coalesce(LLMCall.completion_tokens, 0)))
            .join(newest, (newest.c.ticker == LLMCall.ticker)
                  & (newest.c.batch_id == LLMCall.batch_id))
            .group_by(LLMCall.ticker))
    with engine.connect() as conn:
        return {t: float(w or 0) for t, w in conn.execute(stmt)}


def _failures(conn: Connection, batch_id: int) -> str:
    """Say in one line how many of the batch's tickers failed, and the first one's reason."""
    failed = conn.execute(select(TickerRun.ticker, TickerRun.error)
                          .where(TickerRun.batch_id == batch_id, TickerRun.status == "failed")
                          .order_by(TickerRun.id)).all()
    total = conn.execute(select(func.count()).select_from(TickerRun)
                         .where(TickerRun.batch_id == batch_id)).scalar_one()
    if not failed:
        return "ended without a reason recorded"
    ticker, reason = failed[0]
    return f"{len(failed)} of {total} tickers failed; first {ticker}: {reason or 'no reason'}"


def _count(batch_id: int, status: str) -> ScalarSelect[int]:
    """Return how many of the batch's ticker rows are in ``status``, as a subquery."""
    return (select(func.count()).select_from(TickerRun)
            .where(TickerRun.batch_id == batch_id, TickerRun.status == status).scalar_subquery())
