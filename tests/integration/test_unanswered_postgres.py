"""A PostgreSQL server that takes TCP but never answers (its backend stopped, a proxy that
swallows bytes) cancels nothing at statement_timeout, and its kernel acknowledges every
byte, so the keepalives see nothing wrong. Every connection a night makes (its engine's, the
nightly lock's, the checkpoint pool's) gives such an exchange up at the statement timeout
plus a grace, as a lost connection, whether nothing came back or a result stopped part
way; a night meeting such a server rides it out. Before, each statement waited for ever."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from sqlalchemy import select, text
from sqlalchemy.engine import make_url

from agents.data.demo import DEMO_AS_OF, demo_tickers
from agents.data.snapshot import SnapshotProvider
from agents.graph import node_names
from app.batch.engine import BatchEngine, BatchPlan
from app.config import load_settings
from app.db.engine import get_engine, make_engine
from app.db.lock import nightly_lock
from app.db.models import Batch, Decision
from app.runs.checkpoints import Checkpoints, open_checkpointer
from tests.dbfaults import TcpProxy, check_rows_match, failed_writes, timed_apart
from tests.fakevllm import ChatRequest, FakeServer
from tests.integration.conftest import private_database

pytestmark = pytest.mark.integration

BOUND_S = 1.0  # NIGHTDESK_DB_STATEMENT_TIMEOUT_S here
GIVEN_UP_S = BOUND_S + 5.0  # app.db.engine.ANSWER_GRACE_S written out
WAITED_S = 40.0  # how long the test lets a statement wait before it calls it stuck
BIG = "SELECT repeat('x', 200000)"  # an answer of many packets: it can stop part way
NODES = node_names(load_settings().pipeline())


@pytest.fixture
def through() -> Iterator[tuple[str, TcpProxy]]:
    """A migrated database of this test's own with the checkpoint tables made, and its URL
    through a proxy in front of the server."""
    with private_database(f"nightdesk_unanswered_{os.getpid()}_{uuid.uuid4().hex[:8]}",
                          upgraded=True) as url:
        asyncio.run(_tables(url))
        proxy = TcpProxy(("127.0.0.1", 5432))
        try:
            yield make_url(url).set(port=proxy.port).render_as_string(
                hide_password=False), proxy
        finally:
            proxy.close()  # frees any statement still waiting
            get_engine(make_url(url).set(port=proxy.port).render_as_string(
                hide_password=False)).dispose()


async def _tables(url: str) -> None:
    async with open_checkpointer(url):
        pass


def _checkpoint_pool(url: str, ready: threading.Event, go: threading.Event,
                     took: dict[str, Any]) -> None:
    async def run() -> None:
        async with open_checkpointer(url, statement_timeout_s=BOUND_S) as saver, \
                saver.conn.connection() as conn:  # type: ignore[attr-defined]
            ready.set()
            await asyncio.to_thread(go.wait)
            started = time.monotonic()
            try:
                await conn.execute(BIG)
                took["checkpoint pool"] = "answered"
            except Exception:
                took["checkpoint pool"] = time.monotonic() - started
    with contextlib.suppress(Exception):  # the pool's close, the proxy gone
        asyncio.run(run())


@pytest.mark.parametrize("keep", [None, 300], ids=["nothing-back", "result-cut-part-way"])
def test_every_connection_gives_up_a_server_that_never_answers(
        keep: int | None, through: tuple[str, TcpProxy]) -> None:
    url, proxy = through
    took: dict[str, Any] = {}
    go = threading.Event()
    engine = make_engine(url, BOUND_S)
    ready = threading.Event()
    pool = threading.Thread(target=_checkpoint_pool, args=(url, ready, go, took), daemon=True)
    pool.start()
    with engine.connect() as conn, nightly_lock(engine, BOUND_S) as hold:
        assert ready.wait(30)
        conn.execute(text("SELECT 1"))
        lock_conn = hold._conn  # type: ignore[attr-defined]
        runs = {"engine": lambda: conn.execute(text(BIG)),
                "nightly lock": lambda: lock_conn.execute(text(BIG))}
        threads = timed_apart(runs, took, go)
        proxy.swallow(keep=keep)
        started = time.monotonic()
        go.set()
        for thread in [*threads, pool]:
            thread.join(max(0.1, WAITED_S - (time.monotonic() - started)))
        stuck = {name: took.get(name, "stuck") for name in [*runs, "checkpoint pool"]}
        proxy.close()  # ends whatever still waits, before the lock lets go
        with contextlib.suppress(Exception):
            conn.rollback()
    engine.dispose()
    assert all(isinstance(s, float) and GIVEN_UP_S - 0.5 < s < GIVEN_UP_S + 10
               for s in stuck.values()), stuck


@pytest.mark.parametrize("keep", [None, 0], ids=["nothing-through", "answers-lost"])
def test_a_night_rides_out_a_database_that_answers_nothing_for_a_while(
        keep: int | None, through: tuple[str, TcpProxy], demo_dir: Path) -> None:
    # answers-lost: the statements reach the server, which runs and commits them, but no
    # answer comes back; each write is retried whole and must not store a row twice.
    url, proxy = through
    tickers = demo_tickers(2)

    def mute(chat: ChatRequest) -> None:
        if chat.index == 6:
            proxy.swallow(8.0, keep=keep)

    server = FakeServer(mute, nodes=NODES, tickers=tickers)
    settings = load_settings(database_url=url, retry_backoff_s=0.01, check_context_length=False,
                             db_write_budget_s=90.0, db_statement_timeout_s=BOUND_S)
    engine = get_engine(url, BOUND_S)
    runner = BatchEngine(settings, engine,
                         http_client=httpx.AsyncClient(transport=server.transport()),
                         provider=SnapshotProvider(demo_dir), sample_metrics=False,
                         checkpoints=Checkpoints(url, engine, BOUND_S))
    stuck = threading.Timer(150, proxy.close)  # a night stuck ends failed, not hung
    stuck.start()
    try:
        with structlog.testing.capture_logs() as logs:
            outcome = asyncio.run(runner.run(BatchPlan("nightly", DEMO_AS_OF, tickers)))
        assert not stuck.finished.is_set(), "the night waited on the silent database"
        assert outcome.status == "succeeded", (outcome.failed, outcome.halt)
        assert failed_writes(logs)  # writes met the silent database, and passed
        check_rows_match(engine, server)
        with engine.connect() as conn:
            batches = conn.execute(select(Batch.status)).scalars().all()
            decisions = Counter(conn.execute(select(Decision.ticker, Decision.sample)).all())
        assert batches == ["succeeded"]
        assert sorted(decisions.values()) == [1] * len(tickers)
    finally:
        stuck.cancel()
        engine.dispose()
