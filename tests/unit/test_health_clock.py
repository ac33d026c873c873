"""Server health on an injected clock: the grace, failover's states and the outage budget.

The batches of test_endpoints.py and test_resume.py show the same rules end to end against
fake servers, on the real clock; here the clock is the test's, so each boundary is checked
exactly (just under, just over) and nothing sleeps.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import pytest

from app.config import load_settings
from app.errors import ServerOutage
from app.traffic.gate import Gate
from app.traffic.halt import Halt
from app.traffic.outage import ServerWatch
from app.traffic.server import MIN_FAILED_READS, Server, ServerSet
from app.traffic.strategy import Strategy
from tests.fakevllm import FakeServer

GRACE_S = 10.0
BUDGET_S = 30.0


class Clock:
    """A clock that moves only when the test moves it."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Reads:
    """What a /metrics sampler says of a server's health: failed reads in a row, and when."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.failed_in_a_row = 0
        self.last_ok_at: float | None = clock()
        self.last_failed_at: float | None = None

    def ok(self) -> None:
        self.failed_in_a_row, self.last_ok_at = 0, self.clock()

    def fail(self) -> None:
        self.failed_in_a_row += 1
        self.last_failed_at = self.clock()


def fleet(clock: Clock, size: int = 2) -> tuple[ServerSet, list[Reads], Halt]:
    """Return ``size`` servers judged on ``clock``, their reads, and the batch's halt."""
    settings = load_settings()
    reads = [Reads(clock) for _ in range(size)]
    changed = asyncio.Event()
    servers = [Server(i, f"http://gpu{i}.test:8000/v1", SimpleNamespace(settings=settings),
                      Strategy.parse("fixed-2"), gauges=reads[i], changed=changed,
                      grace_s=GRACE_S)  # type: ignore[arg-type]
               for i in range(size)]
    halt = Halt()
    return (ServerSet(servers, changed, halt=halt, outage_budget_s=BUDGET_S, clock=clock),
            reads, halt)


def fail_for(clock: Clock, reads: list[Reads], seconds: float, step_s: float = 1.0) -> None:
    """Let ``seconds`` pass with every read of ``reads`` failing, one read per ``step_s``."""
    end = clock.now + seconds
    while clock.now < end:
        clock.now = min(end, clock.now + step_s)
        for r in reads:
            r.fail()


async def test_a_server_is_down_only_once_its_reads_failed_for_the_grace() -> None:
    clock = Clock()
    servers, reads, _ = fleet(clock)
    health = servers.health_event()
    fail_for(clock, reads[:1], GRACE_S - 0.5)
    servers.judge_all(clock())
    assert servers.first.up and not health.is_set()  # just under the grace: still up
    fail_for(clock, reads[:1], 0.5)
    servers.judge_all(clock())
    assert not servers.first.up and servers.first.outages == 1 and health.is_set()
    assert servers.alternative(servers.first) is servers.endpoints[1]  # its tickers go there
    reads[0].ok()
    servers.judge_all(clock())
    assert servers.first.up and servers.first.outages == 1


async def test_one_failed_read_is_no_outage_however_long_the_silence() -> None:
    clock = Clock()
    servers, reads, _ = fleet(clock)
    clock.now += 10 * GRACE_S
    for _ in range(MIN_FAILED_READS - 1):
        reads[0].fail()
    servers.judge_all(clock())
    assert servers.first.up


async def test_every_server_down_past_the_budget_halts_the_batch_once() -> None:
    clock = Clock()
    servers, reads, halt = fleet(clock)
    fail_for(clock, reads, GRACE_S)
    servers.judge_all(clock())
    assert not any(s.up for s in servers) and servers.all_down_since == clock()
    fail_for(clock, reads, BUDGET_S)  # exactly the budget: not past it
    servers.judge_all(clock())
    assert halt.reason is None and not servers.gave_up.is_set()
    fail_for(clock, reads, 0.5)
    servers.judge_all(clock())
    assert halt.reason is not None and servers.gave_up.is_set()
    assert halt.reason.status == "interrupted" and halt.reason.exit_code == ServerOutage.exit_code
    assert f"none of the 2 LLM endpoints answered for {BUDGET_S:.0f} s" in halt.reason.message


async def test_a_server_back_within_the_budget_restarts_the_outage_clock() -> None:
    clock = Clock()
    servers, reads, halt = fleet(clock)
    fail_for(clock, reads, GRACE_S)
    servers.judge_all(clock())
    fail_for(clock, reads, BUDGET_S - 1)
    reads[1].ok()
    servers.judge_all(clock())
    assert servers.all_down_since is None and servers.endpoints[1].up
    # Down together again: the budget counts from this second outage, not the first.
    fail_for(clock, reads, GRACE_S + BUDGET_S - 1)
    servers.judge_all(clock())
    assert halt.reason is None and not any(s.up for s in servers)


def refusing() -> httpx.AsyncClient:
    """Return a client of a server that is down: every request refused."""
    server = FakeServer()
    server.crash()
    return server.client()


async def test_one_server_that_does_not_answer_holds_its_gate_then_halts_past_the_budget(
        ) -> None:
    clock, halt, gate = Clock(), Halt(), Gate(4)
    async with refusing() as client:
        watch = ServerWatch("http://llm.test:8000/v1", budget_s=BUDGET_S, interval_s=1.0,
                            halt=halt, gate=gate, client=client, clock=clock)
        await watch._probe_fresh()
        assert not watch.up.is_set() and gate.held and len(watch.outages) == 1
        clock.now += BUDGET_S  # exactly the budget: still waiting for it
        await watch._probe_fresh()
        assert halt.reason is None and not watch.gave_up.is_set()
        clock.now += 0.5
        await watch._probe_fresh()
        assert watch.gave_up.is_set() and halt.reason is not None
        assert halt.reason.exit_code == ServerOutage.exit_code
        assert "did not answer for 30 s" in halt.reason.message
        assert watch.outages[0]["seconds"] == BUDGET_S + 0.5
        with pytest.raises(ServerOutage):
            await watch.confirm()  # a call that failed now ends: the batch stops
    assert gate.held  # nothing new went to the server meanwhile


async def test_a_refused_connection_is_sent_again_though_the_reads_never_saw_the_server_away(
) -> None:
    # A loaded client's reader can miss a short restart: every read before and after the call
    # succeeded. A call that reached the server and failed is its own failure; one that could
    # not connect says the server was away, so it goes out again rather than failing its ticker.
    clock = Clock()
    servers, reads, _ = fleet(clock)
    for r in reads:
        r.read = asyncio.Event()  # type: ignore[attr-defined]  # the sampler's "a read ended"

    async def judged(reached: bool) -> object:
        started = clock()
        verdict = asyncio.create_task(
            servers.after_failure(servers.endpoints[0], started, reached=reached))
        await asyncio.sleep(0)  # it waits for the endpoint's next read
        clock.now += 0.5
        for r in reads:
            r.ok()  # read after the failure: up, and no read failed at all
            r.read.set()  # type: ignore[attr-defined]
        return await verdict

    again = await judged(reached=False)
    assert isinstance(again, Server) and again.up
    assert await judged(reached=True) is None
