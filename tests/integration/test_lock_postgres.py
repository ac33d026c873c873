"""Run the single-instance and scheduler checks against the real PostgreSQL at 127.0.0.1:5432.

Each test gets a database of its own (created here, dropped after): advisory locks and the
job store's table are per database, and the counts below must see only this test's rows.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import traceback
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import structlog
from sqlalchemy import Engine, event, func, select, text
from sqlalchemy.orm import Session

from agents.data.demo import DEMO_AS_OF, write_demo
from app.batch import store
from app.config import load_settings
from app.db import lock
from app.db.batchsettings import BatchSettings
from app.db.engine import get_engine
from app.db.lock import ADVISORY_KEY, nightly_lock
from app.db.models import Batch, LLMCall, TickerRun
from app.errors import AlreadyRunningError
from app.morning.advice import running_night
from app.morning.digest import build_digest
from app.morning.summary import list_batches
from app.morning.views import batch_view, ranking_view, running_batches, ticker_view
from tests.integration.conftest import ADMIN_DSN, private_database
from tests.unit.support.clirun import run_cli
from tests.unit.support.daemon_clock import NIGHT, Recorder, daemon_for, local, running, tick
from tests.unit.support.lock_checks import (
    NIGHTDESK,
    check_lock_dies_with_its_holder,
    check_race,
    check_second_start_during_a_batch,
)

pytestmark = pytest.mark.integration
_numbers = itertools.count()


@pytest.fixture
def pg_engine() -> Iterator[Engine]:
    with private_database(f"nightdesk_lock_{os.getpid()}_{next(_numbers)}",
                          upgraded=True) as url:
        yield get_engine(url)


def url_of(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def test_three_starts_at_once_one_gets_the_advisory_lock(pg_engine: Engine) -> None:
    check_race(pg_engine)


def test_a_killed_holder_leaves_no_advisory_lock(pg_engine: Engine) -> None:
    check_lock_dies_with_its_holder(pg_engine)


def test_second_start_during_a_batch_is_refused_on_postgres(
        pg_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    settings = load_settings(check_context_length=False, retry_backoff_s=0,
                             data_dir=tmp_path / "data", database_url=url_of(pg_engine))
    check_second_start_during_a_batch(monkeypatch, pg_engine, settings)


def test_cli_run_exits_4_while_another_process_holds_the_advisory_lock(
        pg_engine: Engine) -> None:
    running_id = store.create_batch(pg_engine, kind="nightly", as_of=date(2026, 11, 27),
                                    tickers=["AAA"], samples=1, settings=BatchSettings(),
                                    server_facts=None)
    env = {**os.environ, "NIGHTDESK_DATABASE_URL": url_of(pg_engine),
           "NIGHTDESK_LLM_BASE_URL": "http://127.0.0.1:9/v1", "NIGHTDESK_LOG_FORMAT": "json"}
    with nightly_lock(pg_engine):  # held on this process's own connection
        result = subprocess.run([str(NIGHTDESK), "run", "--tickers", "AAA,BBB",
                                 "--as-of", "2026-11-27"], env=env, capture_output=True,
                                text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 4, result.stderr
    assert result.stderr.strip().splitlines() == [f"error: already running: batch {running_id}"]
    with pg_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Batch)).scalar() == 1
        assert conn.execute(select(func.count()).select_from(LLMCall)).scalar() == 0


def test_the_schedule_kept_in_postgres_catches_up_once(pg_engine: Engine) -> None:
    recorder = Recorder()
    with running(daemon_for(pg_engine, recorder), local(date(2026, 11, 27), 20, 0)):
        pass  # stored for 00:10 in apscheduler_jobs; then the host is off
    back = local(date(2026, 11, 28), 2, 30)
    with running(daemon_for(pg_engine, recorder), back) as daemon:
        for later in (back, back + timedelta(minutes=1), back + timedelta(hours=2)):
            tick(daemon, later)
        assert recorder.fired == [NIGHT]
        assert daemon.next_run_time() == NIGHT + timedelta(days=1)


def test_a_night_elsewhere_reads_crashed_once_the_advisory_lock_is_free(
        pg_engine: Engine) -> None:
    """A nightly batch run on another host (its pid cannot be looked up) that beat a moment
    ago reads running while a session holds the nightly lock, and crashed as soon as none
    does (it beat since the server started, so no restart let its lock go)."""
    now = datetime.now(UTC)
    with Session(pg_engine) as s:
        s.add(Batch(kind="nightly", as_of=now.date(), status="running", created_at=now,
                    started_at=now, heartbeat_at=now, tickers_total=1,
                    settings={"runner": {"host": "elsewhere", "pid": 1, "started": None}}))
        s.commit()
    with nightly_lock(get_engine(url_of(pg_engine))):
        assert [b.status for b in list_batches(pg_engine, 120.0)] == ["running"]
    [listed] = list_batches(pg_engine, 120.0)
    assert (listed.status, listed.error) == ("crashed", "its nightly lock was let go")
    # The next start marks it (``mark_orphaned``, under the lock): in the same words.
    from app.runs.resumable import mark_orphaned

    with nightly_lock(get_engine(url_of(pg_engine))):
        assert mark_orphaned(pg_engine, 120.0) == [listed.id]
    [marked] = list_batches(pg_engine, 120.0)
    assert (marked.status, marked.error, marked.finished_at, marked.duration_s) == \
        ("crashed", listed.error, listed.finished_at, listed.duration_s)


def test_a_request_reads_the_nightly_lock_once_however_many_nights_run(
        pg_engine: Engine) -> None:
    """Three nightly batches stored running, run elsewhere (only ``pg_locks`` can tell
    whether they live): each view of them all reads ``pg_locks`` once, not once a night,
    nor once for each part of a page."""
    now = datetime.now(UTC)
    with Session(pg_engine) as s:
        for day in range(3):
            night = Batch(kind="nightly", as_of=now.date() - timedelta(days=day),
                          status="running", created_at=now, started_at=now, heartbeat_at=now,
                          tickers_total=1, settings={"runner": {"host": "elsewhere",
                                                                "pid": 1, "started": None}})
            s.add(night)
            s.flush()
            s.add(TickerRun(batch_id=night.id, ticker="AAA", status="running",
                            started_at=now))
            newest = night.id
        s.commit()
    asked: list[str] = []

    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        if "pg_locks" in statement:
            asked.append(statement)

    event.listen(pg_engine, "before_cursor_execute", count)
    try:
        for view in (lambda: list_batches(pg_engine, 120.0),
                     lambda: running_batches(pg_engine, 120.0),
                     lambda: ticker_view(pg_engine, "AAA", 120.0),
                     lambda: running_night(pg_engine, 120.0),
                     # A page that composes several: the ranking (the running list, the
                     # night's status and its advice), a batch's page (its summary, advice).
                     lambda: ranking_view(pg_engine, load_settings(database_url=url_of(
                         pg_engine))),
                     lambda: batch_view(pg_engine, newest, 120.0)):
            asked.clear()
            view()
            assert len(asked) == 1, view
    finally:
        event.remove(pg_engine, "before_cursor_execute", count)
    # The one reading holds for all three: the lock is free, so each reads crashed.
    assert {b.status for b in list_batches(pg_engine, 120.0)} == {"crashed"}


def test_report_and_the_digest_read_the_nightly_lock_once(pg_engine: Engine) -> None:
    """A night run elsewhere, its heartbeat an hour old, and a newer one beating now: the
    first's digest and `report` (which marks it crashed and advises its resume, asking which
    night runs now) each read ``pg_locks`` once, as a page does. They read it twice."""
    now = datetime.now(UTC)
    elsewhere = {"runner": {"host": "elsewhere", "pid": 1, "started": None}}
    with Session(pg_engine) as s:
        ids = []
        for beat in (now - timedelta(hours=1), now):
            night = Batch(kind="nightly", as_of=now.date(), status="running", created_at=beat,
                          started_at=beat, heartbeat_at=beat, tickers_total=1,
                          settings=elsewhere)
            s.add(night)
            s.flush()
            s.add(TickerRun(batch_id=night.id, ticker="AAA", status="running", started_at=beat))
            ids.append(night.id)
        s.commit()
    first = ids[0]
    url = url_of(pg_engine)
    asked: list[str] = []

    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        if "pg_locks" in statement:
            asked.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        # The digest first: the night is still stored running, read crashed.
        build_digest(pg_engine, load_settings(database_url=url), first)
        assert len(asked) == 1, asked
        asked.clear()
        said = run_cli("report", str(first), "--format", "json",
                       env={"NIGHTDESK_DATABASE_URL": url})
        assert said.code == 0, said
        assert len(asked) == 1, asked
    finally:
        event.remove(Engine, "before_cursor_execute", count)


def _holders(engine: Engine, key: int) -> list[int]:
    """Return the pids of the sessions holding advisory lock ``key`` in engine's database."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    with engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND classid::bigint = :high AND objid::bigint = :low AND objsubid = 1"),
            {"high": unsigned >> 32, "low": unsigned & 0xFFFF_FFFF}).scalars())


class Killer:
    """Terminate the nightly lock's backend (``pg_terminate_backend``, waiting for its end)
    just before each heartbeat UPDATE it sends, ``left`` times: a connection that dies at
    every try. Records each try's stack depth."""

    def __init__(self, left: int) -> None:
        self.left = left
        self.killed: list[int] = []
        self.depths: list[int] = []

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not statement.startswith("UPDATE batches") or self.left == 0:
            return
        self.left -= 1
        self.depths.append(len(traceback.extract_stack()))
        pid = cursor.connection.info.backend_pid
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()
        self.killed.append(pid)


def test_a_lock_connection_killed_at_every_try_misses_beats_boundedly_then_is_retaken(
        pg_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # The heartbeat's connection killed at each try, beat after beat (as a server killing
    # our backends would): each beat gives up after RETAKES tries, one warning per try and
    # one for the missed beat, at the same stack depth each try; the night is told the lock
    # is unproven. Before, a beat retook and beat again recursively, without end while
    # the kills went on. Once they stop, the next beat takes it back: one holder, ours.
    monkeypatch.setattr(lock, "RETAKE_WAIT_S", 0.05)
    batch_id = store.create_batch(pg_engine, kind="nightly", as_of=DEMO_AS_OF, tickers=[],
                                  samples=1, settings=BatchSettings(), server_facts=None)
    beats = 4
    kills = Killer(beats * lock.RETAKES + 50)  # more than the beats use: without a bound,
    with nightly_lock(pg_engine) as hold:     # the old recursion ran on into them
        assert isinstance(hold, lock._AdvisoryHold)
        event.listen(hold._engine, "before_cursor_execute", kills)
        with structlog.testing.capture_logs() as logs:
            proven = [hold.beat(batch_id) for _ in range(beats)]
        assert proven == [False] * beats
        assert len(kills.killed) == beats * lock.RETAKES and len(set(kills.killed)) == \
            len(kills.killed)  # a new connection each try
        assert len(set(kills.depths)) == 1, kills.depths  # a loop, not a recursion
        lost = "nightly lock not proven held: its connection lost at each of 3 tries; " \
            "the next beat tries again"
        assert [line["event"] for line in logs] == beats * (
            ["nightly lock's connection lost"] * 3 + [lost])
        assert hold.unproven_s > 0 and _holders(pg_engine, ADVISORY_KEY) == []

        kills.left = 0
        with pg_engine.connect() as conn:
            before = conn.execute(select(Batch.heartbeat_at)
                                  .where(Batch.id == batch_id)).scalar_one()
        assert before is not None
        with structlog.testing.capture_logs() as logs:
            assert hold.beat(batch_id)
        assert [line["event"] for line in logs] == ["nightly lock taken again"]
        assert hold._conn is not None
        ours = hold._conn.connection.dbapi_connection
        assert isinstance(ours, psycopg.Connection)
        assert _holders(pg_engine, ADVISORY_KEY) == [ours.info.backend_pid]
        with pg_engine.connect() as conn:
            assert conn.execute(select(Batch.heartbeat_at)
                                .where(Batch.id == batch_id)).scalar_one() > before
        with pytest.raises(AlreadyRunningError), nightly_lock(pg_engine):
            pass


def test_a_lock_taken_by_another_session_while_the_connection_was_down_is_reported(
        pg_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # Killed once, and another session takes the lock before the retake: the beat says so
    # (one error line), nothing is retried against it, and keep() raises AlreadyRunning.
    monkeypatch.setattr(lock, "RETAKE_WAIT_S", 0.05)
    batch_id = store.create_batch(pg_engine, kind="nightly", as_of=DEMO_AS_OF, tickers=[],
                                  samples=1, settings=BatchSettings(), server_facts=None)
    with nightly_lock(pg_engine) as hold:
        assert isinstance(hold, lock._AdvisoryHold)
        kills = Killer(1)
        event.listen(hold._engine, "before_cursor_execute", kills)
        plain = url_of(pg_engine).replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(plain, autocommit=True) as other:
            def take_it(*args: Any) -> None:
                if kills.killed and not taken:
                    taken.append(other.execute("SELECT pg_try_advisory_lock(%s)",
                                               (ADVISORY_KEY,)).fetchone())

            taken: list[Any] = []
            event.listen(hold._engine, "connect", take_it)
            with structlog.testing.capture_logs() as logs:
                assert not hold.beat(batch_id)
            assert taken == [(True,)]
            assert [line["event"] for line in logs] == [
                "nightly lock's connection lost", "nightly lock held by another run"]
            assert _holders(pg_engine, ADVISORY_KEY) == [other.info.backend_pid]
            with pytest.raises(AlreadyRunningError):
                hold.keep()


@pytest.mark.parametrize("call_ago_s", [5, 600], ids=["a call 5 s ago", "none for 10 min"])
def test_a_start_weighs_a_nights_calls_as_every_view_does_before_marking_it(
        pg_engine: Engine, call_ago_s: float) -> None:
    """A night elsewhere whose heartbeat is older than the server's start (a restart let its
    lock go) but whose calls go on may be alive and about to take its lock again: a start
    (``mark_orphaned``, under the lock) refuses, as every view reads it running. Once its
    calls stopped too it is marked with the reason and end the views gave it."""
    from app.morning.summary import when
    from app.runs.resumable import mark_orphaned

    with pg_engine.connect() as conn:
        up_since = conn.execute(text("SELECT pg_postmaster_start_time()")).scalar_one()
    beat, now = up_since - timedelta(minutes=30), datetime.now(UTC)
    ended = now - timedelta(seconds=call_ago_s)
    with Session(pg_engine) as s:
        row = Batch(kind="nightly", as_of=now.date(), status="running", created_at=beat,
                    started_at=beat, heartbeat_at=beat, tickers_total=1,
                    settings={"runner": {"host": "elsewhere", "pid": 1, "started": None}})
        s.add(row)
        s.flush()
        s.add(LLMCall(batch_id=row.id, ticker="AAA", node="market_analyst", model="tiny",
                      status="ok", started_at=ended - timedelta(seconds=2), ended_at=ended,
                      latency_s=2.0))
        s.commit()
        night = int(row.id)
    with nightly_lock(get_engine(url_of(pg_engine))):
        [seen] = list_batches(pg_engine, 120.0)
        if call_ago_s < 120:
            assert seen.status == "running"
            with pytest.raises(AlreadyRunningError):
                mark_orphaned(pg_engine, 120.0)
            [after] = list_batches(pg_engine, 120.0)
            assert after.status == "running"
            return
        assert (seen.status, seen.error) == (
            "crashed", f"no sign of life since {when(ended)}: its process has died")
        assert mark_orphaned(pg_engine, 120.0) == [night]
    [after] = list_batches(pg_engine, 120.0)
    assert (after.status, after.error, after.finished_at) == ("crashed", seen.error, ended)
