"""PostgreSQL full or away under a night's writes: ridden out within the write budget; past
it the batch stops resumable and one resume finishes it with every usage row.

The disk is "full" through statement triggers that raise SQLSTATE ``disk_full`` on the
usage tables or the checkpoint tables (tests/dbfaults.py); the database is "away" behind a
TCP proxy that drops every connection and refuses new ones. Each test has a database of its
own (the triggers must not reach another test), dropped afterwards.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import structlog
from psycopg import sql
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from agents.data.demo import DEMO_AS_OF, demo_tickers
from agents.data.snapshot import SnapshotProvider
from agents.graph import node_names
from app.batch.engine import BatchEngine, BatchPlan
from app.config import load_settings
from app.db.engine import get_engine
from app.db.models import Batch, Decision, NodeText, TickerRun
from app.db.retry import write_budget
from app.errors import StorageOutage
from app.runs import checkpoints
from app.runs.checkpoints import Checkpoints, open_checkpointer
from app.runs.resumable import find_resumable, mark_stale_crashed
from tests.dbfaults import (
    PostgresFull,
    TcpProxy,
    check_rows_match,
    failed_writes,
    fill_at,
    run_freeing_the_disk_at_the_stop,
)
from tests.fakevllm import ChatRequest, FakeServer
from tests.integration.conftest import ADMIN_DSN, private_database

pytestmark = pytest.mark.integration

NODES = node_names(load_settings().pipeline())
TABLES = {"usage": ["llm_calls", "llm_requests"],
          "checkpoints": ["checkpoints", "checkpoint_blobs", "checkpoint_writes"]}
FULL = "No space left on device"


@pytest.fixture
async def db_url() -> Any:
    """A migrated database of this test's own, with the checkpoint tables made."""
    with private_database(f"nightdesk_writes_{os.getpid()}_{uuid.uuid4().hex[:8]}",
                          upgraded=True) as url:
        async with open_checkpointer(url):
            pass
        yield url


def plain(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def night(url: str, demo_dir: Path, server: FakeServer, **overrides: Any) -> BatchEngine:
    settings = load_settings(database_url=url, retry_backoff_s=0.01,
                             check_context_length=False, **overrides)
    return BatchEngine(settings, get_engine(url),
                       http_client=httpx.AsyncClient(transport=server.transport()),
                       provider=SnapshotProvider(demo_dir), sample_metrics=False,
                       checkpoints=Checkpoints(url, get_engine(url)))


@pytest.mark.parametrize("where", ["usage", "checkpoints"])
async def test_disk_full_for_five_seconds_is_ridden_out_on_postgres(
        where: str, db_url: str, demo_dir: Path) -> None:
    tickers = demo_tickers(2)
    disk = PostgresFull(plain(db_url), TABLES[where])
    server = FakeServer(fill_at(disk, 5, 5.0), nodes=NODES, tickers=tickers)
    with structlog.testing.capture_logs() as logs:
        outcome = await night(db_url, demo_dir, server).run(
            BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert outcome.status == "succeeded", (outcome.failed, outcome.halt)
    said = failed_writes(logs)
    assert said and all(FULL in line for line in said)  # the fault was met, and passed
    check_rows_match(get_engine(db_url), server)


@pytest.mark.parametrize("where", ["usage", "checkpoints"])
async def test_disk_full_past_the_budget_stops_resumable_and_one_resume_has_every_row(
        where: str, db_url: str, demo_dir: Path) -> None:
    tickers = demo_tickers(3)
    disk = PostgresFull(plain(db_url), TABLES[where])
    first = FakeServer(fill_at(disk, 8, 3600.0), nodes=NODES, tickers=tickers)
    runner = night(db_url, demo_dir, first, db_write_budget_s=1.0)
    outcome = await run_freeing_the_disk_at_the_stop(
        runner, BatchPlan("nightly", DEMO_AS_OF, tickers), disk)
    assert outcome.status == "interrupted" and not outcome.failed
    assert outcome.halt is not None and outcome.halt.exit_code == 2
    reason = outcome.halt.message
    assert "within the write budget (1 s): could not extend file" in reason
    assert f"nightdesk run --resume {outcome.batch_id}" in reason
    engine = get_engine(db_url)
    with engine.connect() as conn:
        batch = conn.execute(select(Batch.status, Batch.error)).one()
        runs = set(conn.execute(select(TickerRun.status)).scalars())
    assert tuple(batch) == ("interrupted", reason)
    assert "failed" not in runs

    second = FakeServer(nodes=NODES, tickers=tickers)
    resumed = await night(db_url, demo_dir, second).run(
        find_resumable(engine, None, stale_s=120))
    assert resumed.status == "succeeded" and sorted(resumed.succeeded) == sorted(tickers)
    check_rows_match(engine, first, second)


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    server = TcpProxy(("127.0.0.1", 5432))
    try:
        yield server
    finally:
        server.close()


async def test_the_database_away_for_ten_seconds_is_ridden_out(
        db_url: str, demo_dir: Path, proxy: TcpProxy) -> None:
    url = make_url(db_url).set(port=proxy.port).render_as_string(hide_password=False)
    tickers = demo_tickers(2)

    def away(chat: ChatRequest) -> None:
        if chat.index == 6:
            proxy.cut(10.0)

    server = FakeServer(away, nodes=NODES, tickers=tickers)
    try:
        with structlog.testing.capture_logs() as logs:
            outcome = await night(url, demo_dir, server, db_write_budget_s=60.0).run(
                BatchPlan("nightly", DEMO_AS_OF, tickers))
        assert proxy.cuts == 1
        assert outcome.status == "succeeded", (outcome.failed, outcome.halt)
        assert failed_writes(logs)  # writes met the database away, and passed
        check_rows_match(get_engine(url), server)
    finally:
        get_engine(url).dispose()


async def test_a_database_away_past_one_try_at_opening_the_checkpoints_is_waited_for(
        db_url: str, proxy: TcpProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    # psycopg closes a pool not ready within its try, for good: a try after it that reopened
    # the same pool met "pool has already been opened/closed" until the write budget ran out.
    monkeypatch.setattr(checkpoints, "POOL_OPEN_S", 1.0)
    url = make_url(db_url).set(port=proxy.port).render_as_string(hide_password=False)
    proxy.cut(4.0)
    started = time.monotonic()
    with write_budget(60.0):
        async with open_checkpointer(url) as saver:
            config = {"configurable": {"thread_id": "none", "checkpoint_ns": ""}}
            assert await saver.aget_tuple(config) is None  # type: ignore[arg-type]
    assert proxy.cuts == 1 and time.monotonic() - started >= 3.5


async def test_commits_whose_answer_is_lost_record_every_row_once(
        db_url: str, demo_dir: Path, proxy: TcpProxy) -> None:
    # The connection lost after the server committed but before it said so (a restart at
    # the worst moment), at the night's first COMMIT and every fifth after: each write is
    # retried whole and must find what its lost try stored, neither a row twice nor one
    # lost. Before, the batch's first write, retried, stored a second batch (running for
    # good, no process behind it).
    url = make_url(db_url).set(port=proxy.port).render_as_string(hide_password=False)
    tickers = demo_tickers(2)
    proxy.lose_acks(lambda n: n % 5 == 1)
    server = FakeServer(nodes=NODES, tickers=tickers)
    try:
        outcome = await night(url, demo_dir, server, db_write_budget_s=60.0).run(
            BatchPlan("nightly", DEMO_AS_OF, tickers))
    finally:
        get_engine(url).dispose()
    assert proxy.lost_acks >= 5, proxy.commits
    assert outcome.status == "succeeded", (outcome.failed, outcome.halt)
    engine = get_engine(db_url)
    with engine.connect() as conn:
        batches = conn.execute(select(Batch.id, Batch.status, Batch.tickers_succeeded)).all()
        runs = conn.execute(select(TickerRun.ticker, TickerRun.status)).all()
        decisions = Counter(conn.execute(select(Decision.ticker)).scalars())
        texts = conn.execute(select(func.count()).select_from(NodeText)).scalar_one()
    assert batches == [(outcome.batch_id, "succeeded", 2)]
    assert sorted(runs) == [(t, "succeeded") for t in sorted(tickers)]
    assert set(decisions) == set(tickers) and len(set(decisions.values())) == 1, decisions
    assert texts == len(NODES) * sum(decisions.values())
    check_rows_match(engine, server)


async def test_a_disk_full_for_good_ends_the_night_in_one_line_and_it_resumes_later(
        db_url: str, demo_dir: Path) -> None:
    # Even the batch's end cannot be written: the run ends with one line naming why and how
    # to go on; once space is back the next start takes the dead batch for crashed.
    tickers = demo_tickers(2)
    disk = PostgresFull(plain(db_url), [*TABLES["usage"], "batches", "ticker_runs"])
    first = FakeServer(fill_at(disk, 8, 3600.0), nodes=NODES, tickers=tickers)
    with pytest.raises(StorageOutage) as stopped:
        await night(db_url, demo_dir, first, db_write_budget_s=1.0).run(
            BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert str(stopped.value) == (
        "the batch's end not stored within the write budget (1 s): could not extend file "
        f'"base/test": {FULL}; resume with `nightdesk run --resume 1`')
    assert stopped.value.exit_code == 2
    engine = get_engine(db_url)
    with engine.connect() as conn:
        assert conn.execute(select(Batch.status)).scalar_one() == "running"
    disk.release()

    assert mark_stale_crashed(engine, 0.0) == [1]
    second = FakeServer(nodes=NODES, tickers=tickers)
    resumed = await night(db_url, demo_dir, second).run(
        find_resumable(engine, 1, stale_s=120))
    assert resumed.status == "succeeded"
    check_rows_match(engine, first, second)


async def test_a_database_closed_to_connections_for_five_seconds_is_ridden_out(
        db_url: str, demo_dir: Path) -> None:
    # What a restart or a recovery looks like from outside, made by the server itself: the
    # database refuses every new connection (ALLOW_CONNECTIONS false: SQLSTATE 55000 "not
    # currently accepting connections"; 57P03 while starting up) and its backends are
    # terminated, usage writer and checkpoint pool alike, then it opens again.
    name = make_url(db_url).database
    tickers = demo_tickers(2)
    closed: list[float] = []

    def close_for_a_while() -> None:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false")
                          .format(sql.Identifier(name)))
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s", (name,))
            time.sleep(5.0)
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true")
                          .format(sql.Identifier(name)))
        closed.append(time.monotonic())

    def at_request_6(chat: ChatRequest) -> None:
        if chat.index == 6:
            threading.Thread(target=close_for_a_while, daemon=True).start()

    server = FakeServer(at_request_6, nodes=NODES, tickers=tickers)
    with structlog.testing.capture_logs() as logs:
        outcome = await night(db_url, demo_dir, server, db_write_budget_s=60.0).run(
            BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert closed, "the database was never opened again"
    assert outcome.status == "succeeded", (outcome.failed, outcome.halt)
    assert any("not currently accepting connections" in line or "terminat" in line
               for line in failed_writes(logs)), failed_writes(logs)
    check_rows_match(get_engine(db_url), server)


async def test_a_database_host_name_that_stops_resolving_for_a_while_is_ridden_out(
        db_url: str, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The database named by a host name whose resolver is unreachable for 3 s (EAI_AGAIN,
    # "Temporary failure in name resolution") while the server drops every connection, so
    # that each new one must look the name up. Before, the first write to meet it was not
    # retried: the usage writer gave up.
    host, name = "pg.nightdesk.test", make_url(db_url).database
    url = make_url(db_url).set(host=host).render_as_string(hide_password=False)
    resolving, real = threading.Event(), socket.getaddrinfo
    resolving.set()

    def getaddrinfo(asked: Any, *args: Any, **kwargs: Any) -> Any:
        if asked == host:
            if not resolving.is_set():
                raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
            asked = "127.0.0.1"
        return real(asked, *args, **kwargs)

    def unresolvable_for_a_while() -> None:
        resolving.clear()
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s", (name,))
        time.sleep(3.0)
        resolving.set()

    def at_request_6(chat: ChatRequest) -> None:
        if chat.index == 6:
            threading.Thread(target=unresolvable_for_a_while, daemon=True).start()

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    tickers = demo_tickers(2)
    server = FakeServer(at_request_6, nodes=NODES, tickers=tickers)
    try:
        with structlog.testing.capture_logs() as logs:
            outcome = await night(url, demo_dir, server, db_write_budget_s=60.0).run(
                BatchPlan("nightly", DEMO_AS_OF, tickers))
        assert resolving.is_set()
        assert outcome.status == "succeeded", (outcome.failed, outcome.halt)
        said = failed_writes(logs)
        assert any("Temporary failure in name resolution" in line for line in said), said
        check_rows_match(get_engine(url), server)
    finally:
        get_engine(url).dispose()


class ReadOnly:
    """A database that takes no writes while on (a failover: a hot standby answering at the
    primary's address): its backends terminated, each new session read-only
    (``default_transaction_read_only``, SQLSTATE 25006 on a write). Sessions opened meanwhile
    stay read-only once it is off, as pooled connections to a standby would."""

    def __init__(self, name: str) -> None:
        self.name, self.spells = name, 0

    def _set(self, statement: str) -> None:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(sql.SQL(statement).format(sql.Identifier(self.name)))
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s", (self.name,))

    def on(self) -> None:
        self._set("ALTER DATABASE {} SET default_transaction_read_only = on")
        self.spells += 1

    def release(self) -> None:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only")
                          .format(sql.Identifier(self.name)))


def read_only_at(db: ReadOnly, at: int, seconds: float) -> Any:
    """A fake server script that makes ``db`` read-only at chat request ``at``, for
    ``seconds`` (from a thread: the night goes on meanwhile)."""
    def spell() -> None:
        db.on()
        time.sleep(seconds)
        db.release()

    def script(chat: ChatRequest) -> None:
        if chat.index == at:
            threading.Thread(target=spell, daemon=True).start()
    return script


async def test_a_database_read_only_for_five_seconds_is_ridden_out(
        db_url: str, demo_dir: Path, tmp_path: Path) -> None:
    # Before, the usage writer gave up at the first refusal (UsageLost: the rows of calls
    # answered were lost) and the batch's end raised the driver's error: left `running`.
    db = ReadOnly(make_url(db_url).database or "")
    tickers = demo_tickers(2)
    server = FakeServer(read_only_at(db, 6, 5.0), nodes=NODES, tickers=tickers)
    with structlog.testing.capture_logs() as logs:
        outcome = await night(db_url, demo_dir, server, db_write_budget_s=60.0,
                              home=tmp_path).run(BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert db.spells == 1
    assert outcome.status == "succeeded", (outcome.failed, outcome.halt)
    said = [str(entry.get("error")) for entry in logs if entry.get("log_level") == "warning"]
    assert any("read-only transaction" in line for line in said), said
    check_rows_match(get_engine(db_url), server)


async def test_a_database_read_only_past_the_budget_stops_resumable_and_loses_no_row(
        db_url: str, demo_dir: Path, tmp_path: Path) -> None:
    db = ReadOnly(make_url(db_url).database or "")
    tickers = demo_tickers(3)
    first = FakeServer(read_only_at(db, 8, 3600.0), nodes=NODES, tickers=tickers)
    runner = night(db_url, demo_dir, first, db_write_budget_s=1.0, home=tmp_path)
    outcome = await run_freeing_the_disk_at_the_stop(
        runner, BatchPlan("nightly", DEMO_AS_OF, tickers), db)  # type: ignore[arg-type]
    assert outcome.status == "interrupted" and not outcome.failed, outcome
    assert outcome.halt is not None and outcome.halt.exit_code == 2
    assert "within the write budget (1 s): cannot execute" in outcome.halt.message
    assert "in a read-only transaction" in outcome.halt.message
    assert f"nightdesk run --resume {outcome.batch_id}" in outcome.halt.message
    engine = get_engine(db_url)
    second = FakeServer(nodes=NODES, tickers=tickers)
    resumed = await night(db_url, demo_dir, second, home=tmp_path).run(
        find_resumable(engine, None, stale_s=120))
    assert resumed.status == "succeeded", (resumed.failed, resumed.halt)
    check_rows_match(engine, first, second)
