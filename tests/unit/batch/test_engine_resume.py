"""Stop batches on purpose (a halt, a stale heartbeat, a dead server) and resume them by node."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, func, select, update
from structlog.testing import capture_logs
from typer.testing import CliRunner

from agents.data.demo import DEMO_AS_OF, demo_tickers
from agents.data.snapshot import SnapshotProvider
from agents.graph import node_names
from app.batch import store
from app.batch.engine import BatchEngine, BatchPlan
from app.cli import app as cli
from app.config import load_settings
from app.db.batchsettings import BatchSettings
from app.db.lock import nightly_lock
from app.db.models import Batch, Decision, LLMCall, TickerRun
from app.errors import AlreadyRunningError, InputError, StorageOutage
from app.runs.checkpoints import Checkpoints, checkpoint_path
from app.runs.nightly import resume_recorded
from app.runs.resumable import find_resumable, mark_stale_crashed
from app.tasks import patience
from app.traffic.halt import HaltReason
from tests.fakevllm import ChatRequest, FakeServer, Reply, default_reply
from tests.unit.support.clirun import run_cli
from tests.unit.support.fault_night import serve_cli_from
from tests.unit.support.night_rows import dead_night
from tests.unit.support.sigterm import sigterm_at_first
from tests.unit.support.threads import Blocking

NODES = node_names(load_settings().pipeline())


def engine_for(db: Engine, demo_dir: Path, server: FakeServer | None = None,
               **overrides: Any) -> BatchEngine:
    settings = load_settings(retry_backoff_s=0.01, server_probe_interval_s=0.05, **overrides)
    http = httpx.AsyncClient(transport=server.transport() if server else None)
    return BatchEngine(settings, db, http_client=http, provider=SnapshotProvider(demo_dir),
                       sample_metrics=False,
                       checkpoints=Checkpoints(settings.store.database_url, db))


def ok_nodes(server: FakeServer) -> list[tuple[str | None, str | None, int | None]]:
    return [(c.ticker, c.node, c.sample) for c in server.served()]


def checkpoint_threads(db_url: str) -> int:
    with sqlite3.connect(checkpoint_path(db_url)) as conn:
        return int(conn.execute("SELECT COUNT(DISTINCT thread_id) FROM checkpoints").fetchone()[0])


async def test_a_halted_batch_resumes_from_its_last_finished_nodes(
        sqlite_engine: Engine, sqlite_url: str, demo_dir: Path) -> None:
    tickers = demo_tickers(3)
    first: BatchEngine

    def stop_at_bull(chat: ChatRequest) -> Reply | None:
        if chat.node == "bull_r1" and chat.ticker == tickers[0]:
            # Stopped while this call is at the server: it may finish within the grace.
            first.halt.request(HaltReason("interrupted", "stopped by the test", 130, 5.0))
            return Reply(default_reply(chat), delay_s=0.3)
        return None

    server1 = FakeServer(stop_at_bull, nodes=NODES, tickers=tickers)
    first = engine_for(sqlite_engine, demo_dir, server1)
    outcome = await first.run(BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert outcome.status == "interrupted" and outcome.halt is not None
    done_first = ok_nodes(server1)
    assert (tickers[0], "bull_r1", 0) in done_first  # the call in flight was let finish
    assert len(done_first) < 3 * 17
    with sqlite_engine.connect() as conn:
        statuses = dict(conn.execute(select(TickerRun.ticker, TickerRun.status)).all())
    assert "interrupted" in statuses.values() and "failed" not in statuses.values()

    point = find_resumable(sqlite_engine, None, stale_s=120)
    assert point.batch_id == outcome.batch_id
    server2 = FakeServer(nodes=NODES, tickers=tickers)
    second = engine_for(sqlite_engine, demo_dir, server2)
    resumed = await second.run(point)
    assert resumed.status == "succeeded" and sorted(resumed.succeeded) == sorted(tickers)
    done_second = ok_nodes(server2)
    # No finished node was called again, and together the two runs did every node once.
    assert not set(done_first) & set(done_second)
    assert Counter(done_first + done_second) == Counter(
        (t, n, 0) for t in tickers for n in NODES)
    with sqlite_engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(LLMCall)).scalar_one()
        decisions = conn.execute(select(func.count()).select_from(Decision)).scalar_one()
        batch = conn.execute(select(Batch.status, Batch.tickers_succeeded, Batch.settings)).one()
        attempts = conn.execute(select(TickerRun.attempt)).scalars().all()
    assert rows == len(server1.chats) + len(server2.chats)  # one row per request, none lost
    assert decisions == 3
    assert batch.status == "succeeded" and batch.tickers_succeeded == 3
    assert len(batch.settings["resumes"]) == 1
    assert max(attempts) == 2  # the resumed tickers' second attempt
    assert checkpoint_threads(sqlite_url) == 0  # a finished batch leaves no checkpoints


async def test_a_resumed_node_is_a_new_call_beside_the_cut_one(sqlite_engine: Engine,
                                                                demo_dir: Path) -> None:
    ticker = demo_tickers(1)[0]
    first: BatchEngine

    def hang_at_trader(chat: ChatRequest) -> Reply | None:
        if chat.node == "trader":
            first.halt.request(HaltReason("interrupted", "stopped by the test", 130, 0.2))
            return Reply(default_reply(chat), delay_s=30)  # cut when the grace runs out
        return None

    server1 = FakeServer(hang_at_trader, nodes=NODES, tickers=[ticker])
    first = engine_for(sqlite_engine, demo_dir, server1)
    outcome = await first.run(BatchPlan("nightly", DEMO_AS_OF, [ticker]))
    assert outcome.status == "interrupted"
    server2 = FakeServer(nodes=NODES, tickers=[ticker])
    resumed = await engine_for(sqlite_engine, demo_dir, server2).run(
        find_resumable(sqlite_engine, outcome.batch_id, stale_s=120))
    assert resumed.status == "succeeded"
    assert server2.chats[0].node == "trader"  # picks up at the cut node
    with sqlite_engine.connect() as conn:
        trader = conn.execute(select(LLMCall.call_id, LLMCall.attempt, LLMCall.status)
                              .where(LLMCall.node == "trader").order_by(LLMCall.id)).all()
    # The cut attempt keeps its row; the resumed node's call is another, from attempt 1.
    assert [(r.attempt, r.status) for r in trader] == [(1, "error"), (1, "ok")]
    assert trader[0].call_id != trader[1].call_id


def stale_batch(db: Engine, tickers: list[str], age_s: float) -> int:
    batch_id = store.create_batch(db, kind="nightly", as_of=DEMO_AS_OF, tickers=tickers,
                                  samples=1, settings=BatchSettings(samples=1, strategy="adaptive"),
                                  server_facts=None)
    with db.begin() as conn:
        conn.execute(update(Batch).where(Batch.id == batch_id).values(
            heartbeat_at=datetime.now(UTC) - timedelta(seconds=age_s)))
    return batch_id


def test_run_continue_night_takes_up_tonights_dead_batch_and_runs_a_finished_one_no_more(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, demo_dir: Path) -> None:
    done, left = demo_tickers(2)
    # The timer's unit started again by hand after its process was killed.
    dead = dead_night(sqlite_engine, done, left)
    server = FakeServer(nodes=NODES, tickers=[done, left])
    serve_cli_from(monkeypatch, server, demo_dir)
    night = ["run", "--continue-night", "--as-of", str(DEMO_AS_OF), "--no-preflight"]
    result = CliRunner().invoke(cli, [*night, "--tickers", done])
    assert result.exit_code == 0, result.output
    assert f"resuming batch {dead} (nightly, crashed" in result.stderr
    with sqlite_engine.connect() as conn:
        batches = [tuple(b) for b in conn.execute(select(Batch.id, Batch.status))]
    assert batches == [(dead, "succeeded")]  # continued with its own tickers, no second batch
    assert {c.ticker for c in server.chats} == {left} and len(server.chats) == 17
    # Tonight's batch is finished now: the same command (the timer firing again) runs
    # nothing, as the daemon does; a plain `run` of the date starts a night of its own.
    result = CliRunner().invoke(cli, [*night, "--tickers", done])
    assert result.exit_code == 0, result.output
    assert "resuming" not in result.stderr
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Batch)).scalar() == 1
    assert len(server.chats) == 17
    again = [word for word in night if word != "--continue-night"]
    result = CliRunner().invoke(cli, [*again, "--tickers", done])
    assert result.exit_code == 0, result.output
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Batch)).scalar() == 2
    assert [c.ticker for c in server.chats[17:]] == [done] * 17


def test_run_continue_night_and_resume_exclude_each_other(sqlite_engine: Engine) -> None:
    result = run_cli("run", "--continue-night", "--resume")
    assert result.code == 2
    assert len(result.error_lines) == 1
    assert "--resume and --continue-night exclude each other" in result.error_lines[0]
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Batch)).scalar() == 0


def test_stale_running_batch_is_crashed_by_report_and_resumed_by_run(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, demo_dir: Path) -> None:
    tickers = demo_tickers(2)
    batch_id = stale_batch(sqlite_engine, tickers, age_s=3600)
    fresh = stale_batch(sqlite_engine, tickers, age_s=5)
    runner = CliRunner()
    result = runner.invoke(cli, ["report", str(batch_id)])
    assert result.exit_code == 0, result.output
    assert f"batch {batch_id} had no sign of life" in result.stderr
    with sqlite_engine.connect() as conn:
        status = dict(conn.execute(select(Batch.id, Batch.status)).all())
    assert status == {batch_id: "crashed", fresh: "running"}  # only the stale one

    server = FakeServer(nodes=NODES, tickers=tickers)
    serve_cli_from(monkeypatch, server, demo_dir)
    # While another process holds the nightly lock, the fresh batch is its: resuming it is
    # refused as already running (exit 4), nothing written.
    with nightly_lock(sqlite_engine):
        refused = runner.invoke(cli, ["run", "--resume", str(fresh), "--no-preflight"])
    assert isinstance(refused.exception, AlreadyRunningError), refused.output
    assert refused.exception.exit_code == 4
    assert str(refused.exception) == f"already running: batch {fresh}"
    # With the lock free, the fresh one's process is known to be gone: crashed, and being the
    # newest it is the one `run --resume` continues, at once (its heartbeat is still fresh).
    result = runner.invoke(cli, ["run", "--resume", "--no-preflight"])
    assert result.exit_code == 0, result.output
    assert f"resuming batch {fresh} (nightly, crashed" in result.stderr
    # Then the older one.
    result = runner.invoke(cli, ["run", "--resume", "--no-preflight"])
    assert result.exit_code == 0, result.output
    assert f"resuming batch {batch_id} (nightly, crashed" in result.stderr
    with sqlite_engine.connect() as conn:
        status = dict(conn.execute(select(Batch.id, Batch.status)).all())
        runs = set(conn.execute(select(TickerRun.status)
                                .where(TickerRun.batch_id.in_((batch_id, fresh)))).scalars())
    assert status == {batch_id: "succeeded", fresh: "succeeded"} and runs == {"succeeded"}
    assert len(server.served()) == 2 * 2 * 17


def test_a_rerun_with_a_fresh_heartbeat_is_already_running(sqlite_engine: Engine) -> None:
    rerun = store.create_batch(sqlite_engine, kind="rerun", as_of=DEMO_AS_OF, tickers=["AAA"],
                               samples=1, settings=BatchSettings(), server_facts=None)
    # Reruns take no lock: their heartbeat is what says a process still owns them.
    with pytest.raises(AlreadyRunningError, match=f"already running: batch {rerun} "):
        resume_recorded(load_settings(), sqlite_engine, rerun)


def test_mark_stale_leaves_fresh_and_finished_batches(sqlite_engine: Engine) -> None:
    old = stale_batch(sqlite_engine, ["AAA"], age_s=600)
    with sqlite_engine.begin() as conn:
        conn.execute(update(Batch).where(Batch.id == old).values(status="succeeded"))
        conn.execute(update(TickerRun).where(TickerRun.batch_id == old)
                     .values(status="succeeded"))
    stale = stale_batch(sqlite_engine, ["BBB"], age_s=600)
    assert mark_stale_crashed(sqlite_engine, 300) == [stale]
    assert mark_stale_crashed(sqlite_engine, 300) == []  # already marked
    with sqlite_engine.connect() as conn:
        row = conn.execute(select(Batch.finished_at, Batch.heartbeat_at)
                           .where(Batch.id == stale)).one()
    assert row.finished_at == row.heartbeat_at  # its last sign of life, not the marking
    with pytest.raises(InputError, match="no tickers left"):
        find_resumable(sqlite_engine, old, stale_s=300)


async def test_a_short_outage_pauses_the_batch_and_every_ticker_succeeds(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    tickers = demo_tickers(3)
    server: FakeServer

    def die_once(chat: ChatRequest) -> Reply | None:
        if len(server.chats) == 12:
            server.crash()  # from here on, nothing answers for a second
            asyncio.get_running_loop().call_later(1.0, server.revive)
        return None

    server = FakeServer(die_once, nodes=NODES, tickers=tickers)
    runner = engine_for(sqlite_engine, demo_dir, server, max_attempts=2)
    outcome = await runner.run(BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert outcome.status == "succeeded" and sorted(outcome.succeeded) == sorted(tickers)
    assert server.refused > 0  # the outage was real
    assert Counter(ok_nodes(server)) == Counter((t, n, 0) for t in tickers for n in NODES)
    with sqlite_engine.connect() as conn:
        settings = conn.execute(select(Batch.settings)).scalar_one()
        failed_calls = conn.execute(select(func.count()).select_from(LLMCall)
                                    .where(LLMCall.status == "error")).scalar_one()
    outage = settings["server_outages"]
    assert len(outage) == 1 and outage[0]["seconds"] >= 0.5
    # With 2 attempts per call a call may fail once: it waited for the server, not retried
    # into it. At most the calls that were out when it died failed (limit 4).
    assert failed_calls <= 4


async def test_an_outage_past_its_budget_interrupts_the_batch_for_a_resume(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    tickers = demo_tickers(2)
    server: FakeServer

    def die(chat: ChatRequest) -> Reply | None:
        if len(server.chats) == 6:
            server.crash()
        return None

    server = FakeServer(die, nodes=NODES, tickers=tickers)
    runner = engine_for(sqlite_engine, demo_dir, server, outage_budget_s=0.5)
    outcome = await runner.run(BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert outcome.status == "interrupted"
    assert outcome.halt is not None and outcome.halt.exit_code == 5
    assert "did not answer" in outcome.halt.message and not outcome.failed
    with sqlite_engine.connect() as conn:
        runs = set(conn.execute(select(TickerRun.status)).scalars())
    assert runs == {"interrupted"}  # none failed: all of them resume
    server2 = FakeServer(nodes=NODES, tickers=tickers)
    resumed = await engine_for(sqlite_engine, demo_dir, server2).run(
        find_resumable(sqlite_engine, None, stale_s=120))
    assert resumed.status == "succeeded"
    assert not set(ok_nodes(server)) & set(ok_nodes(server2))


def test_sigterm_lets_the_call_in_flight_finish_then_stops_as_interrupted(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    from app.batch.signals import BatchInterrupted, run_batch

    tickers = demo_tickers(2)
    # The call is at the server when the signal comes.
    script = sigterm_at_first("bull_r1", lambda chat: Reply(default_reply(chat), delay_s=0.5))
    server = FakeServer(script, nodes=NODES, tickers=tickers)
    runner = engine_for(sqlite_engine, demo_dir, server)
    outcome = run_batch(runner.run(BatchPlan("nightly", DEMO_AS_OF, tickers)), runner.halt,
                        grace_s=10)
    assert outcome.status == "interrupted" and outcome.halt is not None
    assert outcome.halt.exit_code == BatchInterrupted.exit_code
    assert "SIGTERM" in outcome.halt.message
    bull = [c for c in server.served() if c.node == "bull_r1"]
    assert bull and bull[0].served is not None  # answered within the grace, not cut
    with sqlite_engine.connect() as conn:
        rows = conn.execute(select(LLMCall.node, LLMCall.status)
                            .where(LLMCall.node == "bull_r1")).all()
        runs = set(conn.execute(select(TickerRun.status)).scalars())
    assert ("bull_r1", "ok") in [tuple(r) for r in rows]
    assert runs <= {"interrupted", "succeeded"} and "interrupted" in runs
    server2 = FakeServer(nodes=NODES, tickers=tickers)
    resumed = asyncio.run(engine_for(sqlite_engine, demo_dir, server2).run(
        find_resumable(sqlite_engine, None, stale_s=120)))
    assert resumed.status == "succeeded"
    assert not set(ok_nodes(server)) & set(ok_nodes(server2))
    assert (bull[0].ticker, "bull_r1", 0) not in ok_nodes(server2)


def test_a_batch_cancelled_outright_records_the_resume_that_continues_it(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    import os
    import signal

    from app.batch.signals import BatchInterrupted, run_batch

    tickers = demo_tickers(2)

    def script(chat: ChatRequest) -> Reply | None:
        if chat.node == "bull_r1":
            os.kill(os.getpid(), signal.SIGTERM)  # without a halt: cancelled at once
            return Reply(default_reply(chat), delay_s=0.5)
        return None

    runner = engine_for(sqlite_engine, demo_dir, FakeServer(script, nodes=NODES,
                                                            tickers=tickers))
    with pytest.raises(BatchInterrupted):
        run_batch(runner.run(BatchPlan("nightly", DEMO_AS_OF, tickers)))
    with sqlite_engine.connect() as conn:
        status, error = conn.execute(select(Batch.status, Batch.error)).one()
    # What the digest, `batches` and the pages show names the command, as every stop does.
    assert (status, error) == ("interrupted", "interrupted by the operator; resume with "
                                              "`nightdesk run --resume 1`")


def test_a_ticker_a_finished_batch_left_unrun_is_taken_up_by_the_resume(
        sqlite_engine: Engine) -> None:
    """finish_batch fails the tickers a batch ended without running; that is no verdict on
    them, so the resume's one rule takes them up."""
    from app.batch import store
    from app.morning.summary import tickers_left

    batch = store.create_batch(sqlite_engine, kind="nightly", as_of=DEMO_AS_OF,
                               tickers=["AAA", "BBB"], samples=1, settings=BatchSettings(),
                               server_facts=None)
    store.ticker_started(sqlite_engine, batch, "AAA")
    store.finish_batch(sqlite_engine, batch, "partial")
    with sqlite_engine.connect() as conn:
        rows = conn.execute(select(TickerRun.ticker, TickerRun.status, TickerRun.failure_class)
                            .where(TickerRun.batch_id == batch)
                            .order_by(TickerRun.id)).all()
        assert rows == [("AAA", "failed", "infrastructure"), ("BBB", "failed", "infrastructure")]
        assert tickers_left(conn, batch) == ["AAA", "BBB"]


# --- a halt while a database call hangs ------------------------------------------------------
# A thread cannot be killed: the halt waits ``patience`` for it, then leaves it running and
# ends; the row it was writing either lands late (then the resume does not run the ticker
# again) or never does (then the resume runs it): one decision a ticker either way.


def hung(monkeypatch: pytest.MonkeyPatch, name: str, ticker: str | None,
         lands: bool) -> Any:
    """Make ``store.<name>`` block (for ``ticker``'s row, or every call) until released;
    released, it writes (``lands``) or fails as a connection the process's end cut would."""
    real, call = getattr(store, name), Blocking()

    def blocking(engine: Engine, batch_id: int, *args: Any, **kwargs: Any) -> Any:
        if (ticker is None or args[0] == ticker) and not call.started.is_set():
            call()
            if not lands:
                raise ConnectionError("the process ended under the write")
        return real(engine, batch_id, *args, **kwargs)

    monkeypatch.setattr(store, name, blocking)
    return call


async def halted_while_hung(runner: BatchEngine, call: Any, tickers: list[str]
                            ) -> tuple[Any, float, list[dict[str, Any]]]:
    """Run the batch, halt it once the call hangs; return its end, how long the halt took
    and the log."""
    with capture_logs() as logs, patience(0.3):
        run = asyncio.create_task(runner.run(BatchPlan("nightly", DEMO_AS_OF, tickers)))
        await call.entered()
        asked = time.monotonic()
        runner.halt.request(HaltReason("interrupted", "stopped by SIGTERM", 130, 0.1))
        try:
            outcome: Any = await asyncio.wait_for(asyncio.shield(run), 5)
        except Exception as error:
            outcome = error
        took = time.monotonic() - asked
        call.release.set()  # a fix that waited for the thread would end only here
        await run if not run.done() else None
    return outcome, took, logs


@pytest.mark.parametrize("lands", [True, False], ids=["lands-late", "never-lands"])
async def test_a_halt_leaves_a_hung_ticker_write_behind_and_the_resume_counts_it_once(
        lands: bool, sqlite_engine: Engine, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    tickers = demo_tickers(2)
    call = hung(monkeypatch, "ticker_finished", tickers[0], lands)
    runner = engine_for(sqlite_engine, demo_dir, FakeServer(nodes=NODES, tickers=tickers))
    outcome, took, logs = await halted_while_hung(runner, call, tickers)
    assert took < 2, f"the halt waited {took:.1f} s for a hung write"
    assert outcome.status == "interrupted"
    assert any(e["event"].startswith("a blocking call outlived") and
               e["call"].endswith("blocking") for e in logs)
    assert await asyncio.to_thread(call.ended.wait, 5)
    # As its stored reason advises: `run --resume N` (a late write left nothing to run).
    assert outcome.halt.message.endswith(f"resume with `nightdesk run --resume {1}`")
    resumed = await engine_for(sqlite_engine, demo_dir, FakeServer(
        nodes=NODES, tickers=tickers)).run(find_resumable(sqlite_engine, 1, stale_s=120))
    assert resumed.status == "succeeded" and sorted(resumed.succeeded) == sorted(tickers)
    with sqlite_engine.connect() as conn:
        decisions = Counter(conn.execute(select(Decision.ticker)).scalars())
        batch = conn.execute(select(Batch.tickers_succeeded, Batch.tickers_failed)).one()
    assert decisions == Counter(tickers) and tuple(batch) == (2, 0)


async def test_a_halt_whose_end_write_hangs_ends_and_leaves_the_batch_to_resume(
        sqlite_engine: Engine, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tickers = demo_tickers(1)
    call = hung(monkeypatch, "finish_batch", None, lands=False)
    runner = engine_for(sqlite_engine, demo_dir, FakeServer(nodes=NODES, tickers=tickers))

    # Halted before its first ticker: the end write is what hangs.
    runner.halt.request(HaltReason("interrupted", "stopped by SIGTERM", 130, 0.0))
    outcome, took, _ = await halted_while_hung(runner, call, tickers)
    assert took < 2, f"the halt waited {took:.1f} s for a hung end write"
    assert isinstance(outcome, StorageOutage)
    assert "did not answer within 0.3 s; resume with `nightdesk run --resume 1`" in str(outcome)
    assert mark_stale_crashed(sqlite_engine, stale_s=0) == [1]
    resumed = await engine_for(sqlite_engine, demo_dir, FakeServer(
        nodes=NODES, tickers=tickers)).run(find_resumable(sqlite_engine, 1, stale_s=120))
    assert resumed.status == "succeeded"
