"""The live progress: the servers' own output rate, and the ETA readings it takes and stores."""

from __future__ import annotations

import asyncio
import io
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
import structlog
from rich.console import Console
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from agents.nodes import ANALYSTS
from app.db.models import ProgressReading
from app.morning import eta
from app.morning.nightstatus import span
from app.recorder.progress import BatchProgress, eta_text
from tests.unit.support.eta_rows import NODES, NOW, batch, calls
from tests.unit.support.servers import Unread, read_servers
from tests.unit.support.threads import Blocking

T0 = datetime(2026, 12, 3, 1, 0, tzinfo=UTC)


def reading(generated: float, at_s: float) -> SimpleNamespace:
    return SimpleNamespace(generation_tokens_total=generated, taken_at=T0 + timedelta(seconds=at_s),
                           running=200.0, waiting=0.0, kv_cache_usage=0.4)


def progress(*endpoints: SimpleNamespace) -> BatchProgress:
    servers = read_servers(*(e.gauges for e in endpoints))
    return BatchProgress(1, 2, servers, console=Console(file=io.StringIO()))


def endpoint(name: str, latest: SimpleNamespace | None) -> SimpleNamespace:
    return SimpleNamespace(name=name, gauges=Unread(latest=latest, name=name))


def test_the_servers_generation_counter_gives_the_rate_while_no_call_has_finished() -> None:
    a, b = endpoint("a", reading(1_000, 0)), endpoint("b", None)
    shown = progress(a, b)
    assert shown.state().server_tok_s is None  # one reading: no span yet
    a.gauges.latest = reading(31_000, 10)
    b.gauges.latest = reading(500, 5)  # b's first reading: its own start
    state = shown.state()
    assert state.output_tok_s == 0.0  # no call has finished...
    assert state.server_tok_s == 3_000.0  # ...while the server generated 30,000 in 10 s
    b.gauges.latest = reading(10_500, 10)
    assert shown.state().server_tok_s == 4_000.0  # both servers' tokens over the span


def test_a_restarted_servers_counter_starts_its_rate_again() -> None:
    a = endpoint("a", reading(50_000, 0))
    shown = progress(a)
    shown.state()
    a.gauges.latest = reading(200, 20)  # the counter went back: a new server
    assert shown.state().server_tok_s is None
    a.gauges.latest = reading(2_200, 30)
    assert shown.state().server_tok_s == 200.0


def test_without_readings_the_progress_says_no_server_rate() -> None:
    assert progress().state().server_tok_s is None


def test_no_eta_is_shown_before_a_reading() -> None:
    state = progress().state()
    assert (state.eta_s, state.eta_low_s, state.eta_high_s) == (None, None, None)


async def test_each_reading_is_stored_and_shown_with_its_interval(sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "running"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(minutes=5))
    calls(sqlite_engine, b, "BBB", list(ANALYSTS), end=datetime.now(UTC))
    shown = progress()
    shown.batch_id = b
    await shown.take_reading(sqlite_engine)
    with Session(sqlite_engine) as s:
        stored = s.scalars(select(ProgressReading)).one()
    state = shown.state()
    assert stored.batch_id == b and stored.calls_done == 21 and stored.eta_s is not None
    assert state.eta_s == round(stored.eta_s)
    assert (state.eta_low_s, state.eta_high_s) == (round(stored.eta_low_s or 0),
                                                   round(stored.eta_high_s or 0))
    assert eta_text(state).startswith(span(stored.eta_s))


async def test_a_reading_the_database_refuses_is_logged_and_the_night_goes_on(
        sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "running"})
    with sqlite_engine.begin() as conn:
        conn.execute(text("DROP TABLE progress_readings"))
    shown = progress()
    shown.batch_id = b
    with structlog.testing.capture_logs() as logs:
        await shown.take_reading(sqlite_engine)
    assert shown.reading is None
    assert [e["event"] for e in logs] == ["progress reading not stored"]


async def test_an_estimate_that_fails_is_logged_and_the_night_goes_on(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # The readings' loop runs in the batch's group, so an error it lets out cancels the night;
    # the ETA is advice, and a fault in working it out must cost the night nothing.
    def broken(*_: object) -> None:
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr("app.recorder.progress.eta.reading", broken)
    shown = progress()
    shown.batch_id = batch(sqlite_engine, {"AAA": "running"})
    with structlog.testing.capture_logs() as logs:
        await shown.take_reading(sqlite_engine)
    assert shown.reading is None
    assert [(e["event"], e["error"]) for e in logs] == [
        ("progress reading not stored", "ZeroDivisionError: float division by zero")]


async def test_an_eta_reading_in_its_thread_has_ended_once_the_progress_is_left(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # A night disposes of its database after the progress: no reading may still be at it.
    call = Blocking()
    monkeypatch.setattr("app.recorder.progress.LOG_EVERY_S", 0.001)
    monkeypatch.setattr("app.recorder.progress.eta.reading", call)
    shown = BatchProgress(1, 2, read_servers(), console=Console(file=io.StringIO()),
                          engine=sqlite_engine)
    try:
        async with shown:
            await call.entered()  # the readings' loop is in its thread, blocked
            call.release_in(0.05)
        assert call.ended.is_set()  # left only once the reading had returned
        assert shown.reading is None  # cancelled: the reading was not recorded
    finally:
        call.release.set()


async def test_each_progress_line_shows_the_reading_taken_for_it(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each line shows the reading taken for it, never the one of the interval before beside
    # counters of now (docs/lab/2026-12-06-h100-bf16-fp8-pair.md).
    taken: list[float] = []

    def reading(_engine: Engine, _batch: int, at: datetime) -> eta.Reading:
        taken.append(1000.0 - len(taken))  # each reading says less than the one before
        return eta.Reading(at, calls_expected=10, calls_done=1, attempts=1, output_tokens=1,
                           tokens_left=1.0, rate_tok_s=None, rate_low_tok_s=None,
                           rate_high_tok_s=None, rate_source=None, chain_left=1, chain_s=None,
                           chain_low_s=None, chain_high_s=None, eta_s=taken[-1],
                           eta_low_s=taken[-1], eta_high_s=taken[-1])

    monkeypatch.setattr("app.recorder.progress.LOG_EVERY_S", 0.01)
    monkeypatch.setattr("app.recorder.progress.eta.reading", reading)
    monkeypatch.setattr("app.recorder.progress.eta.record", lambda *_: None)
    shown = BatchProgress(1, 2, read_servers(), console=Console(file=io.StringIO()),
                          engine=sqlite_engine)
    with structlog.testing.capture_logs() as logs:
        async with shown:
            while len(taken) < 4:
                await asyncio.sleep(0.01)
    lines = [e["eta_s"] for e in logs if e["event"] == "progress"]
    *ticks, last = lines  # the last: the line logged at the exit, which shows none
    assert len(ticks) >= 3
    assert ticks == [round(taken[i]) for i in range(len(ticks))]
    assert last is None


async def test_a_resumed_night_shorter_than_one_interval_shows_what_its_rows_know(
        sqlite_engine: Engine) -> None:
    # The first reading waited LOG_EVERY_S (15 s): a resumed night, whose earlier run's calls
    # price the calls left from its start, said "estimating…" to its end when it was shorter.
    now = datetime.now(UTC)
    night = batch(sqlite_engine, {"AAA": "running", "BBB": "queued"})
    calls(sqlite_engine, night, "AAA", NODES[:8], end=now - timedelta(seconds=1))
    known = eta.reading(sqlite_engine, night, now)
    assert known.eta_s is not None  # what the rows know at the start
    shown = BatchProgress(night, 2, read_servers(), console=Console(file=io.StringIO()),
                          engine=sqlite_engine)
    with structlog.testing.capture_logs() as logs:
        async with shown:
            for _ in range(200):  # a night of at most 2 s, far under the interval
                if shown.reading is not None:
                    break
                await asyncio.sleep(0.01)
    said = [(e["eta_s"], e["estimating"]) for e in logs
            if e["event"] == "progress" and not e["ended"]]  # the exit's line: the next test
    assert said and all(eta_s is not None and eta_s > 0 and estimating is None
                        for eta_s, estimating in said), said
    shown.ended = False  # as during the night
    assert eta_text(shown.state()) != "estimating… (first reading under way)"


async def test_the_line_at_the_exit_describes_the_end_not_the_last_reading(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its ETA was the newest reading's, up to LOG_EVERY_S old: a night that ended between
    # two readings said "ETA 40 s" beside counters that said every ticker was done.
    monkeypatch.setattr("app.recorder.progress.LOG_EVERY_S", 3600.0)  # one reading, at once
    now = datetime.now(UTC)
    night = batch(sqlite_engine, {"AAA": "running", "BBB": "queued"})
    calls(sqlite_engine, night, "AAA", NODES[:8], end=now - timedelta(seconds=1))
    shown = BatchProgress(night, 2, read_servers(), console=Console(file=io.StringIO()),
                          engine=sqlite_engine)
    with structlog.testing.capture_logs() as logs:
        async with shown:
            while shown.reading is None:
                await asyncio.sleep(0.01)
            assert shown.state().eta_s  # the reading's time left, while the tickers run
            shown.ticker_done(ok=True)
            shown.ticker_done(ok=True)
    *_, last = [e for e in logs if e["event"] == "progress"]
    assert (last["tickers_done"], last["tickers_total"], last["ended"]) == (2, 2, True)
    assert [last[key] for key in ("eta_s", "eta_low_s", "eta_high_s", "eta_level",
                                  "estimating")] == [None] * 5, last
    assert eta_text(shown.state()) == "none: the run ended"
