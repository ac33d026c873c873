"""Usage rows with known times: a batch for ``llm_calls`` to point at, calls timed from T0;
and what a batch is told when its usage writer stops."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from sqlalchemy import Engine

from app.db.models import Batch, LLMCall
from app.errors import BatchStopped
from app.usage import UsageRecorder

T0 = datetime(2025, 3, 4, 22, 0, 0, tzinfo=UTC)


def new_batch(engine: Engine) -> int:
    """Insert a batch row (llm_calls point at it) and return its id."""
    with engine.begin() as conn:
        result = conn.execute(Batch.__table__.insert().values(  # type: ignore[attr-defined]
            kind="bench", as_of=date(2025, 1, 2), status="running",
            created_at=datetime.now(UTC), settings={}, tickers_total=0,
            tickers_succeeded=0, tickers_failed=0))
        return int(result.inserted_primary_key[0])


def add_call(engine: Engine, batch_id: int, node: str, attempt: int, start_s: float,
             end_s: float, *, prompt: int | None, completion: int | None,
             status: str = "ok") -> None:
    """Insert one llm_calls row whose times are offsets from T0."""
    with engine.begin() as conn:
        conn.execute(LLMCall.__table__.insert().values(  # type: ignore[attr-defined]
            batch_id=batch_id, ticker="AAPL", node=node, sample=0, attempt=attempt,
            model="m", prompt_tokens=prompt, completion_tokens=completion, status=status,
            error_class=None if status == "ok" else "http",
            http_status=None if status == "ok" else 500,
            started_at=T0 + timedelta(seconds=start_s), ended_at=T0 + timedelta(seconds=end_s),
            latency_s=end_s - start_s))


def known_batch(engine: Engine) -> int:
    """Insert calls spanning 10 s to 50 s after T0 (a 40 s makespan) with 1000 output tokens."""
    b = new_batch(engine)
    add_call(engine, b, "analyst", 1, 10.0, 12.0, prompt=100, completion=200)
    add_call(engine, b, "analyst", 2, 12.0, 16.0, prompt=100, completion=300)
    add_call(engine, b, "trader", 1, 20.0, 21.0, prompt=50, completion=None, status="error")
    add_call(engine, b, "trader", 2, 25.0, 50.0, prompt=150, completion=500)
    return b


async def told(recorder: UsageRecorder, into: list[BatchStopped]) -> None:
    """Wait as a batch does (beside its work) for ``recorder`` to stop; add why to ``into``."""
    await recorder.stopped.wait()
    assert recorder.lost is not None
    into.append(recorder.lost)
