"""The KV token budget: scripted gauges and request sizes, checked against arithmetic done here.

How the budget's factor rises and falls is in test_budget_factor.py.
"""

from __future__ import annotations

import asyncio
import math
import re
from datetime import date
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import Engine

from app.batch.engine import BatchEngine, BatchOutcome, BatchPlan, TickerWork
from app.bench.workloads import synthetic_workload
from app.config import load_settings
from app.errors import InputError
from app.llm import CallStats
from app.recorder.figures import admission as admission_summary
from app.recorder.progress import BatchProgress
from app.recorder.record import Recorder
from app.runs.replay import play, shape
from app.traffic.budget import Claim, TokenBudget
from app.traffic.client import TickerClient
from app.traffic.gate import Gate
from app.traffic.sampler import MetricsSampler
from app.traffic.strategy import Strategy
from app.traffic.ticket import Ticket
from tests.fakevllm import FakeServer, Reply
from tests.unit.support import FIXTURES
from tests.unit.support.budget_sim import G, SimServer, blocks, body, run_sim
from tests.unit.support.servers import Unread, one_server, over_one_server

FIXTURE = FIXTURES / "vllm_metrics.txt"


def test_a_request_reserves_its_prompt_and_its_whole_max_output_in_blocks() -> None:
    budget = TokenBudget(capacity=10_000, block_size=16, tokens_per_byte=0.5)
    # 1,000 bytes at 0.5 tokens/byte, 8 template tokens per message + 8 for the reply,
    # 300 output tokens: 500 + 24 + 300 = 824, rounded up to 52 blocks of 16.
    assert budget.claim("bull", body(1000, 300)).tokens == 832 == blocks(500 + 24 + 300)


def test_long_outputs_cannot_overflow_the_cache_once_admitted() -> None:
    # A cache of 4,000 tokens; requests of 400 prompt bytes that will each grow to their
    # max_tokens of 600 after admission. The gate admits only what fits at full length.
    capacity, fill = 4_000, 0.95
    budget = TokenBudget(capacity=capacity, fill=fill, block_size=16, tokens_per_byte=0.5)
    gate = Gate(limit=64, budget=budget)
    cost = blocks(400 * 0.5 + 24 + 600)  # 832
    fit = int(capacity * fill) // cost  # 3,800 // 832 = 4
    admitted: list[int] = []

    async def scenario() -> None:
        release = asyncio.Event()

        async def one(i: int) -> None:
            c = Claim(budget.claim("analyst", body(400, 600)).tokens)
            async with gate.slot(Ticket(i, requests=1), c):
                admitted.append(i)
                await release.wait()

        tasks = [asyncio.create_task(one(i)) for i in range(8)]
        await asyncio.sleep(0.01)
        assert len(admitted) == fit
        assert gate.waiting == 8 - fit
        # Every admitted answer grows to its max: the tokens they can reach still fit,
        # counting each request's true prompt (here 100 tokens for 400 bytes) or the estimate.
        assert fit * cost <= capacity
        assert fit * blocks(100 + 24 + 600) <= capacity
        release.set()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())
    assert sorted(admitted) == list(range(8))
    assert budget.reserved == 0 and budget.held == 0


def test_the_output_reserved_becomes_a_high_quantile_of_what_the_node_produced() -> None:
    budget = TokenBudget(capacity=100_000, block_size=16, out_quantile=0.95, min_samples=5)
    outputs = [37 * i % 211 + 50 for i in range(1, 21)]  # twenty lengths, 50..260
    for n in outputs[:4]:
        budget.learn("trader", body(400, 1000), prompt_tokens=100, completion_tokens=n)
    # Four samples are too few: the whole max_tokens is reserved.
    assert budget.expected_output("trader", 1000) == 1000
    for n in outputs[4:]:
        budget.learn("trader", body(400, 1000), prompt_tokens=100, completion_tokens=n)
    q95 = int(np.percentile(outputs, 95, method="inverted_cdf"))
    assert budget.expected_output("trader", 1000) == q95
    assert budget.expected_output("trader", 120) == min(120, q95)  # never above max_tokens
    assert budget.expected_output("other_node", 700) == 700  # per node kind
    # Prompts: 100 tokens per 400 bytes seen, plus a 5% margin.
    assert budget.ratio() == 1.05 * 100 / 400
    assert budget.claim("trader", body(800, 1000)).tokens == blocks(
        math.ceil(800 * 1.05 * 100 / 400) + 24 + q95)


def test_the_default_start_factor_spends_the_prompts_margin_up_to_the_fill() -> None:
    # Prompts are costed 5% over the server's counts; the start factor 1.05 spends that
    # margin, so at the defaults the claims may total 0.98 x 1.05 of the cache: about 0.98
    # of it in the server's own tokens (0.95 / 1.05 = 0.90 before: a 500-ticker fleet of 5
    # simulated H200s then ran a round of calls more, docs/lab/2026-12-07-budget-margins.md).
    budget = TokenBudget(capacity=1_000_000, block_size=16)
    budget.learn("market", body(4_000, 100), prompt_tokens=1_000, completion_tokens=100)
    claim = budget.claim("bull", body(40_000, 0))  # 10,000 tokens as the server counts
    assert claim.tokens == blocks(math.ceil(40_000 * 1.05 * 0.25) + 24)
    admitted = 0
    while budget.fits(claim.tokens):
        budget.take(claim)
        admitted += 1
    assert budget.limit == int(1_000_000 * 0.98 * 1.05)
    assert 0.95 < admitted * 10_000 / 1_000_000 <= 0.98


def test_preemptions_shrink_the_budget_and_a_restart_starts_it_over() -> None:
    budget = TokenBudget(capacity=49_152, fill=0.95, overbook=1.0, backoff=0.8)
    full = 49_152 * 0.95
    # Preemptions and tokens since the last reading, as limits.py counts them.
    assert budget.observe(G()) == int(full)
    assert budget.observe(G(), preempted=2, generated=10) == int(full * 0.8)
    assert budget.reason == "2 preemptions"
    assert budget.observe(G(), generated=10) == int(full * 0.8)
    assert budget.observe(G(), preempted=1, generated=10) == int(full * 0.8 * 0.8)
    # Counters reset: the server restarted. The corrections start over...
    assert budget.observe(G(), restarted=True) == int(full)
    assert budget.reason == "server restarted"
    # ...and the next preemption counts again.
    assert budget.observe(G(), preempted=1, generated=4) == int(full * 0.8)


def test_kv_usage_above_the_estimate_scales_the_budget_down_then_eases_back() -> None:
    budget = TokenBudget(capacity=10_000, fill=0.9, overbook=1.0, block_size=16)
    budget.take(Claim(3_000))  # what we think is in the cache
    # The server says 50% of 10,000 = 5,000 tokens are used: requests are 5/3 as large.
    assert budget.observe(G(kv_cache_usage=0.5)) == int(10_000 * 0.9 * 3_000 / 5_000)
    assert budget.reason == "kv usage above the estimate"
    # Usage back within the estimate: a quarter of the way back per reading.
    correction = 3_000 / 5_000
    for _ in range(3):
        correction += 0.25 * (1 - correction)
        assert budget.observe(G(kv_cache_usage=0.2)) == int(10_000 * 0.9 * correction)


def test_a_reading_taken_before_a_release_does_not_count_as_an_underestimate() -> None:
    budget = TokenBudget(capacity=10_000, fill=0.9, overbook=1.0, block_size=16)
    budget.take(Claim(3_000))
    budget.take(Claim(2_000))
    budget.give_back(Claim(2_000), hold=False)  # finished after the server's page was read
    # 5,000 used is what was reserved when the page was read: no correction.
    assert budget.observe(G(kv_cache_usage=0.5)) == int(10_000 * 0.9)
    # The next reading still shows 5,000 for the 3,000 reserved since: that is real.
    assert budget.observe(G(kv_cache_usage=0.5)) == int(10_000 * 0.9 * 3_000 / 5_000)


def test_unknown_capacity_budgets_nothing() -> None:
    budget = TokenBudget(capacity=None)
    budget.take(Claim(10**9))
    assert budget.limit is None and budget.fits(10**9) and budget.room_for_new()
    assert budget.observe(G(kv_cache_usage=1.0, preemptions_total=4)) is None


def test_a_ticker_between_calls_holds_its_tokens_against_new_tickers_only() -> None:
    budget = TokenBudget(capacity=1_000, fill=1.0, block_size=16)
    gate = Gate(limit=64, budget=budget)
    senior = Ticket(0, requests=3, chain=3)

    async def scenario() -> None:
        async with gate.slot(senior, Claim(400)):
            assert budget.reserved == 400
        # One call done, two to go: its 400 tokens stay held for the next one.
        assert (budget.reserved, budget.held, senior.hold) == (0, 400, 400)
        assert budget.room_for_new()  # a typical request (400) fits beside the hold: 800
        budget.take(Claim(500))  # another ticker's request
        # A new ticker needs a typical request (450) beside the 500 reserved and 400 held.
        assert budget.typical_cost == (400 + 500) // 2
        assert not gate.has_room()
        # The senior's next call (larger: its prompt grew) takes its hold's place.
        async with gate.slot(senior, Claim(480)):
            assert (budget.reserved, budget.held, senior.hold) == (980, 0, 0)
        assert budget.held == 480  # one call still to go
        gate.drop_hold(senior)  # the ticker ended early: nothing held any more
        assert budget.held == 0 and senior.hold == 0

    asyncio.run(scenario())


def test_the_sampler_reads_the_kv_capacity_from_cache_config_info() -> None:
    text = FIXTURE.read_text()
    line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info"))
    blocks_label = int(re.search(r'num_gpu_blocks="(\d+)"', line).group(1))  # type: ignore[union-attr]
    size_label = int(re.search(r'block_size="(\d+)"', line).group(1))  # type: ignore[union-attr]

    async def read() -> MetricsSampler:
        transport = httpx.MockTransport(lambda request: httpx.Response(200, text=text))
        async with httpx.AsyncClient(transport=transport) as client:
            sampler = MetricsSampler("http://x/v1", None, None, interval_s=1, client=client)
            await sampler.read()
            return sampler

    sampler = asyncio.run(read())
    assert sampler.kv_capacity == blocks_label * size_label == 728 * 128
    assert sampler.block_size == size_label


def test_adaptive_fills_the_cache_without_a_preemption_where_a_fixed_setting_overflows() -> None:
    capacity = 6_400  # room for about six requests at full length (~900-1,300 tokens each)
    flooded, _ = run_sim("fixed-all", capacity)
    assert flooded.preemptions > 0  # the workload does overflow this cache when let loose
    server, scheduler = run_sim("adaptive", capacity)
    assert server.preemptions == 0
    assert server.peak_used <= capacity
    budget = scheduler.endpoints.first.limits.budget
    assert budget is not None and budget.capacity == capacity
    # The budget was used: reservations reached within one (largest) request of the limit.
    largest = blocks(math.ceil((2_000 + 4 * 400) * 0.5) + 24 + 400)
    assert server.peak_reserved >= capacity * 0.95 - 2 * largest
    assert budget.reserved == 0 and budget.held == 0  # everything given back
    # The batch's admission summary says what the budget learned: every answer was 400.
    adaptive = admission_summary(scheduler.endpoints, scheduler.strategy).adaptive
    assert adaptive is not None
    summary = adaptive.token_budget
    assert summary is not None and summary.kv_capacity_tokens == capacity
    assert summary.expected_output == {f"n{i}": 400 for i in range(5)}
    assert summary.tokens_per_byte == round(1.05 * 0.25, 4)


def test_adaptive_without_capacity_admits_by_request_count() -> None:
    # Adaptive always has a budget; not knowing the capacity it admits everything.
    unknown = Strategy.parse("adaptive").token_budget()
    assert unknown is not None and unknown.limit is None
    unknown.take(Claim(1_000_000))
    assert unknown.fits(1_000_000) and unknown.room_for_new()
    assert Strategy.parse("fixed-3").token_budget() is None  # a fixed count of tickers
    with pytest.raises(InputError, match="bad knob 'budget=off'"):  # a knob no more
        Strategy.parse("adaptive:budget=off")
    knobbed = Strategy.parse("adaptive:fill=0.9,overbook=1.2,budget_backoff=0.5,min_samples=3")
    budget = knobbed.token_budget()
    assert budget is not None
    assert (budget.fill, budget.overbook, budget.backoff, budget.min_samples) == (
        0.9, 1.2, 0.5, 3)
    # No gauges at all: no budget (it could never learn the capacity).
    llm = SimServer(1_000)
    assert over_one_server(llm, Strategy.parse("adaptive")).endpoints.first.limits.budget is None


async def _engine_run(sqlite_engine: Any, strategy: str, kv_tokens: int,
                      cache_config: bool = True
                      ) -> tuple[FakeServer, BatchOutcome, Recorder]:
    settings = load_settings(check_context_length=False, retry_backoff_s=0,
                             metrics_interval_s=0.02, record_requests=False)
    load = synthetic_workload(settings, 8, 0.05, output_scale=0.1)  # prompts 200-1000 words

    def answer(chat: Any) -> Reply:
        # Every answer runs to its max_tokens, as with ignore_eos: it grows after admission.
        n = chat.body["max_tokens"]
        return Reply("w " * n, completion_tokens=n, token_delay_s=0.0004, chunks=4)

    server = FakeServer(script=answer, capacity=64, kv_tokens=kv_tokens)
    server.load.cache_config = cache_config  # False: the capacity is not published
    runner = BatchEngine(settings, sqlite_engine, http_client=server.client())

    async def work(ticker: str, gated: TickerClient, batch_id: int) -> list[Any]:
        return await play(load[ticker], gated, batch_id)

    plan = BatchPlan("bench", date(2025, 1, 2), sorted(load), 1, strategy)
    record = Recorder()
    outcome = await runner.run(plan, TickerWork(work, shapes={t: shape(i)
                                                              for t, i in load.items()}),
                               record)
    return server, outcome, record


@pytest.mark.slow
async def test_through_the_engine_the_budget_learns_the_fake_servers_cache_and_never_overfills(
        sqlite_engine: Any) -> None:
    # The fake admits a request only when its whole answer fits in its KV cache; what does
    # not fit waits in its queue. 4,096 tokens hold a few of this workload's requests
    # (~250-1,250 prompt tokens and 150 output each).
    kv_tokens = 4_096
    loose, loose_outcome, _ = await _engine_run(sqlite_engine, "fixed-all", kv_tokens)
    assert loose_outcome.status == "succeeded"
    assert loose.load.max_waiting > 0  # let loose, the workload outgrows the cache
    # Without the capacity published, counting requests lets requests in that then wait
    # for room.
    counted, _, counted_record = await _engine_run(sqlite_engine, "adaptive", kv_tokens,
                                                 cache_config=False)
    assert counted.load.max_waiting > 0
    assert counted_record.admission is not None and counted_record.admission.adaptive
    unknown = counted_record.admission.adaptive.token_budget
    assert unknown is not None and unknown.kv_capacity_tokens is None
    server, outcome, record = await _engine_run(sqlite_engine, "adaptive", kv_tokens)
    assert outcome.status == "succeeded" and not outcome.failed
    assert record.admission is not None and record.admission.adaptive is not None
    budget = record.admission.adaptive.token_budget
    # The capacity came from the fake's vllm:cache_config_info through the batch's sampler.
    assert budget is not None and budget.kv_capacity_tokens == kv_tokens
    # Our reservations covered every answer at full length: nothing ever waited for room.
    assert server.load.max_waiting == 0
    assert server.load.max_in_flight > 1


def test_progress_shows_the_token_budget_in_use() -> None:
    server = SimServer(8_000)
    scheduler = over_one_server(server, Strategy.parse("adaptive"), gauges=server)
    assert scheduler.endpoints.first.limits.budget is not None
    scheduler.endpoints.first.limits.budget.set_capacity(8_000, 16)
    scheduler.endpoints.first.limits.budget.take(Claim(1_234))
    scheduler.endpoints.first.llm = SimpleNamespace(stats=CallStats())  # type: ignore[assignment]
    state = BatchProgress(1, 3, scheduler.endpoints).state()
    assert (state.budget_tokens, state.reserved_tokens) == (int(8_000 * 0.98 * 1.05), 1_234)
    # Without a budget (a fixed strategy) the fields say so.
    fixed = over_one_server(server, Strategy.parse("fixed-3"), gauges=server)
    assert fixed.endpoints.first.limits.budget is None
    fixed.endpoints.first.llm = SimpleNamespace(stats=CallStats())  # type: ignore[assignment]
    assert BatchProgress(1, 3, fixed.endpoints).state().budget_tokens is None


async def test_the_batchs_first_requests_are_costed_after_one_count(
        sqlite_engine: Engine) -> None:
    # A request is costed before it passes the gate; the context check counts it after.
    # So the batch's first request went out costed at the default 0.5 tokens per byte
    # (here 2,336 tokens against 1,376 at the count, without the change), and the chain
    # cap's first readings carried that cost. The endpoint now has the server count the
    # first prompt before costing it, once; the others wait for it.
    from agents.chat import CallTag
    from app.llm import TrackedLLM
    from app.traffic.client import TickerClient
    from app.usage import UsageRecorder
    from tests.fakevllm import BASE_URL

    fake = FakeServer(lambda chat: Reply("ok", completion_tokens=3), tokenize_count=1_000,
                      max_model_len=32_768)
    settings = load_settings(llm_base_url=BASE_URL, check_context_length=True)
    async with fake.client() as http, UsageRecorder(sqlite_engine) as recorder:
        llm = TrackedLLM(settings, recorder, http_client=http)
        endpoints = one_server(llm, Strategy.parse("adaptive"), gauges=Unread())
        endpoint = endpoints.first
        budget = endpoint.limits.budget
        assert budget is not None and not budget.ratio_known()
        taken: list[int] = []
        take = budget.take

        def recording(cost: Any, held: int = 0) -> None:
            taken.append(getattr(cost, "tokens", cost))
            take(cost, held)

        budget.take = recording  # type: ignore[method-assign]
        routed = TickerClient(endpoints, endpoint, Ticket(0, 4, 1))
        prompts = [{"model": settings.llm.model, **body(4_000, 300)} for _ in range(4)]
        for i, prompt in enumerate(prompts):
            prompt["messages"][1]["content"] += str(i)  # four analysts: four prompts
        batch = new_batch_id(sqlite_engine)
        await asyncio.gather(*(routed.send(CallTag(batch, "AAA", f"analyst{i}", 0), p)
                               for i, p in enumerate(prompts)))
    # One /tokenize for the batch's first prompt (the context check then found it counted,
    # and the byte bound settles the other three), and all four costed at its ratio.
    assert fake.tokenize_calls == 1
    at_count = blocks(math.ceil(4_001 * 1.05 * 1_000 / 4_001) + 24 + 300)
    assert taken == [at_count] * 4
    assert at_count < blocks(math.ceil(4_001 * 0.5) + 24 + 300)  # what the default gave


async def test_claims_made_while_the_first_count_is_out_wait_for_it() -> None:
    # A one-pass start sends many tickers' first requests before the server's count of the
    # first prompt comes back; each must be costed at the count, not at the default ratio
    # (on the simulated fleet the default was 2.4x under the counts, and the budget's first
    # reading then cut its correction to 0.5).
    from app.promptsize import Counted

    counted = Counted()
    budget = TokenBudget(capacity=1_000_000, counted=counted)

    class SlowCounter:
        supported = True
        settings = SimpleNamespace(llm=SimpleNamespace(model="m"))
        calls = 0

        async def count(self, model: str, messages: list[dict[str, str]]) -> int:
            self.calls += 1
            await asyncio.sleep(0.01)  # the /tokenize round trip: other claims come meanwhile
            size = sum(len(m["content"]) for m in messages)
            counted.bytes, counted.tokens = size, size  # one token per byte, not 0.5
            return size

    counter = SlowCounter()
    gate = Gate(8, budget, counter=counter)  # type: ignore[arg-type]
    prompt = body(4_000, 300)
    claims = await asyncio.gather(*(gate.claim("market", prompt) for _ in range(4)))
    assert counter.calls == 1
    at_count = blocks(math.ceil(4_000 * 1.05) + 24 + 300)
    assert [c.tokens for c in claims] == [at_count] * 4
    assert at_count > blocks(math.ceil(4_000 * 0.5) + 24 + 300)  # what the default gave


async def test_claims_that_waited_for_the_first_count_go_on_together() -> None:
    # At a fleet's start every analyst's claim arrives while the first count is out. They
    # queued on a lock and went on one per event-loop turn once it came back; with 2,000
    # sends in flight a turn takes milliseconds, so an endpoint's 250 first requests went
    # out over seconds (500 tickers over 8 simulated H200s: first calls spread over 5 s).
    from app.promptsize import Counted

    counted = Counted()
    budget = TokenBudget(capacity=10_000_000, counted=counted)
    back = asyncio.Event()

    class HeldCounter:
        supported = True
        settings = SimpleNamespace(llm=SimpleNamespace(model="m"))

        async def count(self, model: str, messages: list[dict[str, str]]) -> int:
            await back.wait()  # the /tokenize round trip, ended by the test
            counted.bytes = counted.tokens = 4_000
            return 4_000

    gate = Gate(256, budget, counter=HeldCounter())  # type: ignore[arg-type]
    claims = [asyncio.create_task(gate.claim("market", body(4_000, 300))) for _ in range(64)]
    await asyncio.sleep(0)
    back.set()
    turns = 0
    while not all(claim.done() for claim in claims):
        await asyncio.sleep(0)  # one event-loop turn
        turns += 1
    assert turns <= 3  # the count's end, then every waiting claim at once (a lock: 64)
    assert {claim.result().tokens for claim in claims} == {blocks(4_200 + 24 + 300)}


def new_batch_id(engine: Engine) -> int:
    from tests.unit.support.call_rows import new_batch
    return new_batch(engine)


async def test_the_first_prompts_are_costed_by_the_servers_count_not_the_default(
        sqlite_engine: Engine) -> None:
    # Before any request has finished the budget knew only its generous default (0.5
    # tokens per byte); on an H200 the prompts came to 0.226, so the first minute's costs
    # were 2.3x too high. The context check's /tokenize count (made before the first call
    # goes out) now sets the ratio until finished requests do.
    from app.llm import TrackedLLM
    from app.traffic.server import Server
    from app.usage import UsageRecorder
    from tests.fakevllm import BASE_URL

    fake = FakeServer(tokenize_count=1_000, max_model_len=32_768)
    settings = load_settings(llm_base_url=BASE_URL, check_context_length=True)
    prompt = body(4_000, 300)
    async with fake.client() as http, UsageRecorder(sqlite_engine) as recorder:
        llm = TrackedLLM(settings, recorder, http_client=http)
        endpoint = Server(0, BASE_URL, llm, Strategy.parse("adaptive"),
                          gauges=Unread(), counter=llm)
        budget = endpoint.limits.budget
        assert budget is not None
        assert budget.ratio() == budget.tokens_per_byte == 0.5  # nothing counted yet
        default = budget.claim("market", prompt).tokens
        await llm.check({"model": settings.llm.model, **prompt})
        assert fake.tokenize_calls == 1
        assert budget.ratio() == pytest.approx(1.05 * 1_000 / 4_000)
        counted = budget.claim("market", prompt).tokens
        assert counted == blocks(math.ceil(4_000 * 1.05 * 0.25) + 24 + 300) < default
        # A finished request's own prompt count takes over from /tokenize's.
        budget.learn("market", prompt, prompt_tokens=800, completion_tokens=300)
        assert budget.ratio() == pytest.approx(1.05 * 800 / 4_000)
