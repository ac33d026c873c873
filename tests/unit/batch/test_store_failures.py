"""A ticker whose result cannot be stored fails alone; what PostgreSQL cannot hold is cleaned."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select
from sqlalchemy.exc import OperationalError

from agents.data.demo import DEMO_AS_OF, demo_tickers
from agents.graph import node_names
from app.batch import store
from app.batch.engine import BatchPlan
from app.config import load_settings
from app.db.models import Batch, Decision, TickerRun
from tests.fakevllm import FakeServer
from tests.unit.support.engines import make_engine
from tests.unit.support.servers import nul_script


async def test_a_ticker_whose_result_cannot_be_stored_fails_alone(
        sqlite_engine: Engine, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tickers = demo_tickers(3)
    unlucky = tickers[1]
    real = store.ticker_finished

    def ticker_finished(engine: Engine, batch_id: int, ticker: str, decisions: list[Any],
                        error: str | None, failure_class: str | None = None) -> None:
        if ticker == unlucky and decisions:
            raise OperationalError("INSERT INTO decisions", {},
                                   sqlite3.OperationalError("database disk image is malformed"))
        real(engine, batch_id, ticker, decisions, error, failure_class)

    monkeypatch.setattr(store, "ticker_finished", ticker_finished)
    server = FakeServer(nodes=node_names(load_settings().pipeline()), tickers=tickers)
    outcome = await make_engine(sqlite_engine, demo_dir, server).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers))
    # The night goes on: the other tickers are stored, the batch says it is incomplete.
    assert outcome.status == "partial"
    assert sorted(outcome.succeeded) == sorted(set(tickers) - {unlucky})
    assert list(outcome.failed) == [unlucky]
    assert "not stored" in outcome.failed[unlucky]
    assert "malformed" in outcome.failed[unlucky]
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    with sqlite_engine.connect() as conn:
        runs = dict(conn.execute(select(TickerRun.ticker, TickerRun.status)).all())
        reason = conn.execute(select(TickerRun.error)
                              .where(TickerRun.ticker == unlucky)).scalar_one()
        batch = conn.execute(select(Batch.status, Batch.tickers_succeeded,
                                    Batch.tickers_failed)).one()
    assert runs == {**dict.fromkeys(tickers, "succeeded"), unlucky: "failed"}
    assert "malformed" in reason
    assert tuple(batch) == ("partial", 2, 1)


async def test_ticker_finished_is_one_transaction(sqlite_engine: Engine, demo_dir: Path) -> None:
    # The status update fails after the decisions were inserted: they must not stay behind
    # as the decisions of a ticker that is not recorded as succeeded.
    tickers = demo_tickers(2)
    unlucky = tickers[0]

    @event.listens_for(sqlite_engine, "before_cursor_execute")
    def fail_status(conn: Any, cursor: Any, statement: str, params: Any, *args: Any) -> None:
        if (statement.startswith("UPDATE ticker_runs") and unlucky in str(params)
                and "succeeded" in str(params)):
            raise OperationalError(statement, params, sqlite3.OperationalError("disk I/O error"))

    try:
        server = FakeServer(nodes=node_names(load_settings().pipeline()), tickers=tickers)
        outcome = await make_engine(sqlite_engine, demo_dir, server).run(
            BatchPlan("nightly", DEMO_AS_OF, tickers))
    finally:
        event.remove(sqlite_engine, "before_cursor_execute", fail_status)
    assert list(outcome.failed) == [unlucky] and outcome.succeeded == [tickers[1]]
    with sqlite_engine.connect() as conn:
        left = conn.execute(select(func.count()).select_from(Decision)
                            .where(Decision.ticker == unlucky)).scalar_one()
        status = conn.execute(select(TickerRun.status)
                              .where(TickerRun.ticker == unlucky)).scalar_one()
    assert (left, status) == (0, "failed")


async def test_a_store_that_fails_for_a_moment_is_retried_and_the_ticker_kept(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    # "database is locked" twice, as SQLite says while another writer holds it: the whole
    # transaction is tried again and the ticker's result is stored once.
    tickers = demo_tickers(2)
    unlucky = tickers[0]
    failures = {"left": 2}

    @event.listens_for(sqlite_engine, "before_cursor_execute")
    def locked(conn: Any, cursor: Any, statement: str, params: Any, *args: Any) -> None:
        if (statement.startswith("UPDATE ticker_runs") and unlucky in str(params)
                and "succeeded" in str(params) and failures["left"] > 0):
            failures["left"] -= 1
            raise OperationalError(statement, params,
                                   sqlite3.OperationalError("database is locked"))

    try:
        server = FakeServer(nodes=node_names(load_settings().pipeline()), tickers=tickers)
        outcome = await make_engine(sqlite_engine, demo_dir, server).run(
            BatchPlan("nightly", DEMO_AS_OF, tickers))
    finally:
        event.remove(sqlite_engine, "before_cursor_execute", locked)
    assert failures["left"] == 0  # both failures happened
    assert outcome.status == "succeeded" and sorted(outcome.succeeded) == sorted(tickers)
    with sqlite_engine.connect() as conn:
        stored = conn.execute(select(func.count()).select_from(Decision)
                              .where(Decision.ticker == unlucky)).scalar_one()
    assert stored == 1  # once, not once per try


async def test_text_postgresql_cannot_hold_is_cleaned_before_it_is_stored(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    tickers = demo_tickers(1)
    server = FakeServer(nul_script, nodes=node_names(load_settings().pipeline()), tickers=tickers)
    outcome = await make_engine(sqlite_engine, demo_dir, server).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert outcome.status == "succeeded"
    with sqlite_engine.connect() as conn:
        summary = conn.execute(select(Decision.summary)).scalar_one()
    assert summary == "Steady trend."
    # The market report reaches the next prompts cleaned: no NUL, the surrogate replaced.
    later = next(c for c in server.chats if c.node == "bull_r1")
    assert "Price action\ufffd is firm." in later.user
