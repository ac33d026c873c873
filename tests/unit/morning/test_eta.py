"""The ETA: the calls left at the busy time their nodes' calls took, or the longest chain left.

Each test builds a batch row by row (tickers of 17 nodes, one sample) and states the expected
figures from what it wrote: a ticker's calls run one after another, each ready
``LATENCY_S`` (4 s) before its answer and issued half-way (2 s held at the gate), and calls
of tickers written with the same end times are ready together, sharing the servers' time.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from agents.nodes import ANALYSTS
from app.db.models import LLMCall, ProgressReading
from app.morning import eta
from tests.unit.support.eta_rows import CHAIN, COST, LATENCY_S, NODES, NOW, batch, calls, counter

ISSUED_S = LATENCY_S / 2  # issue to answer: what the chain counts


def test_shares_split_each_moment_among_the_calls_ready_and_add_up_to_the_busy_time() -> None:
    t = datetime(2026, 12, 3, tzinfo=UTC)
    at = [t + timedelta(seconds=s) for s in range(12)]
    # Two calls overlap for 2 s; nothing is ready from 6 s to 8 s; a third runs alone.
    shares = eta.Shares([(at[0], at[4], 1), (at[2], at[6], 1), (at[8], at[11], 1)])
    assert shares.of(at[0], at[4]) == pytest.approx(2 + 2 / 2)
    assert shares.of(at[2], at[6]) == pytest.approx(2 / 2 + 2)
    assert shares.of(at[8], at[11]) == pytest.approx(3)
    # The servers were busy 6 s + 3 s, the idle 2 s counting for no call.
    assert sum(shares.of(a, b) for a, b in ((at[0], at[4]), (at[2], at[6]), (at[8], at[11]))
               ) == pytest.approx(6 + 3)


def test_a_call_alone_on_the_servers_costs_its_whole_time_from_ready(
        sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "running"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(minutes=5))
    calls(sqlite_engine, b, "BBB", list(ANALYSTS))
    # The servers' output (600 tokens) made in the last minute, while BBB's analysts ran:
    # a first night's work is at least the output left at that rate.
    counter(sqlite_engine, b, [0.0, 0.0, 10.0, 10.0])
    found = eta.reading(sqlite_engine, b, NOW)
    assert (found.calls_done, found.calls_expected, found.chain_left) == (21, 34, 13)
    # Every call ran alone: 4 s of the servers each; BBB's 13 later nodes are 52 s of work.
    # Its chain: 4 s for the step it is in (ready now), then 12 × 2 s issue to answer.
    assert found.chain_s == pytest.approx(LATENCY_S + 12 * ISSUED_S)
    assert found.eta_s == pytest.approx(13 * LATENCY_S) and found.rate_source == "night"
    # Tokens left: 13 × 100, less the 200 the servers made in 2 minutes (600) beyond the
    # calls answered in them (400): under way. The rate stored is what the work implies.
    assert found.tokens_left == 1_100
    assert found.rate_tok_s == pytest.approx(1_100 / (13 * LATENCY_S))


def test_calls_ready_together_share_the_servers(sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "succeeded", "CCC": "queued",
                              "DDD": "queued"})
    for ticker in ("AAA", "BBB"):
        calls(sqlite_engine, b, ticker, NODES, end=NOW - timedelta(minutes=5))
    found = eta.reading(sqlite_engine, b, NOW)
    # Two at a time, each call had half of its 4 s: CCC's and DDD's 34 calls are 68 s.
    assert found.eta_s == pytest.approx(34 * LATENCY_S / 2)
    assert found.chain_s == pytest.approx(14 * ISSUED_S)  # not started: the analysts, 13


def test_retries_and_re_asks_make_calls_dearer_not_the_night_shorter(
        sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "running"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(minutes=5))
    # AAA's portfolio manager was asked again and its trader's first attempt failed, the
    # two ready together: each had 2 s more of the servers.
    calls(sqlite_engine, b, "AAA", ["portfolio_manager"], end=NOW - timedelta(minutes=4))
    calls(sqlite_engine, b, "AAA", ["trader"], end=NOW - timedelta(minutes=4), status="error")
    calls(sqlite_engine, b, "BBB", list(ANALYSTS))
    found = eta.reading(sqlite_engine, b, NOW)
    assert found.attempts == 23 and found.calls_done == 21  # calls, not attempts
    assert found.eta_s == pytest.approx(11 * LATENCY_S + 2 * (LATENCY_S + LATENCY_S / 2))


def test_one_ticker_left_runs_its_chain_not_the_shares_it_had_beside_others(
        sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "running", "CCC": "succeeded",
                              "DDD": "succeeded"})
    for ticker in ("AAA", "CCC", "DDD"):
        calls(sqlite_engine, b, ticker, NODES)
    calls(sqlite_engine, b, "BBB", NODES[:-2])  # two steps behind; the others are done
    found = eta.reading(sqlite_engine, b, NOW)
    # Four at a time, BBB's calls had 1 s each: its two left are 2 s of work, but its
    # neutral_r2 (ready now) takes 4 s and the portfolio manager 2 s after it.
    assert found.chain_left == 2
    assert found.eta_s == found.chain_s == pytest.approx(LATENCY_S + ISSUED_S)


@pytest.mark.parametrize(("ready_s", "left_s"), [
    (1.0, LATENCY_S - 1.0),  # what the calls that took longer had left at its age
    (100.0, eta.OVERDUE_SHARE * LATENCY_S)])  # past them all: half its share still to go
def test_a_call_under_way_has_what_longer_calls_had_left_and_never_nothing(
        sqlite_engine: Engine, ready_s: float, left_s: float) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "running"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(minutes=3))
    calls(sqlite_engine, b, "BBB", NODES[:-1], end=NOW - timedelta(seconds=ready_s))
    found = eta.reading(sqlite_engine, b, NOW)
    assert found.chain_left == 1 and found.eta_s == pytest.approx(left_s) and left_s > 0


def test_a_call_under_way_is_not_priced_from_gate_waits_longer_than_any_step_waits_now(
        sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"OLD": "succeeded", "AAA": "succeeded", "CCC": "succeeded",
                              "DDD": "succeeded", "BBB": "running"})
    # OLD's portfolio manager waited 98 s at the gate five minutes ago; AAA's, CCC's and
    # DDD's answered in LATENCY_S. BBB's, ready 6 s (past the node's usual 4 s), is the
    # only open step: nothing waits longer now.
    calls(sqlite_engine, b, "OLD", NODES[:-1], end=NOW - timedelta(minutes=5))
    with Session(sqlite_engine) as s:
        ready = NOW - timedelta(minutes=5)
        s.add(LLMCall(batch_id=b, ticker="OLD", node=NODES[-1], sample=0, model="m",
                      completion_tokens=COST, status="ok", ready_at=ready,
                      started_at=ready + timedelta(seconds=100 - ISSUED_S),
                      ended_at=ready + timedelta(seconds=100), latency_s=ISSUED_S))
        s.commit()
    for ticker in ("AAA", "CCC", "DDD"):
        calls(sqlite_engine, b, ticker, NODES, end=NOW - timedelta(minutes=1))
    calls(sqlite_engine, b, "BBB", NODES[:-1], end=NOW - timedelta(seconds=6))
    found = eta.reading(sqlite_engine, b, NOW)
    # The only call that took longer than 6 s from ready is OLD's, 94 s left at that age;
    # no step waits at the gate now, so BBB's has its node's issue-to-answer latency left.
    assert found.chain_left == 1
    assert found.chain_s == pytest.approx(ISSUED_S)


@pytest.mark.parametrize(("model", "left_s"), [
    # The night before: its 16 first nodes two tickers at a time (2 s each), its portfolio
    # manager asked twice alone (8 s a call). Tonight runs alone (4 s a call): a pace of
    # 2, so the portfolio manager left is 16 s.
    ("tiny", 2 * 2 * LATENCY_S),
    # A night of another model says nothing: the mean of this night's calls (4 s).
    ("other", LATENCY_S)])
def test_nodes_left_cost_the_night_befores_shares_at_this_nights_pace(
        sqlite_engine: Engine, model: str, left_s: float) -> None:
    before = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "succeeded"},
                   status="succeeded", model=model)
    for ticker in ("AAA", "BBB"):
        calls(sqlite_engine, before, ticker, NODES[:-1], end=NOW - timedelta(days=1))
    calls(sqlite_engine, before, "AAA", ["portfolio_manager"] * 2,
          end=NOW - timedelta(days=1) + timedelta(seconds=2 * LATENCY_S))
    b = batch(sqlite_engine, {"AAA": "running"})
    calls(sqlite_engine, b, "AAA", NODES[:-1])
    found = eta.reading(sqlite_engine, b, NOW)
    assert found.eta_s == pytest.approx(left_s)
    assert found.rate_source == ("before" if model == "tiny" else "night")


def test_before_the_first_answer_the_night_befores_shares_and_latencies_stand_alone(
        sqlite_engine: Engine) -> None:
    before = batch(sqlite_engine, {"AAA": "succeeded"}, status="succeeded")
    calls(sqlite_engine, before, "AAA", NODES, end=NOW - timedelta(days=1))
    b = batch(sqlite_engine, {"AAA": "queued"})
    counter(sqlite_engine, b, [0.1, 0.1, 0.1, 0.1])  # a warming server says nothing
    found = eta.reading(sqlite_engine, b, NOW)
    assert found.calls_done == 0 and found.rate_source == "before"
    # 17 calls at 4 s each the night before; the chain: the analysts, then 13 × 2 s.
    assert found.chain_s == 14 * ISSUED_S and found.eta_s == 17 * LATENCY_S


def test_nothing_left_reads_zero_and_no_call_yet_reads_no_eta(sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded"})
    calls(sqlite_engine, b, "AAA", NODES)
    assert eta.reading(sqlite_engine, b, NOW).eta_s == 0.0
    fresh = batch(sqlite_engine, {"AAA": "queued"})
    assert eta.reading(sqlite_engine, fresh, NOW).eta_s is None


def test_an_open_ticker_with_every_node_answered_is_asked_again(sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "running"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(seconds=1))
    found = eta.reading(sqlite_engine, b, NOW)
    assert found.chain_left == 1 and found.eta_s == pytest.approx(LATENCY_S - 1)


def test_the_work_spans_the_nodes_shares_quartiles_without_a_night_before(
        sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "succeeded", "CCC": "succeeded",
                              "DDD": "queued"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(minutes=5))  # alone: 4 s
    for ticker in ("BBB", "CCC"):  # together: 2 s each
        calls(sqlite_engine, b, ticker, NODES, end=NOW - timedelta(minutes=2))
    found = eta.reading(sqlite_engine, b, NOW)
    # Each node's shares are 2, 2, 4: quartiles 2 and 4, mean 8/3, for DDD's 17 calls; the
    # rates stored are the tokens left over each.
    assert found.eta_s == pytest.approx(17 * 8 / 3)
    assert (found.rate_high_tok_s, found.rate_low_tok_s) == pytest.approx(
        (found.tokens_left / (17 * 2.0), found.tokens_left / (17 * 4.0)))


@pytest.mark.parametrize("before", [False, True])
def test_a_first_night_works_at_least_at_the_servers_output_rate_since_the_analysts(
        sqlite_engine: Engine, before: bool) -> None:
    if before:
        prior = batch(sqlite_engine, {"AAA": "succeeded"}, status="succeeded")
        calls(sqlite_engine, prior, "AAA", NODES, end=NOW - timedelta(days=1))
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "running"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(minutes=5))
    calls(sqlite_engine, b, "BBB", list(ANALYSTS), end=NOW - timedelta(seconds=40))
    # 600 tokens in the analysts' stage, then 200 in the 40 s since, in which BBB's first
    # debater was ready: 5 tok/s. 400 of the 800 made are the analysts' answers: 400 under
    # way, 900 of BBB's 13 × 100 left.
    counter(sqlite_engine, b, [0.0, 30.0, 0.0, 10.0], every_s=20.0)
    found = eta.reading(sqlite_engine, b, NOW)
    assert found.tokens_left == 900
    # With no night before, 900 tokens at 5 tok/s (over the last minute, the analysts' burst
    # in, 63 s); with one, its shares at tonight's pace: 4 s a call, the debater's less the
    # half it has had.
    assert found.eta_s == pytest.approx(
        12 * LATENCY_S + LATENCY_S / 2 if before else 900 / 5)


@pytest.mark.parametrize("before", [False, True])
def test_the_interval_is_the_estimate_at_the_calibrated_ratios(sqlite_engine: Engine,
                                                               before: bool) -> None:
    if before:
        prior = batch(sqlite_engine, {"AAA": "succeeded"}, status="succeeded")
        calls(sqlite_engine, prior, "AAA", NODES, end=NOW - timedelta(days=1))
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "queued"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(minutes=5))
    found = eta.reading(sqlite_engine, b, NOW)
    # A first night's interval is its own replays' (wider): RATIO held 63% of them.
    ratio = eta.RATIO if before else eta.RATIO_FIRST
    assert found.eta_s is not None and found.eta_s > 0
    assert (found.eta_low_s, found.eta_high_s) == pytest.approx(
        (found.eta_s * ratio[0], found.eta_s * ratio[1]))


def test_a_past_moment_reads_only_the_rows_stored_by_then(sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "running"})
    calls(sqlite_engine, b, "AAA", NODES)
    earlier = eta.reading(sqlite_engine, b, NOW - timedelta(seconds=LATENCY_S * 4 + 1))
    assert earlier.calls_done == len(NODES) - 5


def test_a_reading_is_stored_with_its_inputs(sqlite_engine: Engine) -> None:
    b = batch(sqlite_engine, {"AAA": "succeeded", "BBB": "running"})
    calls(sqlite_engine, b, "AAA", NODES, end=NOW - timedelta(minutes=5))
    calls(sqlite_engine, b, "BBB", list(ANALYSTS))
    # The servers' output (600 tokens) made in the last minute, while BBB's analysts ran:
    # a first night's work is at least the output left at that rate.
    counter(sqlite_engine, b, [0.0, 0.0, 10.0, 10.0])
    eta.record(sqlite_engine, b, eta.reading(sqlite_engine, b, NOW))
    with Session(sqlite_engine) as s:
        row = s.scalars(select(ProgressReading)).one()
    assert (row.batch_id, row.taken_at, row.calls_done, row.tokens_left, row.chain_left) == (
        b, NOW, 21, 13 * COST - 200, 13)
    assert row.eta_s == pytest.approx(13 * LATENCY_S)
    assert row.chain_s == pytest.approx(LATENCY_S + 12 * ISSUED_S)


def _gated_night(engine: Engine, held: int, held_for_s: float, chain_done: int) -> int:
    """Two tickers answering their chains one call every 4 s up to now (``chain_done``
    nodes each) and ``held`` tickers whose analysts answered ``held_for_s`` ago, their
    first debater ready since: after a night before whose calls all cost alike."""
    before = batch(engine, {"AAA": "succeeded"}, status="succeeded")
    calls(engine, before, "AAA", NODES, end=NOW - timedelta(days=1))
    waiting = [f"H{i}" for i in range(held)]
    b = batch(engine, {"W1": "running", "W2": "running", **dict.fromkeys(waiting, "running")})
    for ticker in ("W1", "W2"):
        calls(engine, b, ticker, NODES[:len(ANALYSTS) + chain_done])
    for ticker in waiting:
        calls(engine, b, ticker, list(ANALYSTS), end=NOW - timedelta(seconds=held_for_s))
    return b


def test_a_gated_night_works_at_the_rate_its_chains_answers_come_in(
        sqlite_engine: Engine) -> None:
    # Six of eight open steps ready 300 s (over 3 x their node's 2 s): the night is gated.
    # Its 20 chain answers came in over the last 36 s; 84 calls are left, all of one cost.
    b = _gated_night(sqlite_engine, held=6, held_for_s=300.0, chain_done=10)
    found = eta.reading(sqlite_engine, b, NOW)
    assert found.eta_s == pytest.approx((2 * 3 + 6 * len(CHAIN)) * 36 / 20)


@pytest.mark.parametrize(("held", "held_for_s", "chain_done"), [
    (2, 300.0, 10),  # two held of four open steps: fewer than NEWEST_MIN
    (6, 1.0, 10),  # six ready 1 s: not held
    (6, 300.0, 4)])  # the chain's answers span 12 s: too little to give a rate
def test_a_night_not_gated_keeps_the_work_of_its_shares(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch, held: int, held_for_s: float,
        chain_done: int) -> None:
    b = _gated_night(sqlite_engine, held=held, held_for_s=held_for_s, chain_done=chain_done)
    found = eta.reading(sqlite_engine, b, NOW)
    monkeypatch.setattr(eta, "HELD_SHARE", 2.0)  # no night is gated
    assert found == eta.reading(sqlite_engine, b, NOW)
