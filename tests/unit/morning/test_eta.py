"""The ETA: tokens left ÷ the server's rate now, or the longest chain left × recent latency.

Each test builds a batch row by row (two tickers of 17 nodes, one sample) and states the
expected figures from what it wrote: every call costs ``COST`` output tokens, every call
takes ``LATENCY_S`` from issue to answer, and the servers' counter grows at a stated rate.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from agents.nodes import ANALYSTS
from app.db.models import ProgressReading
from app.morning import eta
from tests.unit.support.eta_rows import COST, LATENCY_S, NODES, NOW, batch, calls, counter


def test_work_left_over_the_servers_rate_now(sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "running"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(minutes=5))
    calls(sqlite_engine, b, "BBB", list(ANALYSTS))
    counter(sqlite_engine, b, [5.0, 5.0, 5.0, 5.0])
    found = eta.reading(sqlite_engine, b, NOW)
    # BBB has its 13 later nodes left at 100 tokens each, 1,300 tokens, less the 200 the
    # servers made in 2 minutes (600) beyond the calls answered in them (400): under way.
    assert (found.calls_done, found.calls_expected, found.chain_left) == (21, 34, 13)
    assert found.tokens_left == 1_100 and found.rate_source == "server"
    assert found.rate_tok_s == pytest.approx(5.0)
    assert found.eta_s == pytest.approx(220.0)  # above the chain's 13 × 4 s = 52 s


def test_retries_and_re_asks_make_calls_dearer_not_the_night_shorter(
        sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "running"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(minutes=5))
    # AAA's portfolio manager was asked again (a second call of the node) and its trader's
    # first attempt failed: each node's cost per answered call doubles.
    calls(sqlite_engine, b, "AAA", ["portfolio_manager"], end=NOW - timedelta(minutes=4))
    calls(sqlite_engine, b, "AAA", ["trader"], end=NOW - timedelta(minutes=4), status="error")
    calls(sqlite_engine, b, "BBB", list(ANALYSTS))
    counter(sqlite_engine, b, [5.0, 5.0, 5.0, 5.0])
    found = eta.reading(sqlite_engine, b, NOW)
    assert found.attempts == 23 and found.calls_done == 21  # calls, not attempts
    # 200 of it made already by calls under way (as above).
    assert found.tokens_left == 11 * COST + 2 * COST + 2 * COST - 200
    assert found.eta_s == pytest.approx(1_300 / 5.0)


def test_the_tail_is_the_chain_left_times_the_latency_never_zero(
        sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "running"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(seconds=60))
    calls(sqlite_engine, b, "BBB", NODES[:-2])  # neutral_r2 and the portfolio manager left
    counter(sqlite_engine, b, [500.0, 500.0, 500.0, 500.0])  # 200 tokens: 0.4 s of work
    found = eta.reading(sqlite_engine, b, NOW)
    assert found.chain_left == 2 and found.chain_s == 2 * LATENCY_S
    assert found.eta_s == 2 * LATENCY_S


def test_nothing_left_reads_zero_and_no_call_yet_reads_no_eta(sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded"})
    calls(sqlite_engine, b, "AAA", NODES)
    assert eta.reading(sqlite_engine, b, NOW).eta_s == 0.0
    fresh = batch(sqlite_engine, {"AAA": "queued"})
    assert eta.reading(sqlite_engine, fresh, NOW).eta_s is None


def test_the_interval_spans_the_windows_slowest_and_fastest_rate(
        sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "running"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(minutes=5))
    calls(sqlite_engine, b, "BBB", list(ANALYSTS))
    counter(sqlite_engine, b, [2.0, 4.0, 6.0, 8.0])  # the four 30 s slices of the window
    found = eta.reading(sqlite_engine, b, NOW)
    assert (found.rate_low_tok_s, found.rate_high_tok_s) == (2.0, 8.0)
    assert found.rate_tok_s == pytest.approx(5.0)
    assert (found.eta_low_s, found.eta_s, found.eta_high_s) == pytest.approx(
        (1_100 / 8.0, 1_100 / 5.0, 1_100 / 2.0))


def test_without_metrics_the_rate_is_the_output_of_the_calls_that_ended(
        sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "running"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(minutes=5))
    calls(sqlite_engine, b, "BBB", list(ANALYSTS))  # 400 tokens in the last 2 minutes
    found = eta.reading(sqlite_engine, b, NOW)
    assert found.rate_source == "calls"
    assert found.rate_tok_s == pytest.approx(400 / eta.WINDOW_S)
    assert found.eta_s == pytest.approx(1_300 / (400 / eta.WINDOW_S))


def test_a_past_moment_reads_only_the_rows_stored_by_then(sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "running"})
    calls(sqlite_engine, b, "AAA", NODES)
    earlier = eta.reading(sqlite_engine, b, NOW - timedelta(seconds=LATENCY_S * 4 + 1))
    assert earlier.calls_done == len(NODES) - 5


def test_a_reading_is_stored_with_its_inputs(sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "running"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(minutes=5))
    calls(sqlite_engine, b, "BBB", list(ANALYSTS))
    counter(sqlite_engine, b, [5.0, 5.0, 5.0, 5.0])
    eta.record(sqlite_engine, b, eta.reading(sqlite_engine, b, NOW))
    with Session(sqlite_engine) as s:
        row = s.scalars(select(ProgressReading)).one()
    assert (row.batch_id, row.taken_at, row.calls_done, row.tokens_left, row.chain_left) == (
        b, NOW, 21, 1_100, 13)
    assert row.eta_s == pytest.approx(220.0) and row.chain_s == 13 * LATENCY_S


def test_a_window_without_output_falls_back_to_the_batchs_rate_so_far(
        sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "queued"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(minutes=9))
    found = eta.reading(sqlite_engine, b, NOW)
    # AAA's 17 calls, 2 s each, one ending every 4 s: they ran 16 × 4 + 2 = 66 s for 1,700
    # tokens; BBB's 1,700 tokens take as long at that rate (above its chain: 14 × 4 s).
    assert found.rate_source == "batch"
    assert found.rate_tok_s == pytest.approx(1_700 / 66)
    assert found.eta_s == pytest.approx(66.0)


@pytest.mark.parametrize(("model", "pm_tokens"), [("tiny", 300), ("other", COST)])
def test_nodes_not_answered_yet_cost_what_the_night_before_made(
        sqlite_engine: Engine, model: str, pm_tokens: int) -> None:
    before = batch(sqlite_engine, {"AAA": "succeeded"}, status="succeeded", model=model)
    calls(sqlite_engine, before, "AAA", NODES[:-1], end=NOW - timedelta(days=1))
    calls(sqlite_engine, before, "AAA", ["portfolio_manager"], tokens=300,
          end=NOW - timedelta(days=1))
    b = batch(sqlite_engine, {"AAA": "running"})
    calls(sqlite_engine, b, "AAA", NODES[:-1])
    counter(sqlite_engine, b, [5.0, 5.0, 5.0, 5.0])
    found = eta.reading(sqlite_engine, b, NOW)
    # Its portfolio manager has not answered: 300 tokens as the night before of the same
    # model made; a night of another model says nothing, so the mean of this night's calls.
    assert found.tokens_left == pm_tokens
    assert found.eta_s == pytest.approx(pm_tokens / 5.0)


def test_before_the_first_answer_the_chain_at_the_night_befores_latencies_stands_alone(
        sqlite_engine: Engine) -> None:
    before = batch(sqlite_engine, {"AAA": "succeeded"}, status="succeeded")
    calls(sqlite_engine, before, "AAA", NODES, end=NOW - timedelta(days=1))
    b = batch(sqlite_engine, {"AAA": "running"})
    counter(sqlite_engine, b, [0.1, 0.1, 0.1, 0.1])  # a warming server: 1,700 tokens in 5 h
    found = eta.reading(sqlite_engine, b, NOW)
    assert found.rate_tok_s is None and found.calls_done == 0
    # The analysts side by side, then 13 nodes one after another, 4 s each the night before.
    assert found.chain_s == 14 * LATENCY_S and found.eta_s == 14 * LATENCY_S


def test_a_call_past_its_usual_latency_still_has_half_of_it_to_go(
        sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "running"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(minutes=3))
    # BBB's last answer came 100 s ago; its portfolio manager (4 s usually) is still out.
    calls(sqlite_engine, b, "BBB", NODES[:-1], end=NOW - timedelta(seconds=100))
    counter(sqlite_engine, b, [500.0, 500.0, 500.0, 500.0])
    found = eta.reading(sqlite_engine, b, NOW)
    assert found.chain_left == 1 and found.tokens_left == 0
    assert found.eta_s == eta.OVERDUE_SHARE * LATENCY_S > 0
