"""Run whole batches over two fake endpoints: one slower, one restarting, one going away.

The engine, scheduler, gates, budgets, readers and the ticker clients are the product's
own; the two servers are the one fake (``FakeServers`` routes by host), scripted so the
right answer is known: every ticker succeeds exactly once, every node has exactly one
answered row, and each row names the endpoint that served it. Outages run on the batch's
injected clock (``ReadClock``): it moves only when a server refuses a /metrics reading, and
a crashed server comes back after so much of it, so no test waits out a timer.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, select

from agents.data.demo import DEMO_AS_OF, demo_tickers
from agents.data.snapshot import SnapshotProvider
from agents.graph import node_names
from app.batch.engine import BatchEngine, BatchOutcome, BatchPlan, TickerWork
from app.config import load_settings
from app.db.models import Decision, LLMCall, ServerSample, TickerRun
from app.errors import (
    ContextLengthError,
    LLMError,
    LLMHTTPError,
    LLMMalformedError,
    LLMStreamError,
)
from app.recorder.figures import EndpointSummary
from app.recorder.record import Recorder
from app.runs.checkpoints import Checkpoints
from app.runs.replay import WorkItem, Workload, play, shape
from app.runs.resumable import find_resumable
from app.traffic.client import TickerClient, server_fault
from tests.fakevllm import ChatRequest, FakeServer, FakeServers, Reply

FAST, SLOW = "http://gpu0.test:8000/v1", "http://gpu1.test:8001/v1"
TICKERS = 10
pytestmark = pytest.mark.demo_tickers(TICKERS)
STEP_S = 0.5  # the injected clock's move per /metrics reading a server refused


class ReadClock:
    """The batch's health clock here: ``STEP_S`` per refused /metrics reading, nothing else.

    ``later`` runs an action (a crashed server's revival) once the clock has moved so far.
    """

    def __init__(self) -> None:
        self.now = 0.0
        self._due: list[tuple[float, Any]] = []

    def __call__(self) -> float:
        return self.now

    def later(self, seconds: float, action: Any) -> None:
        self._due.append((self.now + seconds, action))

    def client(self, servers: FakeServers) -> httpx.AsyncClient:
        """Return a client to ``servers`` whose refused /metrics readings move this clock."""
        inner = servers.transport()

        async def handle(request: httpx.Request) -> httpx.Response:
            try:
                return await inner.handle_async_request(request)
            except httpx.ConnectError:
                if request.url.path.endswith("/metrics"):
                    self.now += STEP_S
                    for due in [d for d in self._due if d[0] <= self.now]:
                        self._due.remove(due)
                        due[1]()
                raise

        return httpx.AsyncClient(transport=httpx.MockTransport(handle))


def fake(script: Any = None, **kwargs: Any) -> FakeServer:
    return FakeServer(script, nodes=node_names(load_settings().pipeline()),
                      tickers=demo_tickers(TICKERS), samples=range(1), **kwargs)


def paced(delay_s: float) -> Any:
    """Return a script answering the default reply at ``delay_s`` per token."""
    def script(chat: ChatRequest) -> Reply:
        if chat.structured:
            return Reply('{"rating": "Hold", "score": 0.0, "confidence": 0.5, '
                         '"summary": "Fake decision."}', token_delay_s=delay_s)
        return Reply(f"[{chat.node} on {chat.ticker}] fake analysis, evidence mixed.",
                     token_delay_s=delay_s)
    return script


async def run(engine: Engine, demo_dir: Path, servers: FakeServers,
              strategy: str = "adaptive", clock: ReadClock | None = None,
              record: Recorder | None = None, **overrides: Any) -> BatchOutcome:
    settings = load_settings(llm_base_url=servers.base_urls, check_context_length=False,
                             retry_backoff_s=0, metrics_interval_s=0.05,
                             server_probe_interval_s=0.05, **overrides)
    clock = clock or ReadClock()
    runner = BatchEngine(settings, engine, http_client=clock.client(servers),
                         provider=SnapshotProvider(demo_dir), clock=clock,
                         checkpoints=Checkpoints(settings.store.database_url, engine))
    return await runner.run(BatchPlan("nightly", DEMO_AS_OF, demo_tickers(TICKERS),
                                      strategy=strategy), recording=record)


def rows(engine: Engine, batch_id: int) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(LLMCall.ticker, LLMCall.node, LLMCall.call_id,
                                        LLMCall.attempt, LLMCall.status, LLMCall.endpoint)
                                 .where(LLMCall.batch_id == batch_id)))


def assert_every_ticker_once(engine: Engine, outcome: BatchOutcome,
                             servers: FakeServers) -> list[Any]:
    """Check nothing was lost or doubled; return the batch's call rows."""
    tickers = demo_tickers(TICKERS)
    assert outcome.status == "succeeded" and not outcome.failed
    assert sorted(outcome.succeeded) == sorted(tickers)
    with engine.connect() as conn:
        decided = Counter(conn.execute(select(Decision.ticker)
                                       .where(Decision.batch_id == outcome.batch_id)).scalars())
    assert decided == dict.fromkeys(tickers, 1)
    calls = rows(engine, outcome.batch_id)
    answered = Counter((r.ticker, r.node) for r in calls if r.status == "ok")
    nodes = node_names(load_settings().pipeline())
    assert answered == {(t, n): 1 for t in tickers for n in nodes}
    # Every row names its endpoint, and each endpoint's answered rows are what it served.
    assert {r.endpoint for r in calls} <= set(servers.servers)
    for url, server in servers.servers.items():
        assert sum(1 for r in calls if r.status == "ok" and r.endpoint == url) == \
            len(server.served())
    return calls


def endpoints(record: Recorder) -> dict[str, EndpointSummary]:
    """Return each endpoint's summary from a batch of several endpoints."""
    assert record.admission is not None and record.admission.endpoints is not None
    return record.admission.endpoints


def chains(calls: list[Any]) -> dict[str, set[str]]:
    """Return the endpoints each ticker's answered calls went to."""
    where: dict[str, set[str]] = defaultdict(set)
    for r in calls:
        if r.status == "ok":
            where[r.ticker].add(r.endpoint)
    return where


def chain_workload(tickers: int) -> Workload:
    """Build tickers shaped like the graph, small: four calls at once, then a chain of six."""
    prompt = "x" * 2_000  # ~500 fake tokens: a few tickers fill a 6,000-token KV cache
    load: Workload = {}
    for t in range(tickers):
        items = [WorkItem(f"T{t:02d}", 0, f"a{i}", {
            "model": "fake-model", "max_tokens": 16,
            "messages": [{"role": "user", "content": f"T{t} a{i} {prompt}"}]})
            for i in range(4)]
        for i in range(6):
            items.append(WorkItem(f"T{t:02d}", 0, f"c{i}", {
                "model": "fake-model", "max_tokens": 16,
                "messages": [{"role": "user", "content": f"T{t} c{i} {prompt}"}]},
                deps=[f"a{k}" for k in range(4)] if i == 0 else [f"c{i - 1}"]))
        load[f"T{t:02d}"] = items
    return load


def tokens_at(delay_s: float) -> Any:
    return lambda chat: Reply(" tok" * 10, completion_tokens=10, token_delay_s=delay_s)


@pytest.mark.slow
async def test_the_slower_endpoint_gets_fewer_tickers_and_each_chain_stays_on_one(
        sqlite_engine: Engine) -> None:
    # KV room for a few tickers each: tickers wait for free budget tokens, and the fast
    # endpoint (1 ms a call) frees its tokens two hundred times as often as the slow one.
    servers = FakeServers({FAST: FakeServer(tokens_at(0.0001), kv_tokens=6_000),
                           SLOW: FakeServer(tokens_at(0.02), kv_tokens=6_000)})
    load = chain_workload(24)
    settings = load_settings(llm_base_url=servers.base_urls, check_context_length=False,
                             retry_backoff_s=0, metrics_interval_s=0.05, record_requests=False)

    async def work(ticker: str, gated: TickerClient, batch_id: int) -> list[object]:
        return await play(load[ticker], gated, batch_id)

    runner = BatchEngine(settings, sqlite_engine, http_client=servers.client())
    outcome = await runner.run(
        BatchPlan("bench", DEMO_AS_OF, sorted(load), 1, "adaptive"),
        TickerWork(work, shapes={t: shape(items) for t, items in load.items()}),
        record := Recorder())
    assert outcome.status == "succeeded" and sorted(outcome.succeeded) == sorted(load)
    calls = rows(sqlite_engine, outcome.batch_id)
    assert Counter((r.ticker, r.node) for r in calls if r.status == "ok") == {
        (t, i.node): 1 for t, items in load.items() for i in items}
    started = {url: e.tickers_started for url, e in endpoints(record).items()}
    assert started[FAST] > started[SLOW] >= 1, started
    assert sum(started.values()) == len(load)
    # A ticker's whole chain went to one endpoint: its prefix stays in one cache.
    where = chains(calls)
    assert all(len(urls) == 1 for urls in where.values())
    assert Counter(next(iter(urls)) for urls in where.values()) == Counter(started)
    for url, server in servers.servers.items():
        assert len(server.served()) == sum(1 for r in calls if r.endpoint == url)
    # Both endpoints' /metrics were sampled, each series under its own name.
    with sqlite_engine.connect() as conn:
        sampled = set(conn.execute(select(ServerSample.endpoint)
                                   .where(ServerSample.batch_id == outcome.batch_id)).scalars())
    assert sampled == {FAST, SLOW}


@pytest.mark.slow
async def test_an_endpoint_that_goes_away_hands_its_tickers_to_the_other(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    never = asyncio.Event()  # a request the dying server holds: it hangs, never refuses
    gone = fake(kv_tokens=60_000)

    def dying(chat: ChatRequest) -> Reply | None:
        if chat.index == 12:
            gone.crash()
        if chat.index in (10, 11):
            return Reply("held", hold=never)  # in flight when the server goes away
        return Reply(f"[{chat.node}] fine.", token_delay_s=0.002) if not chat.structured \
            else None

    gone.script = dying
    servers = FakeServers({FAST: fake(paced(0.002), kv_tokens=60_000), SLOW: gone})
    outcome = await run(sqlite_engine, demo_dir, servers, record=(record := Recorder()))
    calls = assert_every_ticker_once(sqlite_engine, outcome, servers)
    moved = [t for t, urls in chains(calls).items() if urls == {FAST, SLOW}]
    assert moved, "the tickers under way on the endpoint that went away moved"
    # After it went away no call reached it: all went to the other endpoint.
    assert len(gone.chats) == 13
    summary = endpoints(record)
    assert summary[SLOW].up is False and summary[SLOW].outages == 1
    assert summary[SLOW].tickers_moved_out == summary[FAST].tickers_moved_in >= len(moved)
    # The held calls were cancelled (their rows say so) and answered again elsewhere: the
    # same call, its attempts numbered on from the cancelled one.
    held = [r for r in calls if r.endpoint == SLOW and r.status == "error"
            and (r.ticker, r.node) in {(c.ticker, c.node) for c in gone.chats[10:12]}]
    assert len(held) == 2
    for r in held:
        again = [c for c in calls if (c.call_id, c.status) == (r.call_id, "ok")]
        assert again[0].endpoint == FAST and again[0].attempt == r.attempt + 1


@pytest.mark.slow
@pytest.mark.parametrize(("outage_s", "outages"), [
    (10 * STEP_S, 1),  # its tickers move, then it takes new ones
    (2 * STEP_S, 1),  # two refused readings: down as well (one rule); its cut calls go again
])
async def test_an_endpoint_that_restarts_loses_no_ticker_and_takes_work_again(
        sqlite_engine: Engine, demo_dir: Path, outage_s: float, outages: int) -> None:
    restarting = fake(kv_tokens=60_000)
    revived_at: list[int] = []
    clock = ReadClock()

    def back() -> None:
        restarting.revive()
        revived_at.append(len(restarting.chats))

    def restart(chat: ChatRequest) -> Reply:
        if chat.index == 8:
            restarting.crash()
            clock.later(outage_s, back)
        return Reply(f"[{chat.node}] fine.", token_delay_s=0.003) if not chat.structured \
            else Reply('{"rating": "Hold", "score": 0.0, "confidence": 0.5, '
                       '"summary": "Fake decision."}', token_delay_s=0.003)

    restarting.script = restart
    servers = FakeServers({FAST: fake(paced(0.003), kv_tokens=60_000), SLOW: restarting})
    # Two tickers per endpoint at a time: tickers are still waiting when it comes back.
    outcome = await run(sqlite_engine, demo_dir, servers, strategy="fixed-2", clock=clock,
                        record=(record := Recorder()))
    calls = assert_every_ticker_once(sqlite_engine, outcome, servers)
    summary = endpoints(record)
    assert summary[SLOW].outages == outages and summary[SLOW].up is True
    # Calls cut by the restart were answered again: the same call, at a later attempt.
    cut = [r for r in calls if r.status == "error"]
    assert cut
    assert all(any((c.call_id, c.status) == (r.call_id, "ok") and c.attempt > r.attempt
                   for c in calls) for r in cut)
    assert revived_at, "the restarted server came back during the batch"
    # After its restart it took tickers again and answered their calls.
    after = [c for c in restarting.chats[revived_at[0]:] if c.completed]
    assert after
    assert summary[SLOW].tickers_started > 2
    assert any(urls == {SLOW} for urls in chains(calls).values())


async def test_a_requests_own_failure_on_a_healthy_endpoint_fails_as_it_always_did(
        sqlite_engine: Engine) -> None:
    # One request answers HTTP 500 every time while both servers' /metrics stay fine: the
    # failure is the request's, so it is not sent elsewhere and its ticker fails.
    def script(chat: ChatRequest) -> Reply:
        if chat.messages[-1]["content"].startswith("T3 c2 "):
            return Reply(status=500, error="bad request body")
        return Reply(" tok" * 10, completion_tokens=10, token_delay_s=0.0005)

    servers = FakeServers({FAST: FakeServer(script), SLOW: FakeServer(script)})
    load = chain_workload(6)
    settings = load_settings(llm_base_url=servers.base_urls, check_context_length=False,
                             retry_backoff_s=0, metrics_interval_s=0.05, record_requests=False)

    async def work(ticker: str, gated: TickerClient, batch_id: int) -> list[object]:
        return await play(load[ticker], gated, batch_id)

    outcome = await BatchEngine(settings, sqlite_engine, http_client=servers.client()).run(
        BatchPlan("bench", DEMO_AS_OF, sorted(load), 1, "adaptive"),
        TickerWork(work, shapes={t: shape(items) for t, items in load.items()}),
        record := Recorder())
    assert set(outcome.failed) == {"T03"} and len(outcome.succeeded) == 5
    failed = [r for r in rows(sqlite_engine, outcome.batch_id) if r.node == "c2"
              and r.ticker == "T03"]
    # The client's own retries, all at one endpoint, numbered 1..max_attempts as always.
    assert sorted(r.attempt for r in failed) == list(range(1, settings.calls.max_attempts + 1))
    assert len({r.endpoint for r in failed}) == 1
    assert all(e.tickers_moved_in == 0 for e in endpoints(record).values())


def both_crash_at(servers: dict[str, FakeServer], index: int, back_after_s: float | None,
                  clock: ReadClock) -> None:
    """Script every server to answer, until a server's call ``index`` (each counts its own)
    takes all of them down together, the first being up; back (restarted) ``back_after_s``
    later on ``clock``, or never (None). A server slow to reach ``index`` crashes them again."""
    first = next(iter(servers.values()))

    def script(chat: ChatRequest) -> Reply | None:
        if chat.index == index and not first.down:
            for server in servers.values():
                server.crash()
            if back_after_s is not None:
                for server in servers.values():
                    clock.later(back_after_s, server.revive)
        return None if chat.structured else Reply(f"[{chat.node}] fine.", token_delay_s=0.002)

    for server in servers.values():
        server.script = script


@pytest.mark.slow
async def test_every_endpoint_down_for_less_than_the_budget_loses_no_ticker(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    fleet, clock = {FAST: fake(kv_tokens=60_000), SLOW: fake(kv_tokens=60_000)}, ReadClock()
    both_crash_at(fleet, 12, back_after_s=10 * STEP_S, clock=clock)
    servers = FakeServers(fleet)
    outcome = await run(sqlite_engine, demo_dir, servers, clock=clock, outage_budget_s=30.0,
                        record=(record := Recorder()))
    assert_every_ticker_once(sqlite_engine, outcome, servers)
    summary = endpoints(record)
    assert all(summary[url].outages >= 1 and summary[url].up for url in fleet)


@pytest.mark.slow
async def test_every_endpoint_down_past_the_budget_interrupts_the_batch_for_a_resume(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    fleet, clock = {FAST: fake(kv_tokens=60_000), SLOW: fake(kv_tokens=60_000)}, ReadClock()
    both_crash_at(fleet, 12, back_after_s=None, clock=clock)
    outcome = await run(sqlite_engine, demo_dir, FakeServers(fleet), clock=clock,
                        outage_budget_s=1.0)
    assert outcome.status == "interrupted" and not outcome.failed
    assert outcome.halt is not None and outcome.halt.exit_code == 5
    assert "none of the 2 LLM endpoints answered for 1 s" in outcome.halt.message
    with sqlite_engine.connect() as conn:
        runs = Counter(conn.execute(select(TickerRun.status)
                                    .where(TickerRun.batch_id == outcome.batch_id)).scalars())
    assert set(runs) <= {"interrupted", "succeeded"} and runs["interrupted"] > 0
    # Both back: the resume finishes what the outage stopped, every ticker once.
    healthy = FakeServers({FAST: fake(paced(0.002), kv_tokens=60_000),
                           SLOW: fake(paced(0.002), kv_tokens=60_000)})
    settings = load_settings(llm_base_url=healthy.base_urls, check_context_length=False,
                             retry_backoff_s=0, metrics_interval_s=0.05)
    resumed = await BatchEngine(settings, sqlite_engine, http_client=healthy.client(),
                                provider=SnapshotProvider(demo_dir),
                                checkpoints=Checkpoints(settings.store.database_url,
                                                        sqlite_engine)).run(
        find_resumable(sqlite_engine, outcome.batch_id, stale_s=120))
    assert resumed.status == "succeeded"
    with sqlite_engine.connect() as conn:
        decided = Counter(conn.execute(select(Decision.ticker)
                                       .where(Decision.batch_id == outcome.batch_id)).scalars())
    assert decided == dict.fromkeys(demo_tickers(TICKERS), 1)


@pytest.mark.parametrize(("error", "the_servers"), [
    (LLMMalformedError("malformed stream chunk from the server"), True),
    (LLMStreamError("stream ended without a finish reason"), True),
    (LLMHTTPError("HTTP 503", http_status=503), True),
    (LLMHTTPError("HTTP 400", http_status=400), False),
    (ContextLengthError("too long", http_status=400), False),
])
def test_a_malformed_answer_says_something_about_its_server(error: LLMError,
                                                            the_servers: bool) -> None:
    # What may move a call to another endpoint when its own goes away: a server's faults,
    # a malformed stream among them; never the request's own.
    assert server_fault(error) is the_servers
