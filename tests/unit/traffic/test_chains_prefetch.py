"""Prefetching: analysts ahead of a free chain slot, chains capped by their own size (chains.py)."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace

import pytest

from agents.chat import CallTag
from app.errors import InputError
from app.traffic.budget import Claim, TokenBudget
from app.traffic.chains import Footprint, prefetch_depth
from app.traffic.gate import Gate
from app.traffic.holdback import CHAIN_CAP, COLUMNS, ROOM
from app.traffic.server import Server
from app.traffic.strategy import Strategy
from app.traffic.ticket import Ticket
from tests.unit.support.chains import run_wide
from tests.unit.support.servers import Unread
from tests.unit.support.stepped_gpu import SteppedGPU


def test_prefetch_is_an_adaptive_switch_on_by_default() -> None:
    assert Strategy.parse("adaptive:prefetch=on").prefetch
    assert Strategy.parse("adaptive").prefetch  # the default since the H200's 40-ticker run
    assert not Strategy.parse("adaptive:prefetch=off").prefetch
    assert not Strategy.parse("fixed-3").prefetch  # no budget to count chains in
    # The budget it counts chains in is always there: budget=off is a knob no more.
    with pytest.raises(InputError, match="bad knob 'budget=off'"):
        Strategy.parse("adaptive:prefetch=on,budget=off")
    with pytest.raises(InputError, match=re.escape("prefetch=on|off")):
        Strategy.parse("adaptive:prefetch=maybe")


def test_a_ticket_knows_its_fan_out_from_its_shape() -> None:
    ticket = Ticket(0, requests=17, chain=14)  # four analysts, then 13 calls in a row
    assert ticket.fan_out == 4
    assert ticket.fanning
    ticket.chained = True
    assert not ticket.fanning
    assert Ticket(0, requests=5, chain=5).fan_out == 0  # a chain only: nothing to prefetch
    assert Ticket(0).fan_out == 0  # shape unknown


def test_the_gate_keeps_each_tickets_reservation() -> None:
    async def scenario() -> None:
        gate = Gate(4, TokenBudget(capacity=10_000))
        ticket = Ticket(0, 17, 14)
        async with gate.slot(ticket, Claim(1_200)):
            async with gate.slot(ticket, Claim(800)):
                assert ticket.reserved == 2_000
            assert ticket.reserved == 1_200
        assert ticket.reserved == 0
    asyncio.run(scenario())


def test_the_chain_footprint_counts_chains_only_each_by_its_own_tokens() -> None:
    budget = TokenBudget(capacity=20_000)
    gate = Gate(32, budget)
    analysts = Ticket(0, 17, 14, outstanding=4, reserved=4_800)
    sending = Ticket(1, 17, 14, outstanding=1, reserved=1_000, chained=True)
    between = Ticket(2, 17, 14, hold=2_000, chained=True)
    budget.reserved, budget.held = 5_800, 2_000
    footprint = Footprint(weight=0.5, chains_only=True)
    footprint.sample(gate, [analysts])
    # No chain yet: the ticker mean stands in (the analysts' 5,800 + 2,000 held, one active).
    assert footprint.per_ticker is None
    assert footprint.tokens() == 7_800
    assert footprint.slots(budget.limit) == 20_580 // 7_800
    footprint.sample(gate, [analysts, sending, between])
    # The analysts' burst is not a chain's size: (1,000 + 2,000) / 2 chains.
    assert footprint.tokens() == 1_500
    assert footprint.slots(budget.limit) == 20_580 // 1_500
    # The control: without prefetching the same reading is the tickers' mean, burst and all.
    plain = Footprint(weight=0.5)
    plain.sample(gate, [analysts, sending, between])
    assert plain.tokens() == 7_800 / 3


def test_the_fan_out_depth_is_the_free_slots_and_what_feeds_a_full_set() -> None:
    assert prefetch_depth(14, 14, 14) == 2  # 14 chains of 13 steps: two coming up behind
    assert prefetch_depth(14, 10, 14) == 4 + 2
    assert prefetch_depth(14, 20, 14) == 2  # over the cap (a cohort grew): feeders only
    assert prefetch_depth(3, 0, 0) == 3 + 3  # shape unknown: a chain of one step


def prefetching_endpoint(capacity: int | None = 10_000) -> Server:
    llm = SimpleNamespace(settings=SimpleNamespace(calls=SimpleNamespace(max_concurrency=64)))
    endpoint = Server(0, "http://gpu0.test:8000/v1", llm,  # type: ignore[arg-type]
                        Strategy.parse("adaptive:prefetch=on"), gauges=Unread())
    assert endpoint.limits.budget is not None
    endpoint.limits.budget.set_capacity(capacity)
    endpoint.gate.set_limit(32)
    return endpoint


def test_prefetching_caps_nothing_until_the_budget_knows_the_capacity() -> None:
    # No vllm:cache_config_info: the budget admits everything and counts no chain slot, so
    # tickers start by the request count alone, however many are in their fan-out.
    endpoint = prefetching_endpoint(capacity=None)
    fanning = [Ticket(i, 17, 14, outstanding=4, reserved=1_000) for i in range(8)]
    for ticket in fanning:
        endpoint.arrive(ticket)
    endpoint.limits.budget.reserved = 8_000  # type: ignore[union-attr]
    endpoint.limits.footprint.sample(endpoint.gate, fanning)
    assert endpoint.fanning == 8
    assert endpoint.chain_slots() is None
    assert endpoint.load(None).room
    assert endpoint.blocker() == ROOM


def test_a_new_ticker_starts_while_few_are_in_their_fan_out() -> None:
    endpoint = prefetching_endpoint()
    chains = [Ticket(i, 17, 14, outstanding=1, reserved=2_200, chained=True) for i in range(4)]
    for ticket in chains:
        endpoint.arrive(ticket)
    endpoint.limits.budget.reserved = 8_800  # type: ignore[union-attr]
    endpoint.limits.footprint.sample(endpoint.gate, chains)
    assert endpoint.chain_slots() == 4  # 10,290 // 2,200
    assert endpoint.chains == 4
    # Every chain slot taken, yet one ticker may run its analysts to take the next free one.
    assert endpoint.load(None).room
    assert endpoint.blocker() == ROOM
    waiting = Ticket(4, 17, 14, outstanding=4, reserved=1_000)
    endpoint.arrive(waiting)
    assert endpoint.fanning == 1
    assert not endpoint.load(None).room
    assert endpoint.blocker() == CHAIN_CAP
    endpoint.leave(chains[0])  # a chain ended: a slot is free, so one more may fan out
    assert endpoint.load(None).room


def test_a_ticker_waits_for_a_chain_slot_and_holds_nothing_while_it_waits() -> None:
    async def scenario() -> None:
        endpoint = prefetching_endpoint()
        budget = endpoint.limits.budget
        assert budget is not None
        first = Ticket(0, 17, 14, outstanding=1, reserved=8_000, chained=True)
        endpoint.arrive(first)
        budget.reserved = 8_000
        endpoint.limits.footprint.sample(endpoint.gate, [first])
        assert endpoint.chain_slots() == 1
        # The second ticker's analysts are done; its last one left a hold of 1,200 tokens.
        second = Ticket(1, 17, 14, done=4, hold=1_200)
        endpoint.gate.holds[second.order] = 1_200
        endpoint.arrive(second)
        budget.held = 1_200
        entering = asyncio.create_task(endpoint.enter_chain(second))
        await asyncio.sleep(0)
        assert not entering.done()
        assert (second.hold, budget.held) == (0, 0)  # its analysts' prompts are not reused
        assert endpoint.chains == 1  # a waiting ticker is not a chain
        first.finished = True  # the first chain ends and leaves
        endpoint.leave(first)
        endpoint.gate.changed.set()
        # Its chain begins; its client marks the ticket (the server writes no ticket).
        assert await asyncio.wait_for(entering, 1) and not second.chained
        second.chained = True
        assert endpoint.chains == 1
        # An urgent ticker (the tail rule) does not wait.
        third = Ticket(2, 17, 14, done=4, urgent=True)
        endpoint.arrive(third)
        assert await asyncio.wait_for(endpoint.enter_chain(third), 1)
        # A call of the fan-out never waits: the analysts are what prefetching runs early.
        fourth = Ticket(3, 17, 14, done=2)
        assert not await asyncio.wait_for(endpoint.enter_chain(fourth), 1)
    asyncio.run(scenario())


def test_a_prefetching_batch_finishes_every_ticker_without_a_preemption(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tests.unit.support.chains.STRATEGY", "adaptive:tail=off,prefetch=on")
    started, server = run_wide()
    assert len(started) == 40
    assert server.preemptions == 0


def test_the_stepped_server_preempts_the_newest_and_pays_for_its_prefill_again() -> None:
    async def scenario() -> SteppedGPU:
        # Two requests of 40 prompt tokens and 40 answers each grow to 6 blocks of 16:
        # 12 blocks do not fit 8, so the newer one is preempted and prefilled again.
        gpu = SteppedGPU(capacity=128, read_every=1, p_equiv=10)
        body = {"messages": [{"role": "user", "content": "x" * 160}], "max_tokens": 40}
        sends = [asyncio.create_task(gpu.attempt(CallTag(1, "T", f"n{i}", 0), None, body))
                 for i in range(2)]
        await asyncio.sleep(0)
        while not all(s.done() for s in sends):
            gpu.step()
            await asyncio.sleep(0)
        return gpu

    gpu = asyncio.run(scenario())
    assert gpu.preemptions >= 1
    assert gpu.prefilled > 2 * 40  # the preempted request's prompt and answer, once more
    assert gpu.time == pytest.approx(gpu.steps + gpu.prefilled / 10)
    assert gpu.generated >= 2 * 40


def test_a_ticker_without_a_fan_out_is_a_chain_from_its_first_call() -> None:
    async def scenario() -> None:
        endpoint = prefetching_endpoint()
        only_chain = Ticket(0, requests=5, chain=5)
        samples = Ticket(1, requests=34, chain=14)  # two samples side by side
        assert (only_chain.fan_out, samples.fan_out) == (0, 0)
        for ticket in (only_chain, samples):
            endpoint.arrive(ticket)
            ticket.chained = await asyncio.wait_for(endpoint.enter_chain(ticket), 1)  # as a client
            assert ticket.chained and not ticket.fanning
        assert endpoint.chains == 2  # counted by the cap, never waiting for a slot
        for ticket in (only_chain, samples):
            ticket.outstanding, ticket.reserved = 1, 4_000
        endpoint.limits.budget.reserved = 8_000  # type: ignore[union-attr]
        endpoint.limits.footprint.sample(endpoint.gate, [only_chain, samples])
        assert endpoint.chain_slots() == 2
        # Nothing runs ahead, so a new ticker waits as under the ticker cap: 2 of 2 started.
        assert not endpoint.load(None).room
        assert endpoint.blocker() == CHAIN_CAP
    asyncio.run(scenario())


def test_the_hold_back_rows_count_chains_and_fan_outs_when_prefetching() -> None:
    endpoint = prefetching_endpoint(capacity=20_000)
    chain = Ticket(0, 17, 14, outstanding=1, reserved=9_500, chained=True)
    # Two tickers whose analysts are done wait for the second chain slot.
    ready = [Ticket(i, 17, 14, done=4) for i in (1, 2)]
    for ticket in (chain, *ready):
        endpoint.arrive(ticket)
    endpoint.limits.budget.reserved = 9_500  # type: ignore[union-attr]
    endpoint.limits.footprint.sample(endpoint.gate, [chain, *ready])
    endpoint.note_start_wait(1.0)
    row = dict(zip(COLUMNS, endpoint.holdback.timeline[0], strict=True))
    assert (row["chains"], row["fanning"], row["chain_slots"]) == (1, 2, 2)
    # One slot free and one ticker to feed the two: both taken by the two waiting.
    assert row["blocker"] == CHAIN_CAP


def test_the_stepped_servers_prefix_cache_keeps_a_context_until_its_room_is_needed() -> None:
    def call(ticker: str, prompt: int) -> dict[str, object]:
        return {"messages": [{"role": "user", "content": "x" * (prompt * 4)}],
                "max_tokens": 4, "prefix": (ticker, 64)}

    async def one(gpu: SteppedGPU, body: dict[str, object]) -> None:
        task = asyncio.create_task(gpu.attempt(CallTag(1, "T", "n", 0), None, body))
        await asyncio.sleep(0)
        while not task.done():
            gpu.step()
            await asyncio.sleep(0)

    async def scenario(filler: int) -> SteppedGPU:
        gpu = SteppedGPU(capacity=256, read_every=1, prefix_cache=True)
        await one(gpu, call("A", 96))  # A's 64-token context now cached
        if filler:
            await one(gpu, call("B", filler))  # B needs the room: A's context goes
        await one(gpu, call("A", 128))
        return gpu

    kept, evicted = asyncio.run(scenario(0)), asyncio.run(scenario(200))
    assert kept.hits == 64  # A's second call prefilled only what follows its context
    assert evicted.hits == 0
    assert kept.prefilled == 96 + 128 - 64
