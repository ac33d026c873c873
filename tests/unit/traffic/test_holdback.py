"""What kept new tickers from starting, reading by reading (app/traffic/holdback.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from agents.chat import CallTag
from app.recorder import figures
from app.traffic.budget import Claim
from app.traffic.client import TickerClient
from app.traffic.holdback import (
    CHAIN_CAP,
    COLUMNS,
    HELD,
    QUEUED,
    REQUEST_LIMIT,
    ROOM,
    TIMELINE_MAX,
    TOKEN_BUDGET,
    HoldBack,
)
from app.traffic.scheduler import Job
from app.traffic.server import Server
from app.traffic.strategy import Strategy
from app.traffic.ticket import Ticket
from tests.unit.support.budget_sim import SimServer, body, reading
from tests.unit.support.servers import Unread, over_one_server


def adaptive_endpoint() -> Server:
    llm = SimpleNamespace(settings=SimpleNamespace(calls=SimpleNamespace(max_concurrency=64)))
    endpoint = Server(0, "http://gpu0.test:8000/v1", llm,  # type: ignore[arg-type]
                        Strategy.parse("adaptive"), gauges=Unread())
    assert endpoint.limits.budget is not None
    endpoint.limits.budget.set_capacity(10_000)  # 10,290 may be reserved (0.98 × 1.05)
    endpoint.gate.set_limit(8)
    return endpoint


def test_the_blocker_is_the_first_thing_short_in_the_order_room_is_judged() -> None:
    endpoint = adaptive_endpoint()
    budget = endpoint.limits.budget
    assert budget is not None
    assert endpoint.blocker() == ROOM  # nothing out, nothing measured: a ticker may start

    tickets = [Ticket(i) for i in range(3)]
    for ticket in tickets:
        ticket.outstanding, ticket.asked = 1, True
        endpoint.arrive(ticket)
    budget.take(Claim(3_300))
    budget.take(Claim(3_300))
    budget.take(Claim(3_300))  # a typical request is 3,300: one more would pass 10,290
    assert endpoint.blocker() == TOKEN_BUDGET
    refused_before = budget._refused
    endpoint.note_start_wait(0.0)
    assert budget._refused == refused_before  # a report, not a refusal the factor learns from

    budget.give_back(Claim(3_300), hold=False)  # 6,600 out: a 3,300 request fits again...
    # ...but 3 chains of 2,200 use the slots
    endpoint.limits.footprint.sample(endpoint.gate, tickets)
    assert endpoint.chain_slots() == 4
    starting = Ticket(3)
    endpoint.arrive(starting)  # started, not asked yet: a typical request is promised it
    assert endpoint.blocker() == TOKEN_BUDGET  # 6,600 + 2 x 3,300 would pass 10,290
    starting.asked = True
    assert endpoint.blocker() == CHAIN_CAP

    endpoint.gate.outstanding = 8  # every request place taken: that is short first
    assert endpoint.blocker() == REQUEST_LIMIT
    endpoint.gate.hold("stopping")
    assert endpoint.blocker() == HELD


def test_a_started_chain_queued_for_tokens_is_named_before_the_budget() -> None:
    endpoint = adaptive_endpoint()
    budget = endpoint.limits.budget
    assert budget is not None
    ticket = Ticket(0)
    endpoint.arrive(ticket)

    async def scenario() -> str:
        async with endpoint.gate.slot(ticket, Claim(9_000)):
            waiter = asyncio.create_task(_one_more(endpoint, ticket))
            await asyncio.sleep(0)  # it queues: 9,000 + 3,000 is past the budget
            reason = endpoint.blocker()
        await waiter
        return reason

    assert asyncio.run(scenario()) == QUEUED


async def _one_more(endpoint: Server, ticket: Ticket) -> None:
    async with endpoint.gate.slot(ticket, Claim(3_000)):
        pass


def test_counts_become_shares_and_rows_follow_the_columns() -> None:
    record = HoldBack()
    record.note(0.0, CHAIN_CAP, {"tickers": 4, "chain_slots": 4})
    record.note(1.0, CHAIN_CAP, {"tickers": 4, "chain_slots": 4})
    record.note(2.5, ROOM, {"tickers": 4, "chain_slots": 5})
    record.note(3.0, TOKEN_BUDGET, {"tickers": 5, "chain_slots": 5})
    assert figures.held_back(record).model_dump() == {"readings": 4,
                                             "share": {CHAIN_CAP: 0.5, ROOM: 0.25,
                                                       TOKEN_BUDGET: 0.25}}
    row = dict(zip(COLUMNS, record.timeline[2], strict=True))
    assert row["t_s"] == 2.5 and row["blocker"] == ROOM and row["chain_slots"] == 5
    assert row["reserved"] is None  # a figure not given stays empty, not invented
    assert figures.held_back(HoldBack()).model_dump() == {"readings": 0, "share": {}}


def test_the_timeline_stops_growing_at_its_cap_but_counting_goes_on() -> None:
    record = HoldBack()
    for i in range(TIMELINE_MAX + 10):
        record.note(float(i), ROOM, {})
    assert len(record.timeline) == TIMELINE_MAX
    assert figures.held_back(record).readings == TIMELINE_MAX + 10


def test_a_batch_counts_readings_only_while_tickers_wait_to_start() -> None:
    # 12 chains of 5 calls on a cache that fits about 4: tickers wait to start for most of
    # the batch, and the record says for what. Once the last ticker has started, readings
    # are not counted (nothing waits to start), so there are fewer than readings taken.
    server = SimServer(12_000)
    scheduler = over_one_server(server, Strategy.parse("adaptive:tail=off"), gauges=server)
    server.budget = scheduler.endpoints.first.limits.budget

    def chain(key: str) -> Job:
        async def run(gated: TickerClient) -> None:
            for step in range(5):
                await gated.send(CallTag(1, key, f"n{step}", 0), body(8_000 + step * 1_600, 400))
        return Job(key, run, requests=5, chain=5)

    # A job that fails raises here.
    asyncio.run(reading(server, scheduler.run([chain(f"T{i}") for i in range(12)])))
    adaptive = figures.admission(scheduler.endpoints, scheduler.strategy).adaptive
    assert adaptive is not None
    held = adaptive.new_tickers_held_back
    assert held.readings > 0
    assert set(held.share) <= {ROOM, QUEUED, TOKEN_BUDGET, CHAIN_CAP, REQUEST_LIMIT}
    # The cache, not the request places, is what is short here.
    short = {k: v for k, v in held.share.items() if k != ROOM}
    assert short and max(short, key=short.__getitem__) in {QUEUED, TOKEN_BUDGET, CHAIN_CAP}
    assert scheduler.endpoints.first.limits.budget is not None
    assert held.readings < scheduler.endpoints.first.limits.budget.readings
    rows = figures.holdback_timeline(scheduler.endpoints)
    assert rows.columns == list(COLUMNS)
    (timeline,) = rows.endpoints.values()
    assert len(timeline) == held.readings
    assert all(r[COLUMNS.index("tickers")] <= 12 for r in timeline)
    # Seconds from the batch's start, in order: the rows line up with its intervals.
    times = [r[COLUMNS.index("t_s")] for r in timeline]
    assert times == sorted(times) and 0 <= times[0] < times[-1]
