"""The scheduler's strategies and its tail rule, with a client that only records and waits."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Engine

from agents.chat import CallTag
from app.config import load_settings
from app.errors import InputError
from app.llm import TrackedLLM, backoff_delay
from app.traffic.client import TickerClient
from app.traffic.gate import priority
from app.traffic.scheduler import Job
from app.traffic.strategy import Strategy
from app.traffic.ticket import Ticket
from app.usage import UsageRecorder
from tests.fakevllm import BASE_URL, FakeServer, Reply
from tests.unit.support.call_rows import new_batch
from tests.unit.support.servers import ask, one_server, over_one_server


class RecordingLLM:
    """Stands in for TrackedLLM: every request takes ``delay_s`` and is logged in order."""

    def __init__(self, delay_s: float = 0.005) -> None:
        self.settings = SimpleNamespace(calls=SimpleNamespace(max_concurrency=64))
        self.delay_s = delay_s
        self.events: list[tuple[str, str, int | None]] = []  # (event, ticker, priority)

    async def attempt(self, tag: CallTag, call: Any, body: dict[str, Any], *,
                      priority: int | None = None, ready_at: Any = None,
                      trimmed: Any = None) -> None:
        # Called with the gate's place held, as TrackedLLM's attempt is.
        self.events.append(("start", tag.ticker, priority))
        await asyncio.sleep(self.delay_s)
        self.events.append(("end", tag.ticker, priority))


def chain_job(key: str, length: int) -> Job:
    async def run(gated: TickerClient) -> None:
        for step in range(length):
            await gated.send(CallTag(1, key, f"n{step}", 0), {})
    return Job(key, run, requests=length, chain=length)


async def _run(strategy: str, jobs: list[Job]) -> RecordingLLM:
    llm = RecordingLLM()
    scheduler = over_one_server(llm, Strategy.parse(strategy))

    await scheduler.run(jobs)  # a job that fails raises here
    assert scheduler.left == 0
    return llm


def _first_start(events: list[tuple[str, str, int | None]], ticker: str) -> int:
    return next(i for i, (e, t, _) in enumerate(events) if e == "start" and t == ticker)


def _last_end(events: list[tuple[str, str, int | None]], ticker: str) -> int:
    return max(i for i, (e, t, _) in enumerate(events) if e == "end" and t == ticker)


async def test_without_the_tail_rule_started_tickers_finish_before_new_ones_start() -> None:
    # Gate limit 4 (the policy's initial), six chains of five: the last two start only when
    # a place frees, which is after the first tickers are done. That is the long tail.
    events = (await _run("adaptive:tail=off", [chain_job(f"T{i}", 5) for i in range(6)])).events
    assert _first_start(events, "T4") > _last_end(events, "T0")
    assert {p for _, t, p in events if t == "T0"} == {0}  # start order is the priority


async def test_tail_rule_starts_tickers_whose_chain_would_outlast_the_batch_early() -> None:
    events = (await _run("adaptive", [chain_job(f"T{i}", 5) for i in range(6)])).events
    # 30 requests over 4 places is 7.5 rounds: once what is left over 4 is no more than a
    # chain of five, T4 and T5 are urgent: they start before any ticker is done, and go
    # first with a negative priority (the server serves lower values first).
    finished_first = min(_last_end(events, f"T{i}") for i in range(4))
    assert _first_start(events, "T4") < finished_first
    assert _first_start(events, "T5") < finished_first
    assert min(p for _, t, p in events if t == "T5" and p is not None) < 0
    # Early on nothing was urgent: the first requests went by start order.
    assert [p for e, _, p in events[:4]] == [0, 1, 2, 3]


async def test_the_tail_rule_marks_tickets_urgent_and_the_gate_serves_them_first() -> None:
    scheduler = over_one_server(RecordingLLM(), Strategy.parse("adaptive"))
    scheduler.endpoints.first.gate.set_limit(10)
    calm, senior_long, long_, short, unknown = (Ticket(0, 17, 5), Ticket(1, 17, 14),
                                                Ticket(2, 17, 14), Ticket(3, 17, 12), Ticket(5))
    near, below = Ticket(6, 9, 9), Ticket(7, 8, 8)
    for ticket in (calm, senior_long, long_, short, unknown, near, below):
        scheduler.endpoints.first.arrive(ticket)
    scheduler._unstarted = 100 - 4 * 17 - 9 - 8
    # Ten rounds left, less the round a ticker passed over at the gate waits: a chain of
    # nine or more is urgent.
    assert scheduler.left == 100
    assert scheduler._mark_tail()
    assert near.urgent and not below.urgent
    assert not calm.urgent and priority(calm) == 0
    ranks = [priority(t) for t in (senior_long, long_, short)]
    assert ranks == sorted(ranks) and all(r < 0 for r in ranks)
    assert not unknown.urgent  # nothing known of a ticker's work: never urgent
    assert not scheduler._mark_tail()  # nothing changed since
    # Fixed-N arms keep the seeds' behaviour: start order only.
    events = (await _run("fixed-2", [chain_job(f"T{i}", 3) for i in range(4)])).events
    assert {p for _, _, p in events} == {0, 1, 2, 3}


def test_ticket_remaining_chain_never_exceeds_what_is_left() -> None:
    ticket = Ticket(0, requests=17, chain=14)
    assert ticket.remaining_chain == 14
    ticket.done = 4  # the four analysts: thirteen one after another remain
    assert ticket.remaining_chain == 13
    ticket.done = 20  # decision retries went over the estimate
    assert ticket.remaining == 0 and ticket.remaining_chain == 0


def test_strategy_knobs_parse_and_bad_ones_are_refused() -> None:
    s = Strategy.parse("adaptive:kv_high=0.95,queue_allowance=0,tail=off")
    assert s.adaptive and not s.tail
    policy = s.admission_policy(maximum=32)
    assert (policy.queue_allowance, policy.maximum) == (0, 32)
    budget = s.token_budget()  # kv_high is the token budget's knob: it guards the KV cache
    assert budget is not None and budget.kv_high == 0.95
    assert not hasattr(policy, "kv_high")
    assert Strategy.parse("adaptive").tail
    # Every strategy takes the tail rule as a knob (off unless asked, but adaptive's).
    assert not Strategy.parse("fixed-3").tail and Strategy.parse("fixed-3:tail=on").tail
    fixed = Strategy.parse("fixed-15:tail=on")
    assert (fixed.tickers_in_flight, fixed.adaptive, fixed.prefetch) == (15, False, False)
    # fixed-N prefetches when asked: its N tickers are N chains.
    ahead = Strategy.parse("fixed-15:prefetch=on,tail=on")
    assert (ahead.tickers_in_flight, ahead.prefetch, ahead.tail) == (15, True, True)
    assert Strategy.parse("fixed-all:tail=on").tail
    assert Strategy.parse("sequential:tail=on").request_limit == 1
    # budget=on|off and kv_full are knobs no more: the budget is always on, the policy has
    # no KV rule.
    for bad in ("adaptive:kv_high=lots", "adaptive:speed=2", "adaptive:tail=maybe",
                "adaptive:budget=off", "adaptive:budget=on", "adaptive:kv_full=0.97",
                "fixed-all:prefetch=on", "sequential:prefetch=on", "fixed-3:fill=0.9",
                "sequential:initial=2",
                "fixed-3:tail=maybe", "fixed-0", "fixed-0:tail=on", "turbo",
                # One name per strategy: no leading zeros, no other digits than ASCII's.
                "fixed-01", "fixed-007:tail=on", "fixed-\u0661"):
        with pytest.raises(InputError):
            Strategy.parse(bad)


async def test_adaptive_starts_what_its_gate_has_room_for_without_waiting_for_each_ask(
        ) -> None:
    # Tickers slow to reach their first request (a graph to build, data to load): the gate
    # (limit 4) counts one promised request for each started ticker that has not asked, so
    # four start in one pass, before any asks, and the fifth waits for room.
    scheduler = over_one_server(RecordingLLM(), Strategy.parse("adaptive:tail=off"))
    go = asyncio.Event()
    begun: list[str] = []

    def slow_job(key: str) -> Job:
        async def run(gated: TickerClient) -> None:
            begun.append(key)
            await go.wait()
            await gated.send(CallTag(1, key, "n0", 0), {})
        return Job(key, run, requests=1, chain=1)

    # A job that fails raises at the wait_for below.
    running = asyncio.ensure_future(scheduler.run([slow_job(f"T{i}") for i in range(6)]))
    await asyncio.sleep(0.05)
    server = scheduler.endpoints.first
    assert begun == ["T0", "T1", "T2", "T3"]
    assert server.starting == 4 and not server.load(None).room
    assert server.blocker() == "request limit"
    go.set()
    await asyncio.wait_for(running, 5)
    assert sorted(begun) == [f"T{i}" for i in range(6)] and scheduler.left == 0


async def test_a_ticker_waiting_for_room_starts_once_marked_urgent_and_none_once_stopping(
        ) -> None:
    servers = one_server(RecordingLLM(), Strategy.parse("adaptive"))
    gate = servers.first.gate
    gate.set_limit(1)
    async with gate.slot(Ticket(0)):  # every place taken: no room for a new ticker
        ticket = Ticket(1, requests=5, chain=5)
        waiting = asyncio.ensure_future(servers.wait_for_room(ticket=ticket, unstarted=5))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        ticket.urgent = True  # what the scheduler's tail rule does, then wakes the waiters
        servers.changed.set()
        assert await asyncio.wait_for(waiting, 1) is servers.first
        waiting = asyncio.ensure_future(servers.wait_for_room(ticket=Ticket(2, 5, 5)))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        servers.stopping = True  # Scheduler.stop: no ticker starts any more
        servers.changed.set()
        assert await asyncio.wait_for(waiting, 1) is None


async def test_a_retrying_call_frees_its_admission_slot_while_it_backs_off(
        sqlite_engine: Engine) -> None:
    # One place at the gate; A's first attempt fails with a 500, B waits for the place.
    # While A sleeps before its retry the place is B's: the server sees A, B, then A again.
    fake = FakeServer(lambda chat: Reply(status=500) if (chat.key, chat.attempt) == ("A?", 1)
                      else None)
    settings = load_settings(llm_base_url=BASE_URL, retry_backoff_s=0.05,
                             check_context_length=False)
    batch_id = new_batch(sqlite_engine)
    async with fake.client() as http, UsageRecorder(sqlite_engine) as recorder:
        llm = TrackedLLM(settings, recorder, http_client=http)
        # sequential: one request at a time, the gate's limit 1
        servers = one_server(llm, Strategy.parse("sequential"))
        gate = servers.first.gate

        async with asyncio.TaskGroup() as tg:
            tg.create_task(ask(servers, batch_id, "A", 0))
            tg.create_task(ask(servers, batch_id, "B", 1))
    assert [(c.key, c.attempt) for c in fake.chats] == [("A?", 1), ("B?", 1), ("A?", 2)]
    assert gate.outstanding == 0


def test_retry_backoff_is_full_jitter_under_an_exponential_cap() -> None:
    rng = random.Random(7)
    for retry in range(4):
        cap = 0.5 * 2 ** retry
        delays = [backoff_delay(0.5, retry, rng) for _ in range(400)]
        assert all(0.0 <= d <= cap for d in delays)
        # Spread over the whole range, not one fixed value: retries of calls that failed
        # together (a server restart) must not all come back at the same instant.
        assert min(delays) < 0.1 * cap and max(delays) > 0.9 * cap


async def test_a_call_queued_before_its_ticker_turned_urgent_goes_first_once_marked() -> None:
    # A gate of two places, both held; a young ticker's call queues, then a senior's, which
    # goes ahead by start order. Then the work left shrinks and the tail rule marks the young
    # one urgent: its call, queued under its start order, moves ahead (at 100 tickers an
    # endpoint the young tickers' calls had waited behind the seniors' to the end).
    scheduler = over_one_server(RecordingLLM(), Strategy.parse("adaptive"))
    gate = scheduler.endpoints.first.gate
    gate.set_limit(2)
    holders = [Ticket(i, 14, 14, done=14) for i in range(2)]
    senior, young = Ticket(2, 14, 14, done=13), Ticket(3, 14, 14, done=2)
    for ticket in (*holders, senior, young):
        scheduler.endpoints.first.arrive(ticket)
    scheduler._unstarted = 100
    scheduler._mark_tail()
    assert not senior.urgent and not young.urgent
    served: list[int] = []

    async def call(ticket: Ticket) -> None:
        async with gate.slot(ticket):
            served.append(ticket.order)

    async with gate.slot(holders[0]), gate.slot(holders[1]):
        calls = [asyncio.create_task(call(young)), asyncio.create_task(call(senior))]
        await asyncio.sleep(0)
        assert gate.waiting == 2
        scheduler._unstarted = 0  # 13 requests left over two places: the young one's 12
        assert scheduler._mark_tail() and young.urgent and not senior.urgent
    await asyncio.gather(*calls)
    assert served == [3, 2]


@pytest.mark.parametrize(("name", "says"), [
    # A knob's value outside what its setting can mean, caught when the name is read (before
    # a bench's first arm or a night's first ticker), not when the policy is first built.
    ("adaptive:initial=-3", "initial"), ("adaptive:initial=0", "initial"),
    ("adaptive:minimum=0", "minimum"), ("adaptive:queue_allowance=-1", "queue_allowance"),
    ("adaptive:backoff=1.5", "backoff"), ("adaptive:kv_high=2", "kv_high"),
    ("adaptive:fill=0", "fill"), ("adaptive:out_quantile=1.2", "out_quantile"),
    ("adaptive:min_samples=0", "min_samples"), ("adaptive:rise_after=0", "rise_after"),
    ("adaptive:calm=-1", "calm"),
    # A count written with a fraction would be cut to a whole one without a word.
    ("adaptive:initial=2.5", "initial"), ("adaptive:maximum=1e400", "maximum"),
    ("adaptive:initial=nan", "initial"), ("adaptive:initial=inf", "initial"),
    ("adaptive:kv_high=nan", "kv_high"),
    # Said twice, only the last would count; a colon with no knob names nothing.
    ("adaptive:tail=on,tail=off", "tail"), ("fixed-15:tail=on,tail=off", "tail"),
    ("adaptive:", "no knob"), ("fixed-15:", "no knob"),
])
def test_a_knob_value_its_setting_cannot_take_is_refused_by_name(name: str, says: str) -> None:
    with pytest.raises(InputError, match=says) as refused:
        Strategy.parse(name)
    assert name in str(refused.value) and "\n" not in str(refused.value)


def test_knob_values_at_their_limits_still_parse() -> None:
    for name in ("adaptive:queue_allowance=0", "adaptive:calm=0", "adaptive:kv_high=1",
                 "adaptive:fill=1", "adaptive:initial=1,minimum=1", "adaptive:initial=8.0"):
        assert Strategy.parse(name).adaptive
    assert Strategy.parse("adaptive:initial=8.0").admission_policy(maximum=64).initial == 8
