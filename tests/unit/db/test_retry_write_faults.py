"""A full SQLite disk under a night's writes: ridden out within the write budget; past it the
batch stops resumable, keeps its usage rows, and one resume finishes it with every row.

The disk is made full for real (``PRAGMA max_page_count``, tests/dbfaults.py): SQLite answers
``SQLITE_FULL`` on the usage rows (and every other insert of the database), or on the
checkpoint file. After each night the rows must equal the fake server's request log. The
usage writer's spool is tried on its own too: rows kept past the budget, rows that cannot
be kept, a spool that cannot be read.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import structlog
from sqlalchemy import Engine, select
from typer.testing import CliRunner

from agents.data.demo import DEMO_AS_OF, demo_tickers
from agents.graph import node_names
from app.batch.engine import BatchEngine, BatchOutcome, BatchPlan
from app.cli import app as cli
from app.config import load_settings
from app.db.models import Batch, LLMCall, LLMRequest, TickerRun
from app.db.retry import transient, write_budget
from app.errors import BatchStopped, DatabaseError, StorageOutage, UsageLost
from app.runs.resumable import find_resumable
from app.usage import UsageRecorder, read_spool, spool_path
from tests.dbfaults import (
    SqliteFull,
    check_rows_match,
    failed_writes,
    fill_at,
    run_freeing_the_disk_at_the_stop,
)
from tests.fakevllm import FakeServer
from tests.fakevllm.chat import Reply
from tests.unit.support.call_rows import new_batch
from tests.unit.support.call_rows import told as told_batch
from tests.unit.support.clirun import run_cli
from tests.unit.support.engines import make_engine
from tests.unit.support.fault_night import serve_cli_from

NODES = node_names(load_settings().pipeline())


def night(db: Engine, demo_dir: Path, server: FakeServer, **overrides: Any) -> BatchEngine:
    settings = load_settings(retry_backoff_s=0.01, check_context_length=False, **overrides)
    return make_engine(db, demo_dir, server, settings)


def test_a_real_sqlite_full_is_a_transient_write_error(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db")
    conn.execute("CREATE TABLE t (b BLOB)")
    conn.execute("PRAGMA max_page_count = 1")
    with pytest.raises(sqlite3.OperationalError) as full:
        conn.execute("INSERT INTO t VALUES (zeroblob(100000))")
    assert transient(full.value)
    with pytest.raises(sqlite3.OperationalError) as no_table:
        conn.execute("INSERT INTO nope VALUES (1)")
    assert not transient(no_table.value)


@contextlib.asynccontextmanager
async def full_disk(disk: SqliteFull, where: str, db: Engine,
                    monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """Put ``disk`` under the database (usage rows, ticker rows) or the checkpoint file."""
    if where == "database":
        with disk.engine(db):
            yield
    else:
        async with disk.checkpoints(monkeypatch):
            yield


def stopped_on_a_full_disk(db: Engine, demo_dir: Path, tickers: list[str], where: str,
                           monkeypatch: pytest.MonkeyPatch) -> tuple[FakeServer, BatchOutcome]:
    """Run a night whose disk (``where``: database or checkpoints) fills at the 8th answer for
    good, past a 1 s write budget, and is freed once the batch stops; return its server and
    outcome."""
    disk = SqliteFull()
    server = FakeServer(fill_at(disk, 8, float("inf")), nodes=NODES, tickers=tickers)
    runner = night(db, demo_dir, server, db_write_budget_s=1.0)

    async def first_night() -> BatchOutcome:
        async with full_disk(disk, where, db, monkeypatch):
            return await run_freeing_the_disk_at_the_stop(
                runner, BatchPlan("nightly", DEMO_AS_OF, tickers), disk)

    return server, asyncio.run(first_night())


@pytest.mark.parametrize("where", ["database", "checkpoints"])
async def test_a_full_disk_for_five_seconds_is_ridden_out(
        where: str, sqlite_engine: Engine, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    tickers = demo_tickers(2)
    disk = SqliteFull()
    server = FakeServer(fill_at(disk, 5, 5.0), nodes=NODES, tickers=tickers)
    with structlog.testing.capture_logs() as logs:
        async with full_disk(disk, where, sqlite_engine, monkeypatch):
            outcome = await night(sqlite_engine, demo_dir, server).run(
                BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert outcome.status == "succeeded", (outcome.failed, outcome.halt)
    assert sorted(outcome.succeeded) == sorted(tickers)
    said = failed_writes(logs)
    assert said and set(said) == {"database or disk is full"}  # the fault was met, and passed
    if where == "database":
        assert any(e["event"] == "usage write failed; will retry" for e in logs)
    check_rows_match(sqlite_engine, server)


@pytest.mark.parametrize("where", ["database", "checkpoints"])
def test_a_full_disk_past_the_budget_stops_resumable_and_one_resume_has_every_row(
        where: str, sqlite_engine: Engine, sqlite_url: str, demo_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    tickers = demo_tickers(3)
    first, outcome = stopped_on_a_full_disk(sqlite_engine, demo_dir, tickers, where, monkeypatch)

    # Stopped, resumable, the reason named; no ticker failed for a fault not its own.
    assert outcome.status == "interrupted" and not outcome.failed
    assert outcome.halt is not None and outcome.halt.exit_code == 2
    reason = outcome.halt.message
    assert "within the write budget (1 s): database or disk is full" in reason
    assert f"nightdesk run --resume {outcome.batch_id}" in reason
    with sqlite_engine.connect() as conn:
        batch = conn.execute(select(Batch.status, Batch.error)).one()
        runs = set(conn.execute(select(TickerRun.status)).scalars())
        stored = len(conn.execute(select(LLMCall.id)).all())
    assert tuple(batch) == ("interrupted", reason)
    assert "failed" not in runs and "interrupted" in runs
    spool = spool_path(tmp_path, sqlite_url, outcome.batch_id)
    if where == "database":
        # The rows the database did not take wait in the spool; none is lost.
        kept = read_spool(spool)
        assert kept["calls"] and stored + len(kept["calls"]) == len(first.chats)
        assert "kept in" in reason
    else:
        assert not spool.exists() and stored == len(first.chats)

    # One `nightdesk run --resume` finishes the night (the CLI on the same database).
    second = FakeServer(nodes=NODES, tickers=tickers)
    serve_cli_from(monkeypatch, second, demo_dir)
    monkeypatch.setenv("NIGHTDESK_CHECK_CONTEXT_LENGTH", "false")
    result = CliRunner().invoke(cli, ["run", "--resume", "--no-preflight"])
    assert result.exit_code == 0, result.output
    with sqlite_engine.connect() as conn:
        assert set(conn.execute(select(TickerRun.status)).scalars()) == {"succeeded"}
        assert conn.execute(select(Batch.status)).scalar_one() == "succeeded"
    assert not spool.exists()
    # The night plus its resume: one row per request either server saw, none twice.
    check_rows_match(sqlite_engine, first, second)


def call_row(batch_id: int, n: int) -> dict[str, Any]:
    at = datetime(2026, 12, 4, 23, 0, n, 123456, tzinfo=UTC)
    return {"batch_id": batch_id, "ticker": "X", "node": "market", "sample": 0,
            "call_id": f"c{n}", "attempt": 1, "model": "m", "status": "ok",
            "started_at": at, "ended_at": at, "latency_s": 0.5}


def hand_in(recorder: UsageRecorder, batch_id: int, n: int) -> None:
    """Hand the writer call ``n``: its body (large and random, so storing it needs new
    pages of a full file) and its row."""
    recorder.record_request({"batch_id": batch_id, "ticker": "X", "node": "market",
                             "sample": 0, "call_id": f"c{n}"},
                            {"messages": os.urandom(20_000).hex()})
    recorder.record_call(call_row(batch_id, n))


async def test_rows_not_stored_in_the_budget_wait_in_the_spool_and_the_next_run_stores_them_once(
        sqlite_engine: Engine, tmp_path: Path) -> None:
    batch_id = new_batch(sqlite_engine)
    spool, disk = tmp_path / "spool" / "usage.jsonl", SqliteFull()
    told: list[BatchStopped] = []
    with disk.engine(sqlite_engine), write_budget(0.5):
        disk.hold()
        recorder = UsageRecorder(sqlite_engine, flush_interval_s=0.01, spool=spool)
        async with recorder:  # the batch was told already: its exit raises nothing new
            telling = asyncio.create_task(told_batch(recorder, told))
            hand_in(recorder, batch_id, 0)
            with pytest.raises(StorageOutage, match=r"within the write budget \(0.5 s\): "
                               r"database or disk is full; kept in .*usage\.jsonl for the "
                               r"resume"):
                await recorder.drain()  # no node is checkpointed without its rows
            hand_in(recorder, batch_id, 1)  # a call that ended while the batch stopped
        telling.cancel()
    assert len(told) == 1 and told[0].status == "interrupted" and told[0].exit_code == 2
    kept = read_spool(spool)
    assert [r["call_id"] for r in kept["calls"]] == ["c0", "c1"]
    assert [r["call_id"] for r in kept["requests"]] == ["c0", "c1"]
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(LLMCall.id)).all() == []

    # The batch's next run: the spool is written first, once, then removed.
    async with UsageRecorder(sqlite_engine, flush_interval_s=0.01, spool=spool) as again:
        hand_in(again, batch_id, 2)
        await again.drain()
    assert not spool.exists()
    with sqlite_engine.connect() as conn:
        calls = conn.execute(select(LLMCall.call_id, LLMCall.started_at)
                             .order_by(LLMCall.call_id)).all()
        bodies = conn.execute(select(LLMRequest.call_id)).scalars().all()
    assert [c for c, _ in calls] == ["c0", "c1", "c2"] and sorted(bodies) == ["c0", "c1", "c2"]
    # What the spool kept is what was handed in (times to the microsecond).
    assert [at for _, at in calls] == [call_row(batch_id, n)["started_at"] for n in range(3)]


async def test_rows_that_cannot_be_kept_either_stop_the_batch_failed_saying_so(
        sqlite_engine: Engine, tmp_path: Path) -> None:
    batch_id = new_batch(sqlite_engine)
    spool, disk = tmp_path / "a-file" / "usage.jsonl", SqliteFull()
    with disk.engine(sqlite_engine), write_budget(0.5):
        disk.hold()
        with pytest.raises(UsageLost) as lost:
            async with UsageRecorder(sqlite_engine, flush_interval_s=0.01,
                                     spool=spool) as recorder:
                shutil.rmtree(tmp_path / "a-file")  # made at the start, for the room set aside
                (tmp_path / "a-file").write_text("")  # the spool's folder cannot be made now
                hand_in(recorder, batch_id, 0)
    assert lost.value.status == "failed"
    assert str(lost.value) == ("usage rows could not be stored (2 not written): database or "
                               f"disk is full; nor kept in {spool}: File exists")


async def test_rows_the_home_cannot_keep_wait_off_it_and_the_next_run_stores_them_once(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The home takes no write (a read-only filesystem, here a folder that cannot be made):
    # the rows go to the runtime directory (the units' /run/nightdesk), said in the line.
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(tmp_path / "run"))
    batch_id = new_batch(sqlite_engine)
    spool, disk = tmp_path / "a-file" / "usage.jsonl", SqliteFull()
    spare = tmp_path / "run" / "usage.jsonl"
    told: list[BatchStopped] = []
    with disk.engine(sqlite_engine), write_budget(0.5):
        disk.hold()
        recorder = UsageRecorder(sqlite_engine, flush_interval_s=0.01, spool=spool)
        async with recorder:
            telling = asyncio.create_task(told_batch(recorder, told))
            shutil.rmtree(tmp_path / "a-file")  # made at the start, for the room set aside
            (tmp_path / "a-file").write_text("")
            hand_in(recorder, batch_id, 0)
            with pytest.raises(StorageOutage) as kept:
                await recorder.drain()
            hand_in(recorder, batch_id, 1)  # a call that ended while the batch stopped
        telling.cancel()
    assert str(kept.value) == (
        "usage rows not stored within the write budget (0.5 s): database or disk is full; "
        f"kept in {spare} (not in {spool}: File exists; a reboot empties that place) for the "
        "resume")
    assert recorder.untold is kept.value and told[0].status == "interrupted"
    assert [r["call_id"] for r in read_spool(spare)["calls"]] == ["c0", "c1"]
    (tmp_path / "a-file").unlink()  # the home writable again
    async with UsageRecorder(sqlite_engine, flush_interval_s=0.01, spool=spool) as again:
        hand_in(again, batch_id, 2)
        await again.drain()
    assert not spare.exists() and not spool.exists()
    with sqlite_engine.connect() as conn:
        calls = conn.execute(select(LLMCall.call_id).order_by(LLMCall.call_id)).scalars().all()
    assert calls == ["c0", "c1", "c2"]


async def test_a_spool_that_cannot_be_read_stops_the_start_in_one_line(
        sqlite_engine: Engine, tmp_path: Path) -> None:
    spool = tmp_path / "usage.jsonl"
    spool.write_text('{"table": "calls", "row": {"call_id": "c0"}}\nnot json\n')
    with pytest.raises(DatabaseError) as refused:
        async with UsageRecorder(sqlite_engine, spool=spool):
            pass
    assert str(refused.value) == (f"cannot read the usage rows kept in {spool}: "
                                  "JSONDecodeError: Expecting value: line 1 column 1 (char 0)")
    assert spool.exists()  # kept for when it can be read


def test_a_resume_under_another_home_does_not_lose_the_kept_rows_silently(
        sqlite_engine: Engine, sqlite_url: str, demo_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    tickers = demo_tickers(3)
    first, outcome = stopped_on_a_full_disk(sqlite_engine, demo_dir, tickers, "database",
                                           monkeypatch)
    spool = spool_path(tmp_path, sqlite_url, outcome.batch_id)
    assert outcome.status == "interrupted" and read_spool(spool)["calls"]
    # The advised `nightdesk run --resume`, run where NIGHTDESK_HOME is another folder (an
    # operator's shell beside the units' /var/lib/nightdesk): it would not see the spool.
    second = FakeServer(nodes=NODES, tickers=tickers)
    serve_cli_from(monkeypatch, second, demo_dir)
    monkeypatch.setenv("NIGHTDESK_CHECK_CONTEXT_LENGTH", "false")
    monkeypatch.setenv("NIGHTDESK_HOME", str(tmp_path / "operator"))
    monkeypatch.setenv("NIGHTDESK_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("NIGHTDESK_DATA_DIR", str(demo_dir))
    refused = run_cli("run", "--resume", "--no-preflight")
    # Refused in one line naming the file and the home that keeps it; the batch untouched.
    said = refused.error_lines[-1]  # after the line announcing the resume
    assert refused.code == 2 and said.startswith("error: batch 1's usage rows"), refused.stderr
    assert str(spool) in said and f"NIGHTDESK_HOME={tmp_path}" in said
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.status)).scalar_one() == "interrupted"
    assert second.chats == [] and spool.exists()
    # Run with the home that ran the night, it stores the kept rows and finishes.
    monkeypatch.setenv("NIGHTDESK_HOME", str(tmp_path))
    result = CliRunner().invoke(cli, ["run", "--resume", "--no-preflight"])
    assert result.exit_code == 0, result.output
    assert not spool.exists()
    check_rows_match(sqlite_engine, first, second)


def test_a_resume_back_under_the_first_home_sees_the_rows_a_resume_elsewhere_kept(
        sqlite_engine: Engine, sqlite_url: str, demo_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    tickers = demo_tickers(3)
    # The night, under NIGHTDESK_HOME=tmp_path: stopped by a 404, nothing kept in a spool.
    first = FakeServer(lambda chat: Reply(status=404) if chat.index >= 10 else None,
                       nodes=NODES, tickers=tickers)
    outcome = asyncio.run(night(sqlite_engine, demo_dir, first).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers)))
    assert outcome.status == "failed" and outcome.batch_id == 1
    # Resumed under another home, where the disk fills: the rows not stored are kept there.
    operator, disk = tmp_path / "operator", SqliteFull()
    second = FakeServer(fill_at(disk, 8, float("inf")), nodes=NODES, tickers=tickers)
    runner = night(sqlite_engine, demo_dir, second, db_write_budget_s=1.0, home=operator,
                   database_url=sqlite_url)

    async def resumed_elsewhere() -> BatchOutcome:
        async with full_disk(disk, "database", sqlite_engine, monkeypatch):
            return await run_freeing_the_disk_at_the_stop(
                runner, find_resumable(sqlite_engine, 1, 60.0), disk)

    assert asyncio.run(resumed_elsewhere()).status == "interrupted"
    spool = spool_path(operator, sqlite_url, 1)
    assert read_spool(spool)["calls"]
    # Resumed again under the night's first home: refused, naming the home that keeps them.
    third = FakeServer(nodes=NODES, tickers=tickers)
    serve_cli_from(monkeypatch, third, demo_dir)
    for key, value in {"NIGHTDESK_CHECK_CONTEXT_LENGTH": "false",
                       "NIGHTDESK_DATABASE_URL": sqlite_url,
                       "NIGHTDESK_DATA_DIR": str(demo_dir)}.items():
        monkeypatch.setenv(key, value)
    refused = run_cli("run", "--resume", "--no-preflight")
    said = refused.error_lines[-1]
    assert refused.code == 2 and said.startswith("error: batch 1's usage rows"), refused.stderr
    assert str(spool) in said and f"NIGHTDESK_HOME={operator}" in said
    assert third.chats == [] and spool.exists()
    # Under that home, the resume stores them and finishes; no row lost or doubled.
    monkeypatch.setenv("NIGHTDESK_HOME", str(operator))
    finished = run_cli("run", "--resume", "--no-preflight")
    assert finished.code == 0, finished.stderr
    assert not spool.exists()
    check_rows_match(sqlite_engine, first, second, third)
