"""Choose an endpoint for a ticker: the pure rule on loads whose answer is known, and the
endpoint set that applies it while a ticker waits."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

from app.traffic.budget import Claim
from app.traffic.client import TickerClient
from app.traffic.routing import Load, choose, under_share
from app.traffic.server import Server, ServerSet
from app.traffic.strategy import Strategy
from app.traffic.ticket import Ticket
from tests.unit.support.servers import Unread


def load(index: int, *, up: bool = True, room: bool = True, tokens: int | None = 1_000,
         requests: int = 4, tickers: int = 0) -> Load:
    return Load(index, up, room, tokens, requests, tickers)


def test_the_most_free_budget_tokens_win() -> None:
    assert choose([load(0, tokens=5_000), load(1, tokens=9_000), load(2, tokens=7_000)]) == 1


def test_a_larger_replica_with_more_free_tokens_wins_over_fewer_tickers() -> None:
    busy_big = load(0, tokens=40_000, tickers=6)
    idle_small = load(1, tokens=10_000, tickers=0)
    assert choose([busy_big, idle_small]) == 0


def test_without_every_budget_known_free_request_places_decide() -> None:
    # Server 0 reports no KV capacity: tokens cannot be compared, request places can.
    assert choose([load(0, tokens=None, requests=9), load(1, tokens=50_000, requests=2)]) == 0


def test_ties_go_to_fewer_tickers_then_to_the_list_order() -> None:
    assert choose([load(0, tickers=3), load(1, tickers=1)]) == 1
    assert choose([load(0), load(1)]) == 0


def test_an_endpoint_without_room_is_passed_over_unless_room_is_not_needed() -> None:
    loads = [load(0, room=False, tokens=9_000), load(1, tokens=1_000)]
    assert choose(loads) == 1
    assert choose(loads, need_room=False) == 0
    assert choose([load(0, room=False), load(1, room=False)]) is None


def test_a_down_endpoint_gets_no_ticker_while_another_is_up() -> None:
    loads = [load(0, up=False, tokens=90_000), load(1, tokens=1_000)]
    assert choose(loads) == 1
    # ... even when the one that is up has no room: the ticker waits for it.
    assert choose([load(0, up=False), load(1, room=False)]) is None


def test_when_all_are_down_they_all_qualify_as_one_down_server_did() -> None:
    loads = [load(0, up=False, tokens=1_000), load(1, up=False, tokens=2_000)]
    assert choose(loads) == 1
    # A moved chain never goes from one down endpoint to another.
    assert choose(loads, need_room=False, exclude=1, down_if_all=False) is None


def test_a_moved_ticker_goes_to_the_best_other_endpoint_that_is_up() -> None:
    loads = [load(0, tokens=90_000), load(1, tokens=1_000), load(2, up=False, tokens=50_000)]
    assert choose(loads, need_room=False, exclude=0, down_if_all=False) == 1


def worked(index: int, work: int, *, room: bool = True, weight: float = 1.0,
           tokens: int = 1_000) -> Load:
    return Load(index, True, room, tokens, 4, 0, work, weight)


def test_early_in_a_batch_the_fair_share_never_binds() -> None:
    # 1,000 requests left, most not started: both shares are 500, far above either load.
    loads = [worked(0, 180, tokens=9_000), worked(1, 20, tokens=1_000)]
    assert choose(loads, total_work=1_000) == 0  # free tokens decide, as without the rule


def test_near_the_end_an_endpoint_over_its_share_gets_no_new_ticker() -> None:
    # The two H200 run's tail: 257 requests routed to one replica, 49 to the other, 17
    # not started. Shares are 161.5 each: the emptier replica takes the ticker even with
    # fewer free tokens, and when it has no room the ticker waits for it.
    loads = [worked(0, 257, tokens=40_000), worked(1, 49, tokens=5_000)]
    assert choose(loads, total_work=257 + 49 + 17) == 1
    full = [worked(0, 257, tokens=40_000), worked(1, 49, room=False)]
    assert choose(full, total_work=323) is None
    # A ticker that must start (the tail rule) still goes to the one under its share.
    assert choose(full, need_room=False, total_work=323) == 1


def test_shares_follow_kv_capacity() -> None:
    # A replica with three times the cache may hold three times the work.
    big, small = worked(0, 200, weight=3.0), worked(1, 20, weight=1.0)
    assert under_share([big, small], 300) == [big, small]  # 200 < 225 and 20 < 75
    assert under_share([big, small], 260) == [small]  # 200 >= 195


def test_some_endpoint_is_always_under_its_share() -> None:
    # Work routed is less than all the work left (the new ticker is in it), so the shares
    # always leave someone: the batch can wait for room, never for ever.
    for works in ([0, 0], [10, 0], [50, 49], [300, 1], [7, 7, 7]):
        loads = [worked(i, w, weight=1.0 + i) for i, w in enumerate(works)]
        assert under_share(loads, sum(works) + 1)


def test_one_endpoint_is_never_held_back_by_its_share() -> None:
    assert choose([worked(0, 500)], total_work=501) == 0


async def test_a_ticker_waits_for_the_endpoint_under_its_share_to_have_room() -> None:
    changed = asyncio.Event()
    llm: Any = SimpleNamespace(settings=SimpleNamespace(calls=SimpleNamespace(max_concurrency=2)))
    strategy = Strategy.parse("adaptive")
    busy, drained = (Server(i, f"http://gpu{i}.test/v1", llm, strategy, changed=changed)
                     for i in range(2))
    endpoints = ServerSet([busy, drained], changed)
    # Three tickers on one replica with 15 calls left each, one on the other with 2 left.
    for order in range(3):
        busy.arrive(Ticket(order, requests=17, chain=13, done=2))
    last = Ticket(3, requests=17, chain=13, done=15)
    drained.arrive(last)
    assert (busy.work, drained.work) == (45, 2)
    # The drained replica's two request places are taken; the busy one has room.
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(drained.gate.limit):
            await stack.enter_async_context(drained.gate.slot())
        assert busy.gate.has_room() and not drained.gate.has_room()
        waiting = asyncio.ensure_future(endpoints.wait_for_room(unstarted=17))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # 45 is over the busy replica's share of 64: it waits
    # The places come free: the ticker goes to the replica that will finish first.
    assert await asyncio.wait_for(waiting, timeout=1) is drained
    drained.leave(last)
    assert (drained.tickers, drained.work) == (0, 0)


async def test_a_ticker_that_moves_leaves_no_hold_in_the_budget_it_left() -> None:
    # Between two calls a ticker keeps its last call's tokens as a hold in its server's
    # budget (app/traffic/gate.py). The gate keeps the hold per ticker; when the ticker
    # moves, its client releases it there, so the server it left can start a new ticker.
    changed = asyncio.Event()
    llm: Any = SimpleNamespace(settings=SimpleNamespace(calls=SimpleNamespace(max_concurrency=8)))
    strategy = Strategy.parse("adaptive")
    left, taken = (Server(i, f"http://gpu{i}.test/v1", llm, strategy, gauges=Unread(),
                          changed=changed) for i in range(2))
    servers = ServerSet([left, taken], changed)
    budget = left.limits.budget
    assert budget is not None
    budget.set_capacity(10_000, 16)
    client = TickerClient(servers, left, Ticket(0, requests=3, chain=3))
    async with left.gate.slot(client.ticket, Claim(800)):
        pass
    assert (budget.held, left.gate.holds, client.ticket.hold) == (800, {0: 800}, 800)
    left.up = False  # its server went down: the ticker's next call goes elsewhere
    assert client._here() is taken
    assert (budget.held, left.gate.holds, client.ticket.hold) == (0, {}, 0)
    client.close()
    assert not taken.gate.holds and taken.tickers == 0


def test_the_tickers_of_a_server_gone_down_spread_over_the_others() -> None:
    # They all move at once, before any has reserved tokens where it went: by free tokens
    # alone every one would go to the server with the most. Each move counts its ticker's
    # work where it went, so the shares of the work routed spread them.
    changed = asyncio.Event()
    llm: Any = SimpleNamespace(settings=SimpleNamespace(calls=SimpleNamespace(max_concurrency=8)))
    strategy = Strategy.parse("adaptive")
    endpoints = [Server(i, f"http://gpu{i}.test/v1", llm, strategy, gauges=Unread(),
                        changed=changed) for i in range(4)]
    servers = ServerSet(endpoints, changed)
    for server, capacity in zip(endpoints, (10_000, 10_200, 10_400, 10_600), strict=True):
        assert server.limits.budget is not None
        server.limits.budget.set_capacity(capacity, 16)
    clients = [TickerClient(servers, server, Ticket(4 * i + server.index, requests=14, chain=14))
               for i in range(12) for server in endpoints]
    dead = endpoints[3]
    dead.up = False
    for client in clients:
        client._here()
    moved = [server.moved_in for server in endpoints[:3]]
    assert sum(moved) == 12 and dead.tickers == 0
    assert min(moved) >= 3, moved  # each took a share; by free tokens alone: [0, 0, 12]
    assert [server.tickers for server in endpoints[:3]] == [12 + m for m in moved]
