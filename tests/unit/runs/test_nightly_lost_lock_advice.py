"""A night that loses the nightly lock to another run stops and says what continues it,
and what it says works: the real CLI on SQLite against the fake server, the loss played by
a lock that another run takes over mid-night (on SQLite a flock is never lost; on
PostgreSQL a restart or an ended connection lets it go: docs/reliability.md)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update

from agents.data.demo import DEMO_AS_OF, demo_tickers
from app.batch import store
from app.db import lock as locks
from app.db.batchsettings import BatchSettings
from app.db.models import Batch, TickerRun
from app.runs import nightly
from app.runs.resumable import _crash
from tests.fakevllm import ChatRequest, FakeServer, Reply, default_reply
from tests.unit.support.clirun import run_cli
from tests.unit.support.fault_night import (
    NODES,
    assert_rows_match_the_servers,
    serve_cli_from,
)
from tests.webhook import webhook

TICKERS = demo_tickers(3)


@pytest.fixture
def fast_beat(cli_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``cli_env`` with a heartbeat quick enough to lose the lock within a test."""
    monkeypatch.setenv("NIGHTDESK_HEARTBEAT_INTERVAL_S", "0.05")
    monkeypatch.setenv("NIGHTDESK_HEARTBEAT_STALE_S", "30")


class TakenOver:
    """Another run taking the night over once ``due`` is set: it holds the real lock and
    runs a batch of its own (``starts``: a new nightly batch, the takeover's own start
    having marked the night crashed as ``mark_orphaned`` does; else it continues the night
    itself, as `run --resume` or the timer's `--continue-night` does)."""

    def __init__(self, engine: Engine, *, starts: bool) -> None:
        self.engine, self.starts = engine, starts
        self.due = threading.Event()
        self.held = contextlib.ExitStack()
        self.batch_id: int | None = None

    def take(self, night: int) -> None:
        self.held.enter_context(locks.nightly_lock(self.engine))
        if not self.starts:
            with self.engine.begin() as conn:  # what `reopen` writes: its runner, not ours
                conn.execute(update(Batch).where(Batch.id == night).values(settings={
                    **conn.execute(select(Batch.settings).where(Batch.id == night)).scalar_one(),
                    "runner": {"host": "elsewhere", "pid": 1, "started": None}}))
            return
        with self.engine.begin() as conn:
            _crash(conn, {night: "the nightly lock was free"})
        self.batch_id = store.create_batch(self.engine, kind="nightly", as_of=DEMO_AS_OF,
                                           tickers=[], samples=1, settings=BatchSettings(),
                                           server_facts=None)

    def end(self) -> None:
        if self.batch_id is not None:
            store.finish_batch(self.engine, self.batch_id, "succeeded")
        self.held.close()


class LosingHold(locks.LockHold):
    """The night's lock: proven at each beat until the takeover, then never again."""

    def __init__(self, other: TakenOver) -> None:
        super().__init__()
        self.other, self.lost = other, False

    @property
    def unproven_s(self) -> float:
        return 45.0 if self.lost else 0.0  # past any give-up time

    def _beat(self, batch_id: int) -> bool:
        if self.lost:
            return False
        if self.other.due.is_set():
            self.other.take(batch_id)
            self.lost = True
            return False
        store.heartbeat(self.other.engine, batch_id)
        return True


def night_losing_its_lock(monkeypatch: pytest.MonkeyPatch, demo_dir: Path,
                          other: TakenOver) -> FakeServer:
    """Run a night of three tickers with the real CLI that loses its lock to ``other``
    after 20 answers (later answers slowed, so that the loss comes mid-night); return the
    server it called."""
    answered = [0]

    def script(chat: ChatRequest) -> Reply | str | None:
        answered[0] += 1
        if answered[0] < 20:
            return None
        other.due.set()
        return Reply(default_reply(chat), delay_s=0.3)

    @contextlib.contextmanager
    def losing_lock(engine: Engine, *_bound: float) -> Iterator[locks.LockHold]:
        yield LosingHold(other)

    server = FakeServer(script, nodes=NODES, tickers=TICKERS)
    serve_cli_from(monkeypatch, server, demo_dir)
    monkeypatch.setattr(nightly, "nightly_lock", losing_lock)
    return server


def test_a_night_that_lost_its_lock_to_another_batch_says_to_resume_once_that_one_ended(
        fast_beat: None, sqlite_engine: Engine, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    other = TakenOver(sqlite_engine, starts=True)
    first = night_losing_its_lock(monkeypatch, demo_dir, other)
    with webhook() as hook:
        stopped = run_cli("run", "--tickers", ",".join(TICKERS), "--no-preflight",
                          env={"NIGHTDESK_NOTIFY": hook.url()})
    assert stopped.code == 4, stopped.stderr
    said = stopped.error_lines[-1]
    assert said.startswith("error: batch 1 interrupted: the nightly lock could not be proven "
                           "held"), stopped.stderr
    assert said.endswith("; batch 2 holds the nightly lock now: once it has ended, "
                         "`nightdesk run --resume 1` continues this one"), said
    # The digest and the report say the same: the resume, once batch 2 has ended.
    [post] = hook.posts
    [step] = [line for line in post["message"].splitlines() if line.startswith("Next: ")]
    assert step.startswith("Next: nightdesk run --resume 1 (continues its ") and \
        step.endswith(" not finished, once batch 2, running now, has ended)"), step
    shown = run_cli("report", "1")
    assert step.removeprefix("Next: ") in shown.stdout, shown.stdout
    monkeypatch.setattr(nightly, "nightly_lock", locks.nightly_lock)

    # Until then the command answers as the advice says it would.
    second = FakeServer(nodes=NODES, tickers=TICKERS)
    serve_cli_from(monkeypatch, second, demo_dir)
    early = run_cli("run", "--resume", "1", "--no-preflight")
    assert (early.code, early.error_lines) == (4, ["error: already running: batch 2"])
    assert second.chats == []

    # Once batch 2 has ended, the advised command finishes the night, nothing counted twice.
    other.end()
    resumed = run_cli("run", "--resume", "1", "--no-preflight")
    assert resumed.code == 0, resumed.stderr
    with sqlite_engine.connect() as conn:
        night = conn.execute(select(Batch.__table__).where(Batch.id == 1)).one()
        runs = conn.execute(select(TickerRun.ticker, TickerRun.status)
                            .where(TickerRun.batch_id == 1)).all()
    assert (night.status, night.tickers_total, night.tickers_succeeded,
            night.tickers_failed) == ("succeeded", 3, 3, 0)
    assert sorted(runs) == [(t, "succeeded") for t in sorted(TICKERS)]
    assert_rows_match_the_servers(sqlite_engine, 1, [first, second])


def test_a_night_another_run_took_over_and_continues_says_there_is_nothing_to_run(
        fast_beat: None, sqlite_engine: Engine, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    other = TakenOver(sqlite_engine, starts=False)
    night_losing_its_lock(monkeypatch, demo_dir, other)
    stopped = run_cli("run", "--tickers", ",".join(TICKERS), "--no-preflight")
    assert stopped.code == 4, stopped.stderr
    said = stopped.error_lines[-1]
    assert said.endswith("; another run (pid 1 on elsewhere) continues batch 1 now: nothing "
                         "to run; `nightdesk report 1` shows how it went"), said
    other.end()
    shown = run_cli("report", "1")
    assert shown.code == 0, shown.stderr

