"""Tickers in flight, capped by the chains the token budget keeps going (app/batch/chains.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from agents.chat import CallTag
from app.batch.budget import TokenBudget
from app.batch.chains import Footprint
from app.batch.endpoints import Endpoint
from app.batch.gate import Gate, GatedLLM, Ticket
from app.batch.scheduler import Job, Scheduler, Strategy
from tests.unit.budget_sim import SimServer, body


def test_the_footprint_is_per_ticker_with_a_call_admitted_or_a_hold() -> None:
    budget = TokenBudget(capacity=10_000)
    gate = Gate(8, budget)
    budget.reserved, budget.held = 3_000, 1_000
    sending, between_calls, waiting = Ticket(0), Ticket(1), Ticket(2)
    sending.outstanding = 1
    between_calls.hold = 1_000
    footprint = Footprint(weight=0.5)
    footprint.sample(gate, [sending, between_calls, waiting])
    # 4,000 tokens for the two that hold any: the waiting one reserves nothing, and counting
    # it would let too many started tickers make room for more.
    assert footprint.per_ticker == 2_000
    assert footprint.slots(budget.limit) == 9_500 // 2_000
    budget.reserved = 7_000  # their calls grew along the chain
    footprint.sample(gate, [sending, between_calls, waiting])
    assert footprint.per_ticker == 2_000 + 0.5 * (4_000 - 2_000)
    assert footprint.slots(budget.limit) == 3


def test_nothing_is_capped_before_a_reading_has_seen_a_ticker() -> None:
    footprint = Footprint()
    assert footprint.slots(9_500) is None
    footprint.sample(Gate(8, TokenBudget(capacity=10_000)), [Ticket(0)])  # none active
    assert footprint.slots(9_500) is None
    assert footprint.slots(None) is None  # capacity unknown: no budget, no cap


def test_an_adaptive_endpoint_offers_no_room_past_the_chains_that_fit() -> None:
    llm = SimpleNamespace(settings=SimpleNamespace(max_concurrency=64))
    endpoint = Endpoint(0, "http://gpu0.test:8000/v1", llm,  # type: ignore[arg-type]
                        Strategy.parse("adaptive"), gauges=SimpleNamespace())
    assert endpoint.budget is not None
    endpoint.budget.set_capacity(10_000)
    endpoint.gate.set_limit(32)
    tickets = [Ticket(i) for i in range(4)]
    for ticket in tickets:
        ticket.outstanding = 1
        endpoint.arrive(ticket)
    endpoint.budget.reserved = 8_000  # 2,000 a chain: 4 of 4.75 fit
    endpoint.footprint.sample(endpoint.gate, tickets)
    assert endpoint.chain_slots() == 4
    assert not endpoint.load(None).room  # the gate has room; one more chain would not fit
    assert endpoint.concurrency() == 4  # what the tail rule counts as running at once
    endpoint.leave(tickets[0])
    assert endpoint.load(None).room
    assert endpoint.load(8).room  # fixed-N keeps its own meaning


def wide_then_chain(key: str, started: list[int], live: set[str]) -> Job:
    """A ticker shaped like the pipeline's: four small calls at once, then a growing chain."""
    async def run(gated: GatedLLM) -> None:
        live.add(key)
        started.append(len(live))
        try:
            await asyncio.gather(*(gated.send(CallTag(1, key, f"analyst{i}", 0),
                                              body(1_000, 100)) for i in range(4)))
            for step in range(10):
                await gated.send(CallTag(1, key, f"step{step}", 0),
                                 body(1_200 + step * 1_200, 300))
        finally:
            live.discard(key)
    return Job(key, run, requests=14, chain=11)


def run_wide(monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[list[int], SimServer]:
    if monkeypatch is not None:  # the control: the same batch without the cap
        monkeypatch.setattr(Footprint, "slots", lambda self, limit: None)
    server = SimServer(24_000)  # about 8 chains at their mean size
    scheduler = Scheduler(server, Strategy.parse("adaptive:tail=off"),  # type: ignore[arg-type]
                          gauges=server, interval_s=0.004)
    server.budget = scheduler.budget
    started: list[int] = []
    live: set[str] = set()

    async def on_done(job: Job, result: object, error: BaseException | None) -> None:
        assert error is None

    asyncio.run(scheduler.run([wide_then_chain(f"T{i}", started, live) for i in range(40)],
                              on_done))
    assert len(started) == 40
    return started, server


def test_tickers_in_flight_follow_the_chains_that_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    capped, server = run_wide()
    assert server.preemptions == 0
    uncapped, _ = run_wide(monkeypatch)
    # Early calls are small, so without the cap tickers start that the cache cannot hold
    # once their prompts have grown (25 at once in this batch when written; 16 with it).
    assert max(capped) < 0.8 * max(uncapped), (capped, uncapped)
