"""Every PostgreSQL statement is bounded: NIGHTDESK_DB_STATEMENT_TIMEOUT_S (default 60 s)
sets each connection's statement_timeout (the engines', the checkpoint pool's, the nightly
and scheduler locks' own), and a statement the server cancels at it is one line on stderr,
exit 2, naming the setting and its value. Before, no statement had a bound: a lock held by
another session hung a command for ever. Driven on the real PostgreSQL at 127.0.0.1:5432
(pg_sleep, LOCK TABLE, SELECT ... FOR UPDATE)."""

from __future__ import annotations

import asyncio
import itertools
import os
import shlex
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import structlog
from sqlalchemy import Engine, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from agents.data.demo import DEMO_AS_OF, demo_tickers
from agents.data.snapshot import SnapshotProvider
from agents.graph import node_names
from app.batch import store
from app.batch.engine import BatchEngine, BatchPlan
from app.config import load_settings
from app.db.batchsettings import BatchSettings
from app.db.engine import get_engine, timed_out
from app.db.lock import nightly_lock, scheduler_lock
from app.db.models import Batch
from app.errors import AlreadyRunningError
from app.runs.checkpoints import Checkpoints, open_checkpointer
from tests.dbfaults import RowHeld, check_rows_match, fill_at, run_freeing_the_disk_at_the_stop
from tests.fakevllm import FakeServer
from tests.integration.conftest import private_database
from tests.unit.support.clirun import run_cli
from tests.unit.support.fault_night import QUICK_ENV, serve_cli_from

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
    assert said is not None and "NIGHTDESK_DB_STATEMENT_TIMEOUT_S (0.5 s)" in said
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
        "NIGHTDESK_DB_STATEMENT_TIMEOUT_S (1 s): the server cancelled it (a lock held too long, or "
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


def test_a_checkpoint_write_held_up_stops_the_night_resumable_in_one_line(
        pg_url: str, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The checkpoint pool's connections are bounded as the engines' are: a write held up by
    # a lock for 30 s is cancelled at 1 s, retried within the 2 s write budget, and the
    # night stops resumable (exit 2, one line naming the bound); the resume it advises, run
    # as given, has every row.
    async def make_tables() -> None:
        async with open_checkpointer(pg_url):
            pass

    asyncio.run(make_tables())
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
        outcome = asyncio.run(run_freeing_the_disk_at_the_stop(
            night(first), BatchPlan("nightly", DEMO_AS_OF, tickers), held))
    finally:
        held.release()
    assert time.monotonic() - started < 25  # not until the lock went
    assert outcome.status == "interrupted" and not outcome.failed, outcome
    assert outcome.halt is not None and outcome.halt.exit_code == 2
    said = outcome.halt.message
    assert "\n" not in said and "canceling statement due to statement timeout " \
        "(NIGHTDESK_DB_STATEMENT_TIMEOUT_S (1 s))" in said, said
    [advised] = [part for part in said.split("`")[1::2] if part.startswith("nightdesk ")]
    assert advised == f"nightdesk run --resume {outcome.batch_id}", said

    # The advised command, as given (but for the preflight, which needs a real server).
    second = FakeServer(nodes=NODES, tickers=tickers)
    serve_cli_from(monkeypatch, second, demo_dir)
    resumed = run_cli(*shlex.split(advised)[1:], "--no-preflight", env={
        **QUICK_ENV, "NIGHTDESK_DATABASE_URL": pg_url, "NIGHTDESK_DATA_DIR": str(demo_dir),
        "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    assert resumed.code == 0, resumed.stderr
    engine = get_engine(pg_url, settings.store.db_statement_timeout_s)
    with engine.connect() as conn:
        assert conn.execute(select(Batch.status)).scalar_one() == "succeeded"
    check_rows_match(engine, first, second)


def _beat_at(engine: Engine, batch_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(Batch.heartbeat_at).where(Batch.id == batch_id)).scalar_one()


def test_a_heartbeat_held_up_by_a_row_lock_is_missed_in_one_line_and_the_lock_kept(
        pg_url: str) -> None:
    # The nightly lock's own connection is bounded too: its heartbeat UPDATE behind another
    # session's lock on the batch row is cancelled at 1 s, not left waiting (the night's
    # heartbeat stopped, or the night hung). The session answered, so it and its lock live:
    # the beat is missed in one line naming the bound, and the next one, the row free,
    # stores it.
    engine = get_engine(pg_url, 1.0)
    batch_id = store.create_batch(engine, kind="nightly", as_of=DEMO_AS_OF, tickers=[],
                                  samples=1, settings=BatchSettings(), server_facts=None)
    dsn = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with nightly_lock(engine, 1.0) as hold:
        before = _beat_at(engine, batch_id)
        held = RowHeld(dsn, batch_id, 20.0)
        try:
            started = time.monotonic()
            with structlog.testing.capture_logs() as logs:
                proven = hold.beat(batch_id)
            took = time.monotonic() - started
        finally:
            held.release()
        assert proven and took < 5, took  # not until the row was let go
        assert [(line["event"], line["error"]) for line in logs] == [
            ("heartbeat not stored; tried again at the next beat",
             "canceling statement due to statement timeout "
             "(NIGHTDESK_DB_STATEMENT_TIMEOUT_S (1 s))")], logs
        assert _beat_at(engine, batch_id) == before
        with pytest.raises(AlreadyRunningError), nightly_lock(engine):
            pass  # still held: the missed beat let nothing go
        assert hold.beat(batch_id) and _beat_at(engine, batch_id) > before


@pytest.mark.parametrize("lock", [nightly_lock, scheduler_lock])
def test_the_locks_own_connections_are_bounded(pg_url: str, lock: Any) -> None:
    with lock(get_engine(pg_url), 1.5) as hold:
        assert hold._conn.execute(text("SHOW statement_timeout")).scalar_one() == "1500ms"
