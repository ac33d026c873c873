"""Server health on an injected clock: the one rule, failover's states and the outage budget.

The batches of traffic/test_server.py and batch/test_engine_resume.py show the same rules end to
end against fake servers; here readings are pushed by the test and the clock is the test's, so each
boundary is checked exactly (just under, just over) and nothing sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from agents.chat import CallTag, ChatResult
from agents.fitting import Measure, PromptSize, fixed
from app.config import load_settings
from app.errors import LLMConnectionError, LLMError, LLMHTTPError, ServerOutage
from app.llm import Ask, Call
from app.traffic.client import EndpointGone, TickerClient
from app.traffic.halt import Halt
from app.traffic.server import MIN_FAILED_READS, Server, ServerSet
from app.traffic.strategy import Strategy
from app.traffic.ticket import Ticket
from tests.unit.support.servers import Unread

BUDGET_S = 30.0


class Clock:
    """A clock that moves only when the test moves it."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Reads(Unread):
    """A /metrics reader the test drives: each ``ok``/``fail`` gives its server one reading."""

    def __init__(self) -> None:
        self.push: Any = None  # the server's ``reading``, wired by ``fleet``
        self.latest = None
        self.answers = True  # what a reading asked for (``Server.check``) finds

    def ok(self) -> None:
        self.push(SimpleNamespace())

    def fail(self) -> None:
        self.push(None)

    async def read(self) -> SimpleNamespace | None:
        return SimpleNamespace() if self.answers else None

    async def store(self, *_: Any) -> None:
        """Keep no row."""


def fleet(clock: Clock, size: int = 2) -> tuple[ServerSet, list[Reads], Halt]:
    """Return ``size`` servers judged on ``clock``, their readers, and the batch's halt."""
    settings = load_settings()
    reads = [Reads() for _ in range(size)]
    changed = asyncio.Event()
    llm: Any = SimpleNamespace(settings=settings, asked=True)  # its served model read
    servers = [Server(i, f"http://gpu{i}.test:8000/v1", llm, Strategy.parse("fixed-2"),
                      gauges=reads[i], changed=changed, clock=clock)
               for i in range(size)]
    for read, server in zip(reads, servers, strict=True):
        read.push = server.reading
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


async def test_a_server_is_down_at_its_second_failed_reading_in_a_row() -> None:
    clock = Clock()
    servers, reads, _ = fleet(clock)
    health = servers.health_event()
    # Counted, not MIN_FAILED_READS - 1: the rule is the documented two, whatever the constant.
    fail_for(clock, reads[:1], 1)
    assert servers.first.up and not health.is_set()  # one short: still up
    fail_for(clock, reads[:1], 1)
    assert not servers.first.up and servers.first.outages == 1 and health.is_set()
    assert servers.first.gate.held  # nothing new goes to it
    assert servers.alternative(servers.first) is servers.endpoints[1]  # its tickers go there
    clock.now += 4
    reads[0].ok()
    assert servers.first.up and not servers.first.gate.held
    assert servers.first.outages_seen[0]["seconds"] == 4.0


async def test_one_failed_read_is_no_outage_however_long_the_silence() -> None:
    clock = Clock()
    servers, reads, _ = fleet(clock)
    clock.now += 1000
    reads[0].fail()
    assert servers.first.up


async def test_a_call_fault_and_one_failed_reading_make_a_server_down_at_once() -> None:
    clock = Clock()
    servers, reads, halt = fleet(clock, size=1)
    reads[0].answers = False
    # A call met a server fault.
    confirmed = asyncio.create_task(servers.after_failure(servers.first, clock()))
    await asyncio.sleep(0)
    assert not servers.first.up and servers.first.gate.held and not confirmed.done()
    clock.now += 5
    reads[0].ok()  # back: the call goes on
    await asyncio.wait_for(confirmed, 1)
    assert servers.first.outages_seen[0]["seconds"] == 5.0 and halt.reason is None


async def test_every_server_down_past_the_budget_halts_the_batch_once() -> None:
    clock = Clock()
    servers, reads, halt = fleet(clock)
    fail_for(clock, reads, MIN_FAILED_READS)
    assert not any(s.up for s in servers) and servers.all_down_since == clock()
    fail_for(clock, reads, BUDGET_S)  # exactly the budget: not past it
    assert halt.reason is None and not servers.gave_up.is_set()
    fail_for(clock, reads, 0.5)
    assert halt.reason is not None and servers.gave_up.is_set()
    assert halt.reason.status == "interrupted" and halt.reason.exit_code == ServerOutage.exit_code
    assert f"none of the 2 LLM endpoints answered for {BUDGET_S:.0f} s" in halt.reason.message


async def test_a_server_back_within_the_budget_restarts_the_outage_clock() -> None:
    clock = Clock()
    servers, reads, halt = fleet(clock)
    fail_for(clock, reads, MIN_FAILED_READS)
    fail_for(clock, reads, BUDGET_S - 1)
    reads[1].ok()
    assert servers.all_down_since is None and servers.endpoints[1].up
    # Down together again: the budget counts from this second outage, not the first.
    fail_for(clock, reads, MIN_FAILED_READS + BUDGET_S - 1)
    assert halt.reason is None and not any(s.up for s in servers)


async def test_one_server_that_does_not_answer_holds_its_gate_then_halts_past_the_budget(
        ) -> None:
    clock = Clock()
    servers, reads, halt = fleet(clock, size=1)
    server = servers.first
    reads[0].answers = False
    fail_for(clock, reads, MIN_FAILED_READS)
    assert not server.up and server.gate.held and server.outages == 1
    fail_for(clock, reads, BUDGET_S)  # exactly the budget: still waiting for it
    assert halt.reason is None and not servers.gave_up.is_set()
    fail_for(clock, reads, 0.5)
    assert servers.gave_up.is_set() and halt.reason is not None
    assert halt.reason.exit_code == ServerOutage.exit_code
    assert "did not answer for 30 s" in halt.reason.message
    assert server.outages_seen[0]["seconds"] == BUDGET_S + 0.5
    with pytest.raises(ServerOutage):
        await servers.after_failure(server, clock())  # a call that failed now ends
    assert server.gate.held  # nothing new went to the server meanwhile


async def test_a_refused_connection_is_sent_again_though_the_reads_never_saw_the_server_away(
) -> None:
    # A loaded client's reader can miss a short restart: every read before and after the call
    # succeeded. A call that reached the server and failed is its own failure; one that could
    # not connect says the server was away, so it goes out again rather than failing its ticker.
    clock = Clock()
    servers, _, _ = fleet(clock)
    started = clock()
    clock.now += 0.5
    again = await servers.after_failure(servers.endpoints[0], started, reached=False)
    assert isinstance(again, Server) and again.up
    assert await servers.after_failure(servers.endpoints[0], started, reached=True) is None


MESSAGES = [{"role": "user", "content": "count me"}]
SIZE = PromptSize(70, 90)
TAG = CallTag(1, "EMBR", "market_analyst")


class Counts:
    """A server's client for one call: its prompt counter (``PromptCounter.size``) raises
    each of ``errors`` in turn, as its last try would, then counts; the call's fit
    (``TrackedLLM.fitted``) counts the prompt once, keeping what it got (``sized``), and its
    attempt answers at once."""

    def __init__(self, *errors: LLMError) -> None:
        self.errors = list(errors)
        self.tries = 0
        self.sized: list[PromptSize | None] = []
        self.asked = True  # its served model read (TrackedLLM.other_model)
        self.settings, self.endpoint = load_settings(), "http://gpu.test:8000/v1"

    async def size(self, messages: Any, *, max_tokens: int, exact: bool = False) -> PromptSize:
        self.tries += 1
        if self.errors:
            raise self.errors.pop(0)
        return SIZE

    async def fitted(self, tag: CallTag, ask: Ask, measure: Measure) -> tuple[Any, None]:
        self.sized.append(await measure(MESSAGES, max_tokens=ask.max_tokens, exact=True))
        return {"model": "m"}, None

    async def attempt(self, tag: CallTag, call: Call, body: Any, **_: Any) -> ChatResult:
        call.attempts += 1
        return ChatResult("fine", 10, 2, None, "stop", None, attempts=call.attempts)


def counting(servers: ServerSet, counts: Counts) -> asyncio.Task[ChatResult]:
    """Start a ticker's call on the first server, whose client is ``counts``: its prompt is
    counted there first, as part of the call."""
    servers.first.llm = counts  # type: ignore[assignment]
    client = TickerClient(servers, servers.first, Ticket(0))
    return asyncio.create_task(client.chat(TAG, fixed(MESSAGES), max_tokens=10))


def refused() -> LLMError:
    return LLMConnectionError("cannot reach the server to count tokens")


def unavailable() -> LLMError:
    return LLMHTTPError("/tokenize answered 503", http_status=503)


async def test_a_count_whose_server_stays_away_past_the_budget_ends_in_an_outage() -> None:
    clock = Clock()
    servers, reads, halt = fleet(clock, size=1)
    reads[0].answers = False
    counts = Counts(*[unavailable() for _ in range(9)])
    count = counting(servers, counts)
    await asyncio.sleep(0)
    assert not servers.first.up and not count.done()  # the count waits for its server
    fail_for(clock, reads, BUDGET_S + 0.5)
    with pytest.raises(ServerOutage):
        await asyncio.wait_for(count, 1)
    assert counts.tries == 1 and counts.sized == [] and halt.reason is not None


@pytest.mark.parametrize("error", [unavailable, refused])
async def test_a_count_whose_server_comes_back_is_counted_there(error: Any) -> None:
    clock = Clock()
    servers, reads, halt = fleet(clock, size=1)
    reads[0].answers = False
    counts = Counts(error())
    count = counting(servers, counts)
    await asyncio.sleep(0)
    assert not servers.first.up and not count.done()
    clock.now += 5
    reads[0].ok()  # back within the budget
    assert (await asyncio.wait_for(count, 1)).content == "fine"
    assert counts.tries == 2 and counts.sized == [SIZE] and halt.reason is None


@pytest.mark.parametrize("error", [
    unavailable,  # a server fault, but the reading it asks for finds the server up
    lambda: LLMHTTPError("/tokenize answered 400", http_status=400),  # the request's own
])
async def test_a_count_that_fails_on_a_server_that_is_up_is_given_up(error: Any) -> None:
    clock = Clock()
    servers, _, halt = fleet(clock, size=1)
    counts = Counts(error())
    assert (await asyncio.wait_for(counting(servers, counts), 1)).content == "fine"
    assert counts.sized == [None]  # uncounted: the prompt went out as it is
    assert counts.tries == 1 and servers.first.up and halt.reason is None


class Flapping(Counts):
    """A prompt counter whose count takes its server down as it fails, and brings the other
    server back: a count goes round the fleet for as long as it is let."""

    def __init__(self, reads: list[Reads], index: int, tries: list[int]) -> None:
        super().__init__()
        self.reads, self.index, self.all_tries = reads, index, tries

    async def size(self, messages: Any, *, max_tokens: int, exact: bool = False) -> PromptSize:
        self.all_tries.append(self.index)
        other = self.reads[1 - self.index]
        other.answers = True
        other.ok()
        self.reads[self.index].answers = False
        raise unavailable()


async def test_a_count_its_servers_keep_failing_fails_like_a_call_past_its_cap() -> None:
    # Past two sends an endpoint a call raises (the cap); its prompt count returned None
    # there, and the prompt went out untrimmed: one too long then failed its ticker as the
    # ticker's own fault (context_length), never resumed, though the servers were to blame.
    clock = Clock()
    servers, reads, halt = fleet(clock)
    tries: list[int] = []
    for server in servers:
        server.llm = Flapping(reads, server.index, tries)  # type: ignore[assignment]
    client = TickerClient(servers, servers.first, Ticket(0))
    with pytest.raises(LLMHTTPError):
        await asyncio.wait_for(client.chat(TAG, fixed(MESSAGES), max_tokens=10), 1)
    assert tries == [0, 1, 0, 1] and halt.reason is None  # twice on each endpoint


class Sends:
    """A server's one-attempt sender (``TrackedLLM.attempt``): the attempt counts as made
    when it goes out, then waits for ``answer``."""

    def __init__(self, settings: Any, name: str) -> None:
        self.settings, self.endpoint = settings, name
        self.sent = 0
        self.answer = asyncio.Event()

    async def attempt(self, tag: CallTag, call: Call, body: Any, **_: Any) -> ChatResult:
        call.attempts += 1
        self.sent += 1
        await self.answer.wait()
        return ChatResult("fine", 10, 2, None, "stop", None, attempts=call.attempts)


def sending(servers: ServerSet) -> tuple[TickerClient, list[Sends], asyncio.Task[ChatResult]]:
    """Start one call of a ticker on the first server, each server's sender a ``Sends``."""
    senders = []
    for server in servers:
        server.llm = sender = Sends(server.llm.settings, server.name)  # type: ignore[assignment]
        senders.append(sender)
    client = TickerClient(servers, servers.first, Ticket(0))
    return client, senders, asyncio.create_task(client.send(TAG, {"model": "m"}))


async def settled(done: Callable[[], bool]) -> None:
    """Let the loop run until ``done`` holds (a move is a few loop turns)."""
    for _ in range(200):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError("the call did not get there")


async def hand_over(servers: ServerSet, reads: list[Reads], clock: Clock,
                    frm: int, to: int) -> None:
    """Bring server ``to`` back, then take server ``frm`` down: never both away."""
    reads[to].answers = True
    clock.now += 1
    reads[to].ok()
    reads[frm].answers = False
    fail_for(clock, reads[frm:frm + 1], MIN_FAILED_READS)
    assert servers.endpoints[to].up and not servers.endpoints[frm].up


async def test_a_call_waiting_at_its_gate_follows_every_restart_within_the_budget() -> None:
    # A rolling restart, twice round a two-server fleet and once more, while a call waits at
    # its gate (every place taken by other calls): never sent, it cannot be what took the
    # servers down, so it must not run out of moves.
    clock = Clock()
    servers, reads, halt = fleet(clock)
    async with contextlib.AsyncExitStack() as others:
        full = {}
        for server in servers:
            full[server.index] = stack = contextlib.AsyncExitStack()
            await others.enter_async_context(stack)
            server.gate.set_limit(1)
            await stack.enter_async_context(server.gate.slot())
        client, senders, call = sending(servers)
        here = 0
        for _ in range(5):
            await settled(lambda at=here: servers.endpoints[at].gate.waiting == 1)
            await hand_over(servers, reads, clock, here, 1 - here)
            here = 1 - here
        await settled(lambda: servers.endpoints[here].gate.waiting == 1)
        assert not call.done() and sum(s.sent for s in senders) == 0
        senders[here].answer.set()
        await full[here].aclose()  # a place frees up where the call waits
        result = await asyncio.wait_for(call, 1)
    assert result.content == "fine" and result.attempts == 1 and halt.reason is None
    assert senders[here].sent == 1 and client.server is servers.endpoints[here]


async def test_a_call_in_flight_each_time_its_server_goes_down_is_sent_twice_an_endpoint(
) -> None:
    # What the cap is for: a request that takes down every server it is sent to.
    clock = Clock()
    servers, reads, halt = fleet(clock)
    client, senders, call = sending(servers)
    here, sent = 0, 0
    while not call.done():
        await settled(lambda had=sent: call.done() or sum(s.sent for s in senders) > had)
        if call.done():
            break
        sent += 1
        await hand_over(servers, reads, clock, here, 1 - here)
        here = 1 - here
        await settled(lambda at=here: call.done() or client.server is servers.endpoints[at])
    with pytest.raises(EndpointGone):
        call.result()
    assert sent == 2 * len(servers.endpoints) and halt.reason is None
