"""Check the usage tracker end to end: one row per HTTP attempt, exact tokens, no lost writes."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

import app.usage
from agents.chat import CallTag
from agents.fitting import fixed
from app.config import load_settings
from app.db.models import LLMCall, LLMRequest
from app.errors import LLMError
from app.llm import TrackedLLM
from app.usage import UsageRecorder
from tests.fakevllm import BASE_URL, FakeServer, Reply
from tests.unit.support.call_rows import new_batch
from tests.unit.support.endings import ENDINGS, End, run_to_its_end
from tests.unit.support.llm_calls import (
    EXPECTED_ROW,
    check_drive,
    drive_concurrent_calls,
    flaky_insert,
    outcome_of,
    scripted,
)


@pytest.mark.slow
async def test_200_concurrent_calls_write_one_row_per_attempt(sqlite_engine: Engine) -> None:
    drive = await drive_concurrent_calls(sqlite_engine)
    check_drive(drive)
    # Sanity on the script itself: every failure kind really happened.
    outcomes = Counter(outcome_of(c.key, c.attempt) for c in drive.fake.chats)
    assert set(outcomes) == set(EXPECTED_ROW)


async def test_one_request_body_is_stored_per_call(sqlite_engine: Engine) -> None:
    drive = await drive_concurrent_calls(sqlite_engine, n=40)
    check_drive(drive, n=40)
    with sqlite_engine.connect() as conn:
        stored = conn.execute(select(func.count()).select_from(LLMRequest)
                              .where(LLMRequest.batch_id == drive.batch_id)).scalar()
    assert stored == 40


@pytest.mark.parametrize("after_write", [False, True], ids=["write-lost", "write-kept"])
async def test_a_failed_write_is_retried_without_loss_or_duplicates(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch, after_write: bool,
) -> None:
    insert, count = flaky_insert(2, after_write=after_write)
    monkeypatch.setattr(app.usage, "insert_ignoring_duplicates", insert)
    batch_id = new_batch(sqlite_engine)
    fake = FakeServer(scripted)
    settings = load_settings(llm_base_url=BASE_URL, check_context_length=False,
                             retry_backoff_s=0, record_requests=False)
    recorder = UsageRecorder(sqlite_engine, flush_interval_s=0.01)
    async with fake.client() as http, recorder:
        llm = TrackedLLM(settings, recorder, http_client=http)
        await asyncio.gather(*(
            llm.chat(CallTag(batch_id, "AAPL", f"n{i}"),
                     fixed([{"role": "user", "content": f"q{i}"}]), max_tokens=8)
            for i in range(30)))
    assert recorder.write_failures == 2
    assert count["calls"] >= 3
    with sqlite_engine.connect() as conn:
        rows = conn.execute(select(LLMCall.node, LLMCall.attempt)
                            .where(LLMCall.batch_id == batch_id)).all()
    assert len(rows) == len(fake.chats) == 30
    assert len(set(rows)) == 30


async def test_rows_recorded_before_its_context_are_written_at_its_exit(
        sqlite_engine: Engine) -> None:
    batch_id = new_batch(sqlite_engine)
    recorder = UsageRecorder(sqlite_engine)
    now = datetime.now(UTC)
    recorder.record_call({"batch_id": batch_id, "ticker": "X", "node": "n", "sample": 0,
                          "attempt": 1, "model": "m", "status": "ok", "started_at": now,
                          "ended_at": now, "latency_s": 0.0})
    async with recorder:
        pass
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(LLMCall)).scalar() == 1


def a_call_row(batch_id: int, call_id: str = "c0") -> dict[str, object]:
    now = datetime.now(UTC)
    return {"batch_id": batch_id, "ticker": "X", "node": "n", "sample": 0, "attempt": 1,
            "call_id": call_id, "model": "m", "status": "ok", "started_at": now,
            "ended_at": now, "latency_s": 0.0}


@pytest.mark.parametrize("ending", ENDINGS)
async def test_the_writer_ends_with_its_context_every_row_stored(
        sqlite_engine: Engine, ending: str) -> None:
    batch_id = new_batch(sqlite_engine)
    recorder = UsageRecorder(sqlite_engine, flush_interval_s=60)  # only its exit writes

    async def batch(end: End) -> None:
        before = asyncio.all_tasks()
        async with recorder:
            assert asyncio.all_tasks() - before == {recorder._writer}
            recorder.record_call(a_call_row(batch_id))
            await end()

    assert not await run_to_its_end(ending, batch)
    with sqlite_engine.connect() as conn:  # written at the exit, however the batch ended
        assert conn.execute(select(func.count()).select_from(LLMCall)).scalar() == 1


async def test_a_writer_that_fails_outright_stops_the_body_with_its_error(
        sqlite_engine: Engine, tmp_path: Path) -> None:
    # Not a database error (those stop it through ``stopped``): the spool it has just
    # written out cannot be removed. Before, the writer's task died unseen and a drain
    # waited for it for ever; in the context's group its error ends the body and is raised.
    batch_id = new_batch(sqlite_engine)
    spool = tmp_path / "usage.jsonl"
    app.usage.write_spool(spool, {"calls": [a_call_row(batch_id)], "requests": []})
    gave_up: list[str] = []
    with pytest.raises(IsADirectoryError):
        async with UsageRecorder(sqlite_engine, flush_interval_s=0.01, spool=spool) as recorder:
            spool.unlink()
            spool.mkdir()  # where the spool was, once its rows are stored: a folder
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(recorder.drain(), timeout=5)
            gave_up.append("the drain waited 5 s: the writer's failure went unseen")
    assert gave_up == []  # the writer's failure stopped the body
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(LLMCall)).scalar() == 1


async def test_errors_raised_by_chat_are_llm_errors(sqlite_engine: Engine) -> None:
    batch_id = new_batch(sqlite_engine)
    fake = FakeServer(lambda chat: Reply(status=400, error="bad top_k"))
    settings = load_settings(llm_base_url=BASE_URL, check_context_length=False)
    async with fake.client() as http, UsageRecorder(sqlite_engine) as recorder:
        llm = TrackedLLM(settings, recorder, http_client=http)
        with pytest.raises(LLMError) as info:
            await llm.chat(CallTag(batch_id, "X", "n"), fixed([{"role": "user", "content": "q"}]),
                           max_tokens=8)
    assert info.value.http_status == 400 and not info.value.retryable


async def test_the_tracker_bench_records_every_call_the_fake_answered(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.bench import tracker

    servers: list[FakeServer] = []

    def watched() -> FakeServer:
        servers.append(real())
        return servers[-1]

    real = tracker.bench_server
    monkeypatch.setattr(tracker, "bench_server", watched)
    settings = tracker.bench_settings()
    wall, _ = await tracker.run_baseline(settings, calls=20, concurrency=8)
    run = await tracker.run_tracked(settings, sqlite_engine, calls=20, concurrency=8)
    baseline, tracked = servers
    assert wall > 0 and len(baseline.served()) == 20 and len(tracked.served()) == 21
    # Neither arm ever had more than its concurrency in flight at the server.
    assert baseline.max_in_flight <= 8 and tracked.max_in_flight <= 8
    with sqlite_engine.connect() as conn:
        rows = conn.execute(select(LLMCall.prompt_tokens, LLMCall.completion_tokens,
                                   LLMCall.cached_tokens)).all()
    assert (run.rows, run.bodies) == (20, 20)  # the warm-up call is the one row beyond
    assert len(rows) == 21 and set(rows) == {(900, 8, 512)}  # what the fake reported


@pytest.mark.slow
def test_the_tracker_bench_reports_the_median_added_time_per_call() -> None:
    # A smoke run of the tracker bench (tests/bench/tracker.py) on SQLite: figures are not
    # judged (not a timed test); the added time must be the arithmetic the docstring states,
    # redone here.
    from tests.bench.tracker import run_tracker_bench

    result = run_tracker_bench(calls=20, concurrency=8, database="sqlite",
                               pg_url="unused", repeats=2)
    assert set(result.arms) == {"baseline", "sqlite"}
    base, sqlite = result.arms["baseline"], result.arms["sqlite"]
    assert sqlite.rows_ok and len(sqlite.wall_s) == len(base.wall_s) == 2
    # Median of two per-round differences is their mean; ms per call of 20 calls.
    diffs = [t - b for t, b in zip(sqlite.wall_s, base.wall_s, strict=True)]
    assert sqlite.added_ms_per_call == pytest.approx(sum(diffs) / 2 / 20 * 1000)
    assert set(result.to_json()) >= {"calls", "concurrency", "machine", "date", "arms"}
