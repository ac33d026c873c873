"""The live progress: the servers' own output rate, and no ETA before there is a basis."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from rich.console import Console

from app.batch.progress import BatchProgress
from app.night import eta_s
from app.traffic.strategy import Strategy

T0 = datetime(2026, 12, 3, 1, 0, tzinfo=UTC)


def reading(generated: float, at_s: float) -> SimpleNamespace:
    return SimpleNamespace(generation_tokens_total=generated, taken_at=T0 + timedelta(seconds=at_s),
                           running=200.0, waiting=0.0, kv_cache_usage=0.4)


def progress(*endpoints: SimpleNamespace) -> BatchProgress:
    scheduler = SimpleNamespace(gate=SimpleNamespace(limit=4), strategy=Strategy.parse("adaptive"))
    llm = SimpleNamespace(stats=SimpleNamespace(calls=0, failed=0, completion_tokens=0,
                                                first_start=None),
                          endpoints=list(endpoints))
    return BatchProgress(1, 2, llm, scheduler, console=Console(file=io.StringIO()))


def endpoint(name: str, latest: SimpleNamespace | None) -> SimpleNamespace:
    return SimpleNamespace(name=name, gauges=SimpleNamespace(latest=latest))


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


def test_no_eta_before_a_twentieth_of_the_calls_are_answered() -> None:
    # 1,700 calls expected: 30 s in, 2 answered would say 7 hours; nothing is said.
    assert eta_s(30, 0, 100, 2, 1_700) is None
    assert eta_s(30, 0, 100, 84, 1_700) is None
    assert eta_s(85, 0, 100, 85, 1_700) == 1_615.0  # from 5% on, by calls
    # Without an expected count, by tickers once one is done.
    assert eta_s(100, 0, 4, 40, None) is None
    assert eta_s(100, 1, 4, 40, None) == 300.0
