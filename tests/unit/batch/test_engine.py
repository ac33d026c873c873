"""Run whole batches on the demo snapshot against the fake server, through the real engine."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.exc import DataError
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from agents.data.demo import DEMO_AS_OF, demo_tickers
from agents.data.snapshot import SnapshotProvider
from agents.graph import node_names
from app.batch.engine import BatchEngine, BatchPlan
from app.cli import app as cli
from app.config import load_settings
from app.db.engine import get_engine
from app.db.models import Batch, Decision, LLMCall, LLMRequest, ProgressReading, TickerRun
from app.llm import TrackedLLM
from app.morning.ranking import ranking
from app.morning.serverview import server_view
from app.recorder.record import Recorder
from app.runs.checkpoints import Checkpoints
from tests.fakevllm import ChatRequest, FakeServer, Reply, default_reply
from tests.unit.support.sigterm import sigterm_at_first

pytestmark = pytest.mark.demo_tickers(4)  # two tests run four


def make_engine(sqlite_engine: Engine, demo_dir: Path, server: FakeServer, **overrides: object
                ) -> BatchEngine:
    settings = load_settings(check_context_length=False, retry_backoff_s=0, **overrides)
    # Sampling on: the engine reads the fake's /metrics through the same client.
    return BatchEngine(settings, sqlite_engine, http_client=server.client(),
                       provider=SnapshotProvider(demo_dir),
                       checkpoints=Checkpoints(settings.store.database_url, sqlite_engine))


async def test_batch_stores_decisions_calls_and_requests(sqlite_engine: Engine,
                                                         demo_dir: Path) -> None:
    tickers = demo_tickers(4)
    server = FakeServer(nodes=node_names(load_settings().pipeline()), tickers=tickers,
                        samples=range(2))
    outcome = await make_engine(sqlite_engine, demo_dir, server).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers, samples=2))
    assert outcome.status == "succeeded" and sorted(outcome.succeeded) == sorted(tickers)
    with sqlite_engine.connect() as conn:
        calls = conn.execute(select(func.count()).select_from(LLMCall)).scalar()
        bodies = conn.execute(select(func.count()).select_from(LLMRequest)).scalar()
        decisions = conn.execute(select(func.count()).select_from(Decision)).scalar()
        statuses = set(conn.execute(select(TickerRun.status)).scalars())
        batch = conn.execute(select(Batch.status, Batch.tickers_succeeded, Batch.settings)).one()
    assert calls == bodies == len(server.chats) == 4 * 2 * 17
    assert decisions == 8
    assert statuses == {"succeeded"}
    assert batch.status == "succeeded" and batch.tickers_succeeded == 4
    assert batch.settings["demo_data"] is True and batch.settings["samples"] == 2
    assert batch.settings["schema_version"] == 2  # written by app/db/batchsettings.py's model
    _, rows = ranking(sqlite_engine)
    assert [r.rank for r in rows] == [1, 2, 3, 4]
    assert all(r.samples == 2 for r in rows)
    # The server's own counters over the batch, from the stored /metrics readings, hold
    # exactly the tokens of our rows, as the integration test checks on the real server.
    with sqlite_engine.connect() as conn:
        prompt, completion = conn.execute(select(func.sum(LLMCall.prompt_tokens),
                                                 func.sum(LLMCall.completion_tokens))).one()
    view = server_view(sqlite_engine, outcome.batch_id)
    assert view.samples >= 2
    assert (view.prompt_tokens, view.generation_tokens) == (prompt, completion)
    assert prompt == server.usage_totals()["prompt_tokens"]


async def test_invalid_decision_fails_its_ticker_loudly_others_finish(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    tickers = demo_tickers(4)
    bad = tickers[1]

    def script(chat: ChatRequest) -> Reply | None:
        if chat.structured and chat.ticker == bad:
            return Reply('{"rating": "Maybe", "score": 3}')  # violates the schema
        return None

    server = FakeServer(script, nodes=node_names(load_settings().pipeline()), tickers=tickers)
    outcome = await make_engine(sqlite_engine, demo_dir, server, decision_attempts=2).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert outcome.status == "partial"  # never "succeeded" while a ticker is missing
    assert set(outcome.failed) == {bad} and len(outcome.succeeded) == 3
    assert "decision" in outcome.failed[bad].lower()
    with sqlite_engine.connect() as conn:
        run = conn.execute(select(TickerRun.status, TickerRun.error)
                           .where(TickerRun.ticker == bad)).one()
        pm_attempts = conn.execute(select(LLMCall.call_id, LLMCall.attempt).where(
            LLMCall.ticker == bad, LLMCall.node == "portfolio_manager")).all()
        bad_decisions = conn.execute(select(func.count()).select_from(Decision)
                                     .where(Decision.ticker == bad)).scalar()
    assert run.status == "failed" and run.error
    # Asked twice: two calls, each answered at its first attempt.
    assert [a for _, a in pm_attempts] == [1, 1] and len({c for c, _ in pm_attempts}) == 2
    assert bad_decisions == 0  # never a silent Hold
    _, rows = ranking(sqlite_engine)
    assert rows[-1].ticker == bad and rows[-1].rank is None and rows[-1].status == "failed"


async def test_missing_data_fails_one_ticker_naming_the_file(sqlite_engine: Engine,
                                                             demo_dir: Path) -> None:
    tickers = demo_tickers(2)
    (demo_dir / DEMO_AS_OF.isoformat() / tickers[0] / "prices.csv").unlink()
    server = FakeServer(nodes=node_names(load_settings().pipeline()), tickers=tickers)
    outcome = await make_engine(sqlite_engine, demo_dir, server).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert list(outcome.failed) == [tickers[0]]
    assert "prices.csv" in outcome.failed[tickers[0]]
    assert outcome.succeeded == [tickers[1]]


async def test_a_running_batch_stores_its_progress_readings(
        sqlite_engine: Engine, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.recorder.progress.LOG_EVERY_S", 0.01)  # a reading every 10 ms
    tickers = demo_tickers(2)
    server = FakeServer(nodes=node_names(load_settings().pipeline()), tickers=tickers)
    outcome = await make_engine(sqlite_engine, demo_dir, server).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers), recording=Recorder(sqlite_engine))
    with Session(sqlite_engine) as s:
        readings = s.scalars(select(ProgressReading)
                            .where(ProgressReading.batch_id == outcome.batch_id)).all()
    assert readings, "no reading stored"
    assert all(r.calls_expected == 2 * 17 for r in readings)
    assert [r.calls_done for r in readings] == sorted(r.calls_done for r in readings)


def test_cli_run_then_ranking_json(monkeypatch: pytest.MonkeyPatch, demo_dir: Path,
                                   sqlite_url: str) -> None:
    tickers = demo_tickers(3)
    server = FakeServer(nodes=node_names(load_settings().pipeline()), tickers=tickers)
    original = BatchEngine.__init__

    def with_fake(self: BatchEngine, *args: object, **kwargs: object) -> None:
        kwargs.update(http_client=server.client())
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(BatchEngine, "__init__", with_fake)
    monkeypatch.setenv("NIGHTDESK_CHECK_CONTEXT_LENGTH", "false")
    runner = CliRunner()
    result = runner.invoke(cli, ["run", "--tickers", ",".join(tickers), "--no-preflight"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["ranking", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    rows = data["rows"]
    assert {r["ticker"] for r in rows} == set(tickers)
    assert set(rows[0]) >= {"rank", "ticker", "rating", "score", "confidence", "summary",
                            "batch_id"}
    assert data["batch"]["demo"] is True


async def test_replay_keeps_calls_prompts_and_order(sqlite_engine: Engine, demo_dir: Path) -> None:
    from app.morning.accounting import compare_arm
    from app.runs.replay import replay_batch

    tickers = demo_tickers(2)
    settings = load_settings(check_context_length=False, retry_backoff_s=0)
    server = FakeServer(nodes=node_names(settings.pipeline()), tickers=tickers)
    source = await make_engine(sqlite_engine, demo_dir, server).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers))
    original = list(server.chats)
    replay_server = FakeServer(nodes=node_names(settings.pipeline()), tickers=tickers)
    outcome = await replay_batch(settings, sqlite_engine, source.batch_id, label="same",
                                 http_client=replay_server.client())
    assert outcome.status == "succeeded"
    replayed = replay_server.chats
    assert len(replayed) == len(original) == 2 * 17
    key = lambda c: (c.ticker, c.node)  # noqa: E731
    assert {key(c): c.messages for c in replayed} == {key(c): c.messages for c in original}
    with sqlite_engine.connect() as conn:
        def prompts(batch_id: int) -> dict[tuple[str, str], int]:
            return {(t, n): p for t, n, p in conn.execute(
                select(LLMCall.ticker, LLMCall.node, LLMCall.prompt_tokens)
                .where(LLMCall.batch_id == batch_id))}
        assert prompts(outcome.batch_id) == prompts(source.batch_id)
        kind, source_id = conn.execute(select(Batch.kind, Batch.source_batch_id)
                                       .where(Batch.id == outcome.batch_id)).one()
    assert (kind, source_id) == ("replay", source.batch_id)
    # Each ticker's order is the graph's: every request came after the ones it followed.
    for ticker in tickers:
        order = [c.node for c in replayed if c.ticker == ticker]
        assert order[-1] == "portfolio_manager" and set(order[:4]) == {
            "market", "sentiment", "news", "fundamentals"}
        assert order.index("bull_r1") < order.index("bear_r1") < order.index("trader")
    # Free-text requests ask for exactly what they produced the first time.
    first = {key(c): c for c in original}
    for c in replayed:
        if not c.structured:
            assert c.max_tokens == first[key(c)].served.completion_tokens  # type: ignore[union-attr]
            assert c.body["ignore_eos"] is True
    arms = [compare_arm(sqlite_engine, source.batch_id),
            compare_arm(sqlite_engine, outcome.batch_id)]
    assert arms[0].calls == arms[1].calls == 34


async def test_newer_rerun_replaces_its_ticker_in_the_ranking(sqlite_engine: Engine,
                                                              demo_dir: Path) -> None:
    tickers = demo_tickers(3)
    settings = load_settings()
    night = FakeServer(nodes=node_names(settings.pipeline()), tickers=tickers)
    nightly = await make_engine(sqlite_engine, demo_dir, night).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers))
    sell = ('{"rating": "Sell", "score": -0.9, "confidence": 0.8, '
            '"summary": "Rerun: the trend broke."}')
    again = FakeServer(lambda c: sell if c.structured else None,
                       nodes=node_names(settings.pipeline()), tickers=tickers)
    rerun = await make_engine(sqlite_engine, demo_dir, again).run(
        BatchPlan("rerun", DEMO_AS_OF, [tickers[0]]))
    chosen, rows = ranking(sqlite_engine)
    assert chosen.id == nightly.batch_id  # the ranking is still the nightly batch's
    last = rows[-1]
    assert (last.ticker, last.rating, last.score, last.batch_id) == (
        tickers[0], "Sell", -0.9, rerun.batch_id)
    assert all(r.batch_id == nightly.batch_id for r in rows[:-1])


async def test_heaviest_recorded_ticker_starts_first_with_its_priority(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    tickers = demo_tickers(3)
    settings = load_settings(priority_scheduling=True)
    first = FakeServer(nodes=node_names(settings.pipeline()), tickers=tickers)
    await make_engine(sqlite_engine, demo_dir, first, priority_scheduling=True).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers))
    # Make the last ticker the heaviest on record: it must start first next night.
    with sqlite_engine.begin() as conn:
        conn.execute(LLMCall.__table__.update().where(LLMCall.ticker == tickers[2])
                     .values(completion_tokens=10_000))
    second = FakeServer(nodes=node_names(settings.pipeline()), tickers=tickers)
    # Room for one request: the tickers start one at a time, so the first to ask is the
    # first started (with room for all, all start in one pass and the loop picks who asks).
    await make_engine(sqlite_engine, demo_dir, second, priority_scheduling=True,
                      max_concurrency=1).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers, strategy="adaptive:tail=off"))
    assert second.chats[0].ticker == tickers[2]
    priority = {c.ticker: c.body.get("priority") for c in second.chats}
    assert priority[tickers[2]] == 0  # vLLM serves lower values first: the senior ticker
    assert sorted(priority.values()) == [0, 1, 2]
    # Three tickers of 17 calls over a limit of 4 is shorter than one ticker's chain, so
    # with the tail rule all are urgent at once and start in one pass (whose first request
    # reaches the server first is then the event loop's): the heaviest still goes first at
    # the server, by the priority it sends.
    with sqlite_engine.begin() as conn:
        conn.execute(LLMCall.__table__.update().where(LLMCall.ticker == tickers[2])
                     .values(completion_tokens=10_000))
    third = FakeServer(nodes=node_names(settings.pipeline()), tickers=tickers)
    await make_engine(sqlite_engine, demo_dir, third, priority_scheduling=True).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers))
    first = {}
    for c in third.chats:
        first.setdefault(c.ticker, c.body.get("priority"))
    assert first[tickers[2]] == min(first.values()) < 0


def test_sigterm_records_the_batch_as_interrupted_and_keeps_what_finished(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    from app.batch.signals import BatchInterrupted, run_batch

    tickers = demo_tickers(2)
    settings = load_settings()
    script = sigterm_at_first("bull_r1", lambda chat: Reply("late", delay_s=5))
    server = FakeServer(script, nodes=node_names(settings.pipeline()), tickers=tickers)
    engine = make_engine(sqlite_engine, demo_dir, server)
    with pytest.raises(BatchInterrupted):
        run_batch(engine.run(BatchPlan("nightly", DEMO_AS_OF, tickers)))
    with sqlite_engine.connect() as conn:
        status, error = conn.execute(select(Batch.status, Batch.error)).one()
        runs = set(conn.execute(select(TickerRun.status)).scalars())
        calls = conn.execute(select(func.count()).select_from(LLMCall)).scalar()
    assert status == "interrupted" and "interrupted" in (error or "")
    assert "running" not in runs and "queued" not in runs
    assert calls == len(server.chats)  # every request sent has its row, the cut one included


async def test_a_failed_sample_cancels_its_siblings_and_keeps_their_rows(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    tickers = demo_tickers(2)
    doomed = tickers[0]

    def script(chat: ChatRequest) -> Reply | None:
        if chat.ticker != doomed:
            return None
        if chat.sample == 1 and chat.node == "market":
            return Reply(status=400, error="bad request")  # not retryable: sample 1 fails
        # Sample 0 is slow: its calls are still at the server when sample 1 fails.
        return Reply(default_reply(chat), delay_s=30)

    server = FakeServer(script, nodes=node_names(load_settings().pipeline()), tickers=tickers,
                        samples=range(2))
    # fixed-2: no request limit, so both samples' analysts are at the server together.
    outcome = await make_engine(sqlite_engine, demo_dir, server).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers, samples=2, strategy="fixed-2"))
    # Nothing the batch started is still running or still at the server.
    assert server.in_flight == 0
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    assert list(outcome.failed) == [doomed] and outcome.succeeded == [tickers[1]]
    assert "400" in outcome.failed[doomed]
    with sqlite_engine.connect() as conn:
        rows = conn.execute(select(LLMCall.ticker, LLMCall.node, LLMCall.sample,
                                   LLMCall.error_class)).all()
    # Every request that reached the server has its row, the cancelled ones included.
    assert len(rows) == len(server.chats)
    slow = {(c.node, c.sample) for c in server.chats if c.ticker == doomed and c.sample == 0}
    assert slow  # the sibling sample really had calls out
    cancelled = {(r.node, r.sample) for r in rows if r.error_class == "cancelled"}
    assert slow <= cancelled


async def test_every_cleanup_step_runs_when_closing_the_recorder_fails(
        sqlite_engine: Engine, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.usage import UsageRecorder

    original = UsageRecorder.__aexit__

    async def failing_exit(self: UsageRecorder, *exc: object) -> None:
        await original(self, *exc)
        raise RuntimeError("disk full")

    monkeypatch.setattr(UsageRecorder, "__aexit__", failing_exit)
    tickers = demo_tickers(2)
    server = FakeServer(nodes=node_names(load_settings().pipeline()), tickers=tickers)
    runner = make_engine(sqlite_engine, demo_dir, server)
    closed: list[bool] = []
    original_aclose = TrackedLLM.aclose

    async def aclose(self: TrackedLLM) -> None:
        closed.append(True)
        await original_aclose(self)

    monkeypatch.setattr(TrackedLLM, "aclose", aclose)
    with pytest.raises(RuntimeError, match="disk full"):
        await runner.run(BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert closed == [True]  # the step after the failing one still ran
    with sqlite_engine.connect() as conn:
        batch = conn.execute(select(Batch.status, Batch.finished_at, Batch.error)).one()
    # finish_batch ran: the batch is not left "running", and it says what went wrong.
    assert batch.status == "succeeded" and batch.finished_at is not None
    assert "disk full" in batch.error and "usage recorder" in batch.error


def _cli_with_fake(monkeypatch: pytest.MonkeyPatch, server: FakeServer) -> CliRunner:
    original = BatchEngine.__init__

    def with_fake(self: BatchEngine, *args: object, **kwargs: object) -> None:
        kwargs.update(http_client=server.client(), sample_metrics=False)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(BatchEngine, "__init__", with_fake)
    monkeypatch.setenv("NIGHTDESK_CHECK_CONTEXT_LENGTH", "false")
    return CliRunner()


def test_a_night_with_a_failed_ticker_is_partial_exits_3_and_the_ranking_says_what_it_lacks(
        monkeypatch: pytest.MonkeyPatch, demo_dir: Path, sqlite_url: str) -> None:
    tickers = demo_tickers(3)
    bad = tickers[1]
    server = FakeServer(lambda c: Reply("not json") if c.structured and c.ticker == bad
                        else None, nodes=node_names(load_settings().pipeline()), tickers=tickers)
    runner = _cli_with_fake(monkeypatch, server)
    result = runner.invoke(cli, ["run", "--tickers", ",".join(tickers), "--no-preflight"])
    assert result.exit_code == 3, result.output  # partial: neither 0 nor a plain failure
    engine = get_engine(sqlite_url)
    with engine.connect() as conn:
        status = conn.execute(select(Batch.status)).scalar_one()
        reason = conn.execute(select(TickerRun.error).where(TickerRun.ticker == bad)).scalar_one()
    assert status == "partial"
    # The ranking of a partial night is still the night's ranking, and names its gap.
    table = runner.invoke(cli, ["ranking"])
    assert table.exit_code == 0, table.output
    missing = [line for line in table.output.splitlines() if line.startswith("missing:")]
    assert missing == [f"missing: {bad} ({reason})"]
    as_json = runner.invoke(cli, ["ranking", "--format", "json"])
    rows = json.loads(as_json.stdout)["rows"]  # stdout stays machine-readable
    assert {r["ticker"] for r in rows if r["rank"] is not None} == set(tickers) - {bad}
    assert f"missing: {bad}" in as_json.stderr


def test_a_night_where_every_ticker_failed_is_failed_and_exits_1(
        monkeypatch: pytest.MonkeyPatch, demo_dir: Path, sqlite_url: str) -> None:
    tickers = demo_tickers(2)
    server = FakeServer(lambda c: Reply("not json") if c.structured else None,
                        nodes=node_names(load_settings().pipeline()), tickers=tickers)
    result = _cli_with_fake(monkeypatch, server).invoke(
        cli, ["run", "--tickers", ",".join(tickers), "--no-preflight"])
    assert result.exit_code == 1, result.output
    with get_engine(sqlite_url).connect() as conn:
        status, error = conn.execute(select(Batch.status, Batch.error)).one()
        first = conn.execute(select(TickerRun.ticker, TickerRun.error)
                             .order_by(TickerRun.id)).first()
    assert status == "failed"
    # A failed batch says why, even when no single error stopped it.
    assert first is not None and first.error
    assert error == f"2 of 2 tickers failed; first {first.ticker}: {first.error}"


async def test_usage_rows_the_database_refuses_stop_the_batch_with_the_reason(
        sqlite_engine: Engine, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import app.usage
    from app.errors import UsageLost

    def refuse(engine: Engine, table: object, rows: list[dict[str, object]]) -> None:
        raise DataError("INSERT INTO llm_calls", {}, Exception("value too long"))

    monkeypatch.setattr(app.usage, "insert_ignoring_duplicates", refuse)
    tickers = demo_tickers(2)
    server = FakeServer(nodes=node_names(load_settings().pipeline()), tickers=tickers)
    with pytest.raises(UsageLost, match="value too long"):
        await make_engine(sqlite_engine, demo_dir, server).run(
            BatchPlan("nightly", DEMO_AS_OF, tickers))
    with sqlite_engine.connect() as conn:
        batch = conn.execute(select(Batch.status, Batch.error)).one()
        statuses = set(conn.execute(select(TickerRun.status)).scalars())
    # Failed, with the reason and how to go on; no ticker marked done without its rows.
    assert batch.status == "failed"
    assert "usage rows could not be stored" in batch.error and "--resume" in batch.error
    assert "succeeded" not in statuses


async def test_a_tickers_room_goes_to_the_next_before_its_row_is_written(
        sqlite_engine: Engine, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One ticker at a time: the second may start while the first's row is being written
    # (its job closes its client first), so a slow ticker-row write never holds admission.
    import threading

    from app.batch import store

    started: list[str] = []
    second_started, waited = threading.Event(), []
    ticker_started, ticker_finished = store.ticker_started, store.ticker_finished

    def starting(engine: Engine, batch_id: int, ticker: str) -> None:
        started.append(ticker)
        if len(started) == 2:
            second_started.set()
        ticker_started(engine, batch_id, ticker)

    def finishing(engine: Engine, batch_id: int, ticker: str, *args: object,
                  **kwargs: object) -> None:
        if ticker == started[0] and not waited:  # the first ticker's row, held until...
            waited.append(second_started.wait(10))  # ...the second has started
        ticker_finished(engine, batch_id, ticker, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "ticker_started", starting)
    monkeypatch.setattr(store, "ticker_finished", finishing)
    tickers = demo_tickers(2)
    server = FakeServer(nodes=node_names(load_settings().pipeline()), tickers=tickers)
    outcome = await make_engine(sqlite_engine, demo_dir, server).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers, strategy="sequential"))
    assert outcome.status == "succeeded" and sorted(outcome.succeeded) == sorted(tickers)
    assert waited == [True]
