"""Every PostgreSQL statement is bounded: NIGHTDESK_DB_STATEMENT_TIMEOUT_S (default 60 s)
sets each connection's statement_timeout, and a statement the server cancels at it is one
line on stderr, exit 2. Before, no statement had a bound: a lock held by another session
hung a command for ever. Driven on the real PostgreSQL at 127.0.0.1:5432 (pg_sleep)."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from agents.data.demo import DEMO_AS_OF, demo_tickers
from agents.data.snapshot import SnapshotProvider
from agents.graph import node_names
from app.batch.engine import BatchEngine, BatchPlan
from app.config import load_settings
from app.db.engine import get_engine, timed_out
from app.runs.checkpoints import Checkpoints, open_checkpointer
from app.runs.resumable import find_resumable
from tests.dbfaults import check_rows_match, fill_at, run_freeing_the_disk_at_the_stop
from tests.fakevllm import FakeServer
from tests.integration.conftest import private_database
from tests.unit.support.clirun import run_cli

pytestmark = pytest.mark.integration
_numbers = itertools.count()
NODES = node_names(load_settings().pipeline())


@pytest.fixture
def pg_url() -> Iterator[str]:
    with private_database(f"nightdesk_timeout_{os.getpid()}_{next(_numbers)}",
                          upgraded=True) as url:
        yield url


def _timeout(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SHOW statement_timeout")).scalar_one())


def test_a_statement_past_the_timeout_is_cancelled_in_one_line(pg_url: str) -> None:
    assert _timeout(get_engine(pg_url)) == "1min"  # the default: 60 s
    short = get_engine(pg_url, 0.5)
    assert _timeout(short) == "500ms"
    with short.connect() as conn, pytest.raises(OperationalError) as caught:
        conn.execute(text("SELECT pg_sleep(3)"))
    said = timed_out(caught.value)
    assert said is not None and "NIGHTDESK_DB_STATEMENT_TIMEOUT_S" in said
    with short.connect() as conn:  # within the bound, the same engine answers
        assert conn.execute(text("SELECT 1 FROM pg_sleep(0.1)")).scalar_one() == 1


def test_a_command_held_up_by_a_lock_ends_in_one_line(pg_url: str) -> None:
    plain = pg_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(plain) as holder:  # another session holds the table
        holder.execute("LOCK TABLE batches IN ACCESS EXCLUSIVE MODE")
        result = run_cli("batches", env={"NIGHTDESK_DATABASE_URL": pg_url,
                                         "NIGHTDESK_DB_STATEMENT_TIMEOUT_S": "1"})
        holder.rollback()
    assert result.code == 2, result.stderr
    assert result.stderr.splitlines() == [
        "error: the database did not answer a statement within "
        "NIGHTDESK_DB_STATEMENT_TIMEOUT_S: the server cancelled it (a lock held too long, or "
        "the server overloaded)"], result.stderr


class CheckpointsHeld:
    """Another session holding the checkpoint tables (ACCESS EXCLUSIVE) from ``hold`` until
    ``release`` or ``seconds`` later: every statement of the checkpoint pool waits on it, as
    on a stalled server."""

    TABLES = "checkpoints, checkpoint_blobs, checkpoint_writes"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.holder: psycopg.Connection[Any] | None = None
        self.timer: threading.Timer | None = None

    def hold(self, seconds: float) -> None:
        self.holder = psycopg.connect(self.dsn, connect_timeout=5)
        self.holder.execute(f"LOCK TABLE {self.TABLES} IN ACCESS EXCLUSIVE MODE")
        self.timer = threading.Timer(seconds, self.release)
        self.timer.start()

    def release(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        holder, self.holder = self.holder, None
        if holder is not None:
            holder.close()  # its transaction, and so the lock, ends


async def test_a_checkpoint_write_held_up_stops_the_night_resumable_in_one_line(
        pg_url: str, demo_dir: Path) -> None:
    # The checkpoint pool's connections are bounded as the engines' are: a write held up by
    # a lock for 30 s is cancelled at 1 s, retried within the 2 s write budget, and the
    # night stops resumable (exit 2, one line); one resume has every row.
    async with open_checkpointer(pg_url):
        pass  # its tables made
    tickers = demo_tickers(2)
    held = CheckpointsHeld(make_url(pg_url).set(drivername="postgresql")
                           .render_as_string(hide_password=False))
    settings = load_settings(database_url=pg_url, retry_backoff_s=0.01,
                             check_context_length=False, db_statement_timeout_s=1.0,
                             db_write_budget_s=2.0)

    def night(server: FakeServer) -> BatchEngine:
        engine = get_engine(pg_url, settings.store.db_statement_timeout_s)
        return BatchEngine(settings, engine,
                           http_client=httpx.AsyncClient(transport=server.transport()),
                           provider=SnapshotProvider(demo_dir), sample_metrics=False,
                           checkpoints=Checkpoints(pg_url, engine,
                                                   settings.store.db_statement_timeout_s))

    first = FakeServer(fill_at(held, 6, 30.0), nodes=NODES, tickers=tickers)
    started = time.monotonic()
    try:
        outcome = await run_freeing_the_disk_at_the_stop(
            night(first), BatchPlan("nightly", DEMO_AS_OF, tickers), held)
    finally:
        held.release()
    assert time.monotonic() - started < 25  # not until the lock went
    assert outcome.status == "interrupted" and not outcome.failed, outcome
    assert outcome.halt is not None and outcome.halt.exit_code == 2
    assert "\n" not in outcome.halt.message and "statement timeout" in outcome.halt.message
    assert f"nightdesk run --resume {outcome.batch_id}" in outcome.halt.message

    engine = get_engine(pg_url, settings.store.db_statement_timeout_s)
    second = FakeServer(nodes=NODES, tickers=tickers)
    resumed = await night(second).run(find_resumable(engine, None, stale_s=120))
    assert resumed.status == "succeeded" and sorted(resumed.succeeded) == sorted(tickers)
    check_rows_match(engine, first, second)
