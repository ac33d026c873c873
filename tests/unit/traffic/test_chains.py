"""Tickers in flight, capped by the chains the token budget keeps going (app/traffic/chains.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.traffic.budget import TokenBudget
from app.traffic.chains import Footprint
from app.traffic.gate import Gate
from app.traffic.server import Server
from app.traffic.strategy import Strategy
from app.traffic.ticket import Ticket
from tests.unit.support.budget_sim import body
from tests.unit.support.chains import run_wide
from tests.unit.support.servers import Unread


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
    assert footprint.slots(budget.limit) == 10_290 // 2_000  # 0.98 × 1.05 of the cache
    budget.reserved = 7_000  # their calls grew along the chain
    footprint.sample(gate, [sending, between_calls, waiting])
    assert footprint.per_ticker == 2_000 + 0.5 * (4_000 - 2_000)
    assert footprint.slots(budget.limit) == 3


def test_the_mean_starts_over_when_the_budget_costs_prompts_another_way() -> None:
    # On an H200 the first readings costed prompts at the default 0.5 tokens per byte, 2.3x
    # what the server's counts then showed; a mean that remembered them let one ticker
    # start every 4 s. Five tickers reserve 9,000 tokens each at the default ...
    def five_tickers_reading(budget: TokenBudget) -> tuple[Footprint, Gate, list[Ticket]]:
        gate = Gate(32, budget)
        tickets = [Ticket(i) for i in range(5)]
        for ticket in tickets:
            ticket.outstanding = 1
        budget.reserved = 5 * 9_000
        footprint = Footprint()
        for _ in range(10):
            footprint.sample(gate, tickets)
        return footprint, gate, tickets

    budget = TokenBudget(capacity=50_000)
    footprint, gate, tickets = five_tickers_reading(budget)
    assert footprint.per_ticker == 9_000
    assert footprint.slots(budget.limit) == 51_450 // 9_000  # 0.98 × 1.05 of 50,000
    # ... then a finished request shows 0.226 tokens per byte: the same calls cost 4,000.
    budget.learn("market", body(10_000, 300), prompt_tokens=2_260, completion_tokens=300)
    assert budget.ratio() < 0.5 * 0.9
    budget.reserved = 5 * 4_000
    footprint.sample(gate, tickets)
    assert footprint.per_ticker == 4_000  # started over on the new costs
    assert footprint.slots(budget.limit) == 51_450 // 4_000
    # A new mean is a plain average of its readings at first, not its first reading's.
    budget.reserved = 5 * 2_000
    footprint.sample(gate, tickets)
    assert footprint.per_ticker == 3_000
    # The control: the same readings with the costing unchanged keep the old mean's memory
    # (weight 1/11 on the eleventh reading), and the cap stays where the stale costs put it.
    same, same_gate, same_tickers = five_tickers_reading(TokenBudget(capacity=50_000))
    same_gate.budget.reserved = 5 * 4_000  # type: ignore[union-attr]
    same.sample(same_gate, same_tickers)
    assert same.per_ticker == 9_000 + (4_000 - 9_000) / 11
    assert same.slots(50_000 * 0.95) == 5


def test_nothing_is_capped_before_a_reading_has_seen_a_ticker() -> None:
    footprint = Footprint()
    assert footprint.slots(9_500) is None
    footprint.sample(Gate(8, TokenBudget(capacity=10_000)), [Ticket(0)])  # none active
    assert footprint.slots(9_500) is None
    assert footprint.slots(None) is None  # capacity unknown: no budget, no cap


def test_an_adaptive_endpoint_offers_no_room_past_the_chains_that_fit() -> None:
    llm = SimpleNamespace(settings=SimpleNamespace(calls=SimpleNamespace(max_concurrency=64)))
    endpoint = Server(0, "http://gpu0.test:8000/v1", llm,  # type: ignore[arg-type]
                        Strategy.parse("adaptive:prefetch=off"), gauges=Unread())
    assert endpoint.limits.budget is not None
    endpoint.limits.budget.set_capacity(10_000)
    endpoint.gate.set_limit(32)
    tickets = [Ticket(i) for i in range(4)]
    for ticket in tickets:
        ticket.outstanding = 1
        endpoint.arrive(ticket)
    endpoint.limits.budget.reserved = 8_800  # 2,200 a chain: 4 of 4.68 fit in 10,290
    endpoint.limits.footprint.sample(endpoint.gate, tickets)
    assert endpoint.chain_slots() == 4
    assert not endpoint.load(None).room  # the gate has room; one more chain would not fit
    assert endpoint.concurrency() == 4  # what the tail rule counts as running at once
    endpoint.leave(tickets[0])
    assert endpoint.load(None).room
    assert endpoint.load(8).room  # fixed-N keeps its own meaning


@pytest.mark.slow
def test_tickers_in_flight_follow_the_chains_that_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    capped, server = run_wide()
    assert server.preemptions == 0
    uncapped, _ = run_wide(monkeypatch)
    # Early calls are small, so without the cap tickers start that the cache cannot hold
    # once their prompts have grown: 22-23 at once in this batch (25 before a start counted a
    # typical request for each ticker yet to ask), 20 with the cap. The cap sees the calls
    # in flight, not the growth still to come along the chains (about 11 fit at their mean
    # call size here), so it narrows the overshoot, and the budget's gate keeps the cache
    # from overflowing (no preemption either way). The server is read every 2 ms of real
    # time, so a loaded host moves the uncapped peak by one: the cap is held to at least two
    # tickers fewer, not to a ratio of that peak.
    assert max(capped) <= max(uncapped) - 2, (capped, uncapped)
