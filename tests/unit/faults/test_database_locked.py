"""SQLite locked by another writer past its busy timeout, in the middle of a night.

Another process (a hand-run ``sqlite3``, a backup) holding the write lock makes each write
of the night in that window wait out SQLite's busy timeout and fail with "database is
locked" (here the usage writer's, which writes all night). That is the infrastructure's
fault: the write is tried again as a whole for the write budget (app/db/retry.py), and the
night ends as if the lock had not been there. A real lock, held on the file by a second
connection; the busy timeout shortened from 30 s so the test takes seconds.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
import structlog
from sqlalchemy import Engine

from agents.data.demo import DEMO_AS_OF, demo_tickers
from app.batch.engine import BatchPlan
from app.db import engine as db_engine
from tests.fakevllm import ChatRequest, FakeServer
from tests.unit.support.fault_night import (
    NODES,
    assert_rows_match_the_servers,
    night_engine,
    ticker_states,
)

TICKERS = demo_tickers(2)
HELD_S = 3.0
BUSY_TIMEOUT_S = 0.3


async def test_a_write_lock_held_by_another_process_is_waited_out(
        sqlite_engine: Engine, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def short_busy_timeout(url: Any, **kwargs: Any) -> Engine:
        return sqlalchemy.create_engine(url, **{**kwargs,
                                                "connect_args": {"timeout": BUSY_TIMEOUT_S}})

    monkeypatch.setattr(db_engine, "create_engine", short_busy_timeout)
    db = db_engine.make_engine(sqlite_engine.url.render_as_string(hide_password=False))
    assert sqlite_engine.url.database is not None
    other = sqlite3.connect(sqlite_engine.url.database, isolation_level=None,
                            check_same_thread=False)
    released: list[float] = []

    async def lock_mid_night(chat: ChatRequest) -> None:
        if chat.index == 12:  # the analysts answered, the debate begins
            other.execute("BEGIN IMMEDIATE")  # the write lock, as a writer holds it

            async def release() -> None:
                await asyncio.sleep(HELD_S)
                other.execute("COMMIT")
                released.append(HELD_S)

            asyncio.get_running_loop().create_task(release())

    server = FakeServer(lock_mid_night, nodes=NODES, tickers=TICKERS)
    with structlog.testing.capture_logs() as logs:
        outcome = await night_engine(db, demo_dir, server).run(
            BatchPlan("nightly", DEMO_AS_OF, TICKERS))
    other.close()
    assert released == [HELD_S]
    locked = [e for e in logs if e.get("log_level") == "warning"
              and "locked" in str(e.get("error", ""))]
    assert locked, "no write met the lock"  # the writes did meet it, and were retried
    assert outcome.status == "succeeded" and outcome.halt is None, outcome.failed
    assert ticker_states(db, outcome.batch_id) == dict.fromkeys(TICKERS, ("succeeded", None))
    assert_rows_match_the_servers(db, outcome.batch_id, [server])
