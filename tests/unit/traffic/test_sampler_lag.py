"""How far behind the client's own event loop fell: measured by the sampler, told by the report."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from rich.console import Console
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import Session

from app.cli.report import render_table
from app.db.models import Base, Batch, ServerSample
from app.morning.accounting import batch_report
from app.morning.serverview import server_view
from app.traffic.sampler import LAG_PROBE_S, MetricsSampler
from tests.unit.support.call_rows import T0, known_batch
from tests.unit.support.metrics_transport import transport
from tests.unit.support.servers import read_servers


def _batch(engine: Engine) -> int:
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        batch = Batch(kind="nightly", as_of=date(2026, 1, 2), created_at=datetime.now(UTC))
        session.add(batch)
        session.commit()
        return batch.id


async def _sample(sampler: MetricsSampler, reads: list[str], until: int,
                  block_s: float = 0.0) -> None:
    async with read_servers(sampler).taking():  # its server takes the readings
        while len(reads) < until:
            await asyncio.sleep(0.01)
        # What a client busy with its streams does to everything else on its loop.
        time.sleep(block_s)
        start = len(reads)
        while len(reads) < start + 2:
            await asyncio.sleep(0.01)


@pytest.mark.slow
async def test_a_blocked_loop_shows_as_lag_on_the_next_reading(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    calm_id, busy_id = _batch(engine), _batch(engine)  # each sampler's rows, apart
    reads: list[str] = []
    async with httpx.AsyncClient(transport=transport(seen=reads)) as client:
        calm = MetricsSampler("http://x/v1", engine, calm_id, interval_s=0.05, client=client)
        await _sample(calm, reads, 3)
        busy = MetricsSampler("http://x/v1", engine, busy_id, interval_s=0.05, client=client)
        await _sample(busy, reads, len(reads) + 2, block_s=1.5)
    with Session(engine) as session:
        lags = session.scalars(select(ServerSample.client_lag_s)
                               .order_by(ServerSample.id)).all()
        # The most lag each sampler measured (every measure goes into its next row).
        lag_max = dict(session.execute(
            select(ServerSample.batch_id, func.max(ServerSample.client_lag_s))
            .group_by(ServerSample.batch_id)).tuples().all())
    assert None not in lags
    # The loop stood still for 1.5 s; the lag probe was due within its 0.25 s period.
    assert lag_max[busy_id] >= 1.5 - LAG_PROBE_S and max(lags) >= 1.5 - LAG_PROBE_S
    assert lag_max[calm_id] < 1.0


def _reading(engine: Engine, batch_id: int, at_s: float, lag: float | None) -> None:
    with engine.begin() as conn:
        conn.execute(ServerSample.__table__.insert().values(  # type: ignore[attr-defined]
            batch_id=batch_id, sampled_at=T0 + timedelta(seconds=at_s), running=50.0,
            waiting=0.0, kv_cache_usage=0.2, preemptions_total=0.0, prompt_tokens_total=0.0,
            generation_tokens_total=0.0, client_lag_s=lag))


def test_the_report_says_when_the_client_fell_behind(sqlite_engine: Engine) -> None:
    # The H200 night's first minute: one reading 45 s late, the rest on time.
    b = known_batch(sqlite_engine)
    for i, lag in enumerate([0.01, 0.02, 44.9, 1.2, 0.03]):
        _reading(sqlite_engine, b, float(i), lag)
    view = server_view(sqlite_engine, b)
    assert (view.client_lag_max_s, view.client_lag_readings_over_1s) == (44.9, 2)
    console = Console(width=300, record=True)
    render_table(batch_report(sqlite_engine, b), view, console)
    assert "44.90 s (2 readings over 1 s: the client fell behind its streams" in (
        console.export_text())


def _served_with(engine: Engine, batch_id: int, command: str | None) -> None:
    with engine.begin() as conn:
        conn.execute(Batch.__table__.update().where(  # type: ignore[attr-defined]
            Batch.id == batch_id).values(server_facts={"command": command} if command else None))


@pytest.mark.parametrize(("command", "advised"), [
    # make run's server (serving/profiles/cpu-tiny.toml): the flag is already there.
    ("python -m vllm.entrypoints.openai.api_server --port 18500 --stream-interval 16", False),
    ("vllm serve m --stream-interval=32", False),
    ("vllm serve m --max-num-seqs 8", True),  # vLLM's default: every token
    ("vllm serve m --stream-interval 4", True),
    (None, True),  # not recorded (a server elsewhere): the advice may hold
])
def test_the_lag_advises_the_stream_interval_only_to_a_server_without_it(
        sqlite_engine: Engine, command: str | None, advised: bool) -> None:
    b = known_batch(sqlite_engine)
    _served_with(sqlite_engine, b, command)
    for i, lag in enumerate([0.01, 1.3]):
        _reading(sqlite_engine, b, float(i), lag)
    console = Console(width=300, record=True)
    render_table(batch_report(sqlite_engine, b), server_view(sqlite_engine, b), console)
    text = console.export_text()
    assert "1.30 s (1 reading over 1 s: the client fell behind its streams" in text
    assert ("start the server with --stream-interval 16" in text) is advised
    assert ("the server already ran with --stream-interval" in text) is not advised


def test_rows_from_before_the_measure_say_nothing(sqlite_engine: Engine) -> None:
    b = known_batch(sqlite_engine)
    _reading(sqlite_engine, b, 0.0, None)
    view = server_view(sqlite_engine, b)
    assert (view.client_lag_max_s, view.client_lag_readings_over_1s) == (None, None)
