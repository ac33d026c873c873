"""A batch over time, from its own rows (app/morning/timeline.py), figured by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console
from sqlalchemy import Engine

from app.cli.report import timeline_table
from app.db.models import LLMCall, ServerSample
from app.morning.timeline import INTERVALS, WIDTHS_S, batch_timeline, width_for
from tests.unit.support.call_rows import new_batch

T0 = datetime(2025, 3, 4, 22, 0, 0, tzinfo=UTC)


def call(engine: Engine, batch: int, ticker: str, node: str, start_s: float, first_s: float | None,
         end_s: float, completion: int | None, status: str = "ok") -> None:
    """Insert one llm_calls row, its times as seconds after T0."""
    with engine.begin() as conn:
        conn.execute(LLMCall.__table__.insert().values(  # type: ignore[attr-defined]
            batch_id=batch, ticker=ticker, node=node, sample=0, attempt=1, model="m",
            prompt_tokens=100, completion_tokens=completion, status=status,
            started_at=T0 + timedelta(seconds=start_s),
            first_token_at=None if first_s is None else T0 + timedelta(seconds=first_s),
            ended_at=T0 + timedelta(seconds=end_s), latency_s=end_s - start_s))


def reading(engine: Engine, batch: int, at_s: float, running: float, kv: float,
            preemptions: float, endpoint: str | None = None) -> None:
    with engine.begin() as conn:
        conn.execute(ServerSample.__table__.insert().values(  # type: ignore[attr-defined]
            batch_id=batch, sampled_at=T0 + timedelta(seconds=at_s), running=running,
            waiting=0.0, kv_cache_usage=kv, preemptions_total=preemptions,
            prompt_tokens_total=0.0, generation_tokens_total=0.0, endpoint=endpoint))


def test_output_tickers_and_calls_per_interval(sqlite_engine: Engine) -> None:
    b = new_batch(sqlite_engine)
    # A: one call decoding 300 tokens from 5 s to 15 s (first token at 5 s), then one of
    # 100 tokens from 25 s to 30 s. B: 200 tokens, decoding 12-16 s; a failed call at 18 s.
    call(sqlite_engine, b, "A", "market", 0.0, 5.0, 15.0, 300)
    call(sqlite_engine, b, "A", "bull", 24.0, 25.0, 30.0, 100)
    call(sqlite_engine, b, "B", "market", 10.0, 12.0, 16.0, 200)
    call(sqlite_engine, b, "B", "bull", 18.0, None, 19.0, None, status="error")
    got = batch_timeline(sqlite_engine, b, width_s=10)
    assert [(i.start_s, i.end_s) for i in got] == [(0, 10), (10, 20), (20, 30)]
    # 0-10: half of A's first answer (150). 10-20: its other half and all of B's (350).
    # 20-30: A's second answer (100). Failed calls produce nothing.
    assert [i.output_tokens_per_s for i in got] == pytest.approx([15.0, 35.0, 10.0])
    # A is in flight 0-30 s, B 10-19 s: 1 ticker, then 1.9 on average, then 1.
    assert [i.tickers_in_flight for i in got] == pytest.approx([1.0, 1.9, 1.0])
    assert [i.attempts_started for i in got] == [1, 2, 1]
    # No readings: nothing is made up.
    assert all(i.running_mean is None and i.kv_usage_max is None and i.preemptions is None
               for i in got)
    # The whole batch's output comes back from the intervals.
    assert sum(i.output_tokens_per_s * (i.end_s - i.start_s) for i in got) == pytest.approx(600)


def test_readings_per_interval_sum_endpoints_and_survive_a_restart(sqlite_engine: Engine) -> None:
    b = new_batch(sqlite_engine)
    call(sqlite_engine, b, "A", "market", 0.0, 1.0, 20.0, 190)
    one, two = "http://gpu0:8000/v1", "http://gpu1:8001/v1"
    reading(sqlite_engine, b, -2.0, 0, 0.0, 5.0, one)  # before the first call: the baseline
    reading(sqlite_engine, b, 2.0, 4, 0.50, 7.0, one)
    reading(sqlite_engine, b, 6.0, 6, 0.70, 7.0, one)
    reading(sqlite_engine, b, 4.0, 3, 0.20, 0.0, two)
    reading(sqlite_engine, b, 12.0, 2, 0.90, 1.0, one)  # restarted: counts from 0 again
    reading(sqlite_engine, b, 14.0, 1, 0.30, 2.0, two)
    reading(sqlite_engine, b, 25.0, 9, 1.00, 50.0, one)  # after the last answer: left out
    first, second = batch_timeline(sqlite_engine, b, width_s=10)
    # Running: each endpoint's mean in the interval, summed (5 + 3, then 2 + 1).
    assert first.running_mean == pytest.approx(8.0) and second.running_mean == pytest.approx(3.0)
    assert first.kv_usage_max == pytest.approx(0.70) and second.kv_usage_max == pytest.approx(0.90)
    # Preemptions: 7 - 5 on the first endpoint (its second endpoint's first reading is its
    # baseline), then 1 after its restart plus 2 - 0 on the second.
    assert first.preemptions == pytest.approx(2.0) and second.preemptions == pytest.approx(3.0)


def test_the_width_gives_at_most_twelve_intervals_and_the_table_reads_them(
        sqlite_engine: Engine) -> None:
    assert width_for(40) == 10 and width_for(276.8) == 30 and width_for(1_095) == 120
    assert width_for(20 * 3600) == WIDTHS_S[-1]  # a very long batch: more than 12, an hour each
    for makespan in (5, 121, 299, 1_000, 7_000):
        assert makespan / width_for(makespan) <= INTERVALS
    b = new_batch(sqlite_engine)
    assert batch_timeline(sqlite_engine, b) == []  # no calls, no intervals
    call(sqlite_engine, b, "A", "market", 0.0, 0.5, 4.0, 70)
    (only,) = batch_timeline(sqlite_engine, b)
    assert (only.start_s, only.end_s) == (0, 4.0)  # the last interval ends at the last answer
    console = Console(width=200, record=True)
    console.print(timeline_table([only]))
    text = console.export_text()
    assert "0–4" in text and "17.5" in text  # 70 tokens in an interval of 4 s


def test_a_last_interval_shorter_than_a_second_reads_as_one_number(
        sqlite_engine: Engine) -> None:
    # Two calls: the first ends at 10.3 s, so the second interval (width 10) is 10.0–10.3.
    b = new_batch(sqlite_engine)
    call(sqlite_engine, b, "A", "market", 0.0, 0.5, 9.0, 50)
    call(sqlite_engine, b, "A", "news", 9.0, 9.5, 10.3, 8)
    first, last = batch_timeline(sqlite_engine, b)
    assert (last.start_s, last.end_s) == (10.0, 10.3)
    assert (first.label, last.label) == ("0–10", "10")
    console = Console(width=200, record=True)
    console.print(timeline_table([first, last]))
    text = console.export_text()
    cells = [line.split("│")[1].strip() for line in text.splitlines() if line.count("│") > 2]
    assert cells == ["0–10", "10"] and "10–10" not in text
