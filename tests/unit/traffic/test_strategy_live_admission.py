"""Run the adaptive strategy through the real engine while the fake server's /metrics change.

The engine, scheduler, gate, admission policy and /metrics sampler are the product's own;
only the server is the fake, whose places and KV cache are set here, so what the policy
must do is known before the batch runs. One ticker asks for all its requests at once, so
more is always wanted than the policy allows until the last request is sent (no gaps while
a next ticker's rows are written): what reaches the fake is the policy's doing. Readings
every 50 ms keep each batch to about a second.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import date

from sqlalchemy import Engine, select

from app.batch.engine import BatchEngine, BatchPlan, TickerWork
from app.config import load_settings
from app.db.models import ServerSample
from app.runs.replay import WorkItem, Workload, play
from app.traffic.client import TickerClient
from tests.fakevllm import BASE_URL, ChatRequest, FakeServer, Reply
from tests.fakevllm.load import Moment, Scrape

INTERVAL_S = 0.05


@dataclass(frozen=True)
class Size:
    """Every request's size and pace at the fake: 10 tokens at 4 ms each."""

    prompt: int = 200
    output: int = 10
    token_delay_s: float = 0.004

    def reply(self, chat: ChatRequest) -> Reply:
        return Reply(" tok" * self.output, prompt_tokens=self.prompt,
                     completion_tokens=self.output, token_delay_s=self.token_delay_s,
                     chunks=2)


def wide(tickers: int, requests: int, pad: int = 0) -> Workload:
    """Build tickers whose requests wait for nothing: each asks for all its places at once
    (``pad`` more bytes of prompt each)."""
    return {f"T{t}": [WorkItem(f"T{t}", 0, f"n{i}", {
        "model": "fake-model", "max_tokens": 16,
        "messages": [{"role": "user", "content": f"T{t} request {i}" + "x" * pad}]})
        for i in range(requests)] for t in range(tickers)}


async def run_batch(engine: Engine, server: FakeServer, strategy: str, tickers: int = 1,
                    requests: int = 96, *, sampling: bool = True, pad: int = 0) -> int:
    """Run a wide workload through the engine under ``strategy``; return the batch id."""
    settings = load_settings(llm_base_url=BASE_URL, check_context_length=False,
                             retry_backoff_s=0, record_requests=False,
                             metrics_interval_s=INTERVAL_S)
    load = wide(tickers, requests, pad)

    async def work(ticker: str, gated: TickerClient, batch_id: int) -> list[object]:
        return await play(load[ticker], gated, batch_id)

    runner = BatchEngine(settings, engine, http_client=server.client(), sample_metrics=sampling)
    outcome = await runner.run(BatchPlan("bench", date.today(), sorted(load), 1, strategy,
                                         strategy), TickerWork(work))
    assert outcome.status == "succeeded" and not outcome.failed
    assert len(server.served()) == tickers * requests
    return outcome.batch_id


def window(server: FakeServer, after: float, bound: int) -> list[Moment]:
    """Return the fake's moments from when its in-flight count first fell to ``bound`` after
    ``after`` until the last request arrived (past it, nothing more is wanted)."""
    history = server.load.history
    start = next(m.at for m in history if m.at > after and m.in_flight <= bound)
    last_arrival = server.chats[-1].at
    return [m for m in history if start <= m.at <= last_arrival]


def scrapes_in(server: FakeServer, moments: list[Moment]) -> list[Scrape]:
    return [s for s in server.load.scrapes if moments[0].at < s.at <= moments[-1].at]


def mean_waiting(moments: list[Moment]) -> float:
    """Return the time-weighted mean of the fake's queue over the moments' span."""
    spans = [(b.at - a.at, a.waiting) for a, b in itertools.pairwise(moments)]
    total = sum(d for d, _ in spans)
    return sum(d * w for d, w in spans) / total if total else 0.0


def mean_in_flight(moments: list[Moment]) -> float:
    """Return the time-weighted mean of what the fake held, running or waiting."""
    spans = [(b.at - a.at, a.in_flight) for a, b in itertools.pairwise(moments)]
    total = sum(d for d, _ in spans)
    return sum(d * n for d, n in spans) / total if total else 0.0


async def test_a_queue_at_the_server_brings_the_limit_to_what_it_runs(
        sqlite_engine: Engine) -> None:
    # The fake runs 3 at a time. Started at 8, the policy must settle at the 3 running plus
    # its allowance of 1 waiting once it reads a longer queue.
    size = Size()
    server = FakeServer(size.reply, capacity=3)
    batch_id = await run_batch(sqlite_engine, server, "adaptive:initial=8,tail=off")
    assert server.load.max_waiting >= 8 - 3  # the limit of 8 really queued at the fake
    queued = next(s.at for s in server.load.scrapes if s.waiting > 1)
    settled = window(server, queued, 3 + 1)
    assert len(scrapes_in(server, settled)) >= 10
    # One more than the allowance may wait for a moment: a reading taken while a finished
    # request's successor is on its way shows no queue, and the policy probes one higher.
    assert max(m.in_flight for m in settled) <= 3 + 1 + 1
    assert 0.5 <= mean_waiting(settled) <= 1.3

    # Every reading the sampler took is a server_samples row holding the fake's values.
    with sqlite_engine.connect() as conn:
        rows = conn.execute(select(ServerSample.running, ServerSample.waiting,
                                   ServerSample.kv_cache_usage, ServerSample.preemptions_total,
                                   ServerSample.prompt_tokens_total,
                                   ServerSample.generation_tokens_total)
                            .where(ServerSample.batch_id == batch_id)
                            .order_by(ServerSample.sampled_at, ServerSample.id)).all()
    served = [(s.running, s.waiting, s.kv_cache_usage, s.preemptions_total,
               s.prompt_tokens_total, s.generation_tokens_total) for s in server.load.scrapes]
    assert [tuple(r) for r in rows] == served
    assert served[-1][4:] == (96 * size.prompt, 96 * size.output)


async def test_without_readings_the_same_batch_keeps_its_queue(sqlite_engine: Engine) -> None:
    # The control for the test above: with sampling off the limit stays at 8, so the fake
    # keeps up to 8 - 3 waiting until the last request is sent. The mean is 4-5 on an idle
    # machine and 3.6-3.8 on a loaded one (a finished request's successor arrives later);
    # the threshold stays clear of the 1.3 at most that the sampled run above may keep.
    server = FakeServer(Size().reply, capacity=3)
    await run_batch(sqlite_engine, server, "adaptive:initial=8,tail=off", sampling=False)
    assert server.load.max_waiting == 8 - 3
    assert mean_waiting(window(server, 0.0, 8)) >= 2.5


async def test_headroom_at_the_server_raises_the_limit(sqlite_engine: Engine) -> None:
    # Ample places and cache: starting at 2, the limit may only grow after readings that
    # show the server running all we send and nothing waiting; without readings it cannot.
    sampled = FakeServer(Size().reply, capacity=64)
    await run_batch(sqlite_engine, sampled, "adaptive:initial=2", requests=64)
    assert sampled.load.max_waiting == 0
    assert sampled.max_in_flight >= 16
    first_above = next(m.at for m in sampled.load.history if m.in_flight > 2)
    assert first_above > sampled.load.scrapes[0].at  # grown after a reading, not before
    blind = FakeServer(Size().reply, capacity=64)
    await run_batch(sqlite_engine, blind, "adaptive:initial=2", requests=64, sampling=False)
    assert blind.max_in_flight == 2


async def test_a_kv_cache_that_fits_four_is_held_by_the_token_budget(
        sqlite_engine: Engine) -> None:
    # Places for 64 but a cache of 256 blocks of 16 tokens: four answers of 1,000 + 10 tokens
    # fit (64 blocks each), more would wait. Prompts of 2,000 bytes are costed at about
    # 1,050 tokens (0.5 a byte, then the 1,000 the fake counts and a 5% margin) plus the
    # overhead and 16 to answer, and 95% of 4,096 may be reserved: three at a time, so the
    # cache never makes one wait. The request count has no KV rule: the budget, knowing
    # the capacity, alone holds the cache.
    size = Size(prompt=1000)
    server = FakeServer(size.reply, capacity=64, kv_tokens=256 * 16)
    await run_batch(sqlite_engine, server, "adaptive:tail=off", pad=2000)
    assert server.load.max_waiting == 0
    # Four at most: the starting request limit, before the first reading gave the capacity.
    assert server.max_in_flight <= 4


async def test_a_preemption_cuts_the_limit_then_it_grows_back(sqlite_engine: Engine) -> None:
    # The limit sits at its maximum of 8 on an ample server until the fake reports two
    # preemptions: it must fall to 8 x 0.7 = 5, then grow by one per reading with room.
    server = FakeServer(Size().reply, capacity=64)

    def preempt_midway(chat: ChatRequest) -> Reply:
        if chat.index == 30:
            server.preempt(2)
        return Size().reply(chat)

    server.script = preempt_midway
    await run_batch(sqlite_engine, server, "adaptive:initial=8,maximum=8,tail=off")
    assert server.max_in_flight == 8
    seen = next(s.at for s in server.load.scrapes if s.preemptions_total == 2)
    # Over the next three readings the limit is at most 5, 6, 7: under the 8 held before.
    cut = [m for m in server.load.history if seen <= m.at <= seen + 3 * INTERVAL_S]
    assert mean_in_flight(cut) <= 7
    later = [s.running for s in server.load.scrapes if seen < s.at < server.chats[-1].at]
    assert max(later) >= 7
