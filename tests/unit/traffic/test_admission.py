"""Drive the admission policy and gate with scripted gauge sequences."""

from __future__ import annotations

import asyncio

import pytest

from app.recorder import figures
from app.traffic.admission import AdmissionPolicy
from app.traffic.budget import Claim
from app.traffic.gate import Gate
from app.traffic.limits import Limits
from app.traffic.strategy import Strategy
from app.traffic.ticket import Ticket
from tests.unit.support.budget_sim import G


def test_grows_fast_while_the_server_has_headroom_and_the_limit_is_used() -> None:
    p = AdmissionPolicy(initial=2, maximum=64)
    limits = [p.observe(G(running=p.allowed, generation_tokens_total=i), p.allowed)
              for i in range(5)]
    assert limits == [4, 8, 16, 32, 64]


def test_does_not_grow_a_limit_it_does_not_use() -> None:
    p = AdmissionPolicy(initial=4)
    assert p.observe(G(running=2), outstanding=2) == 4
    assert p.reason == "steady"


def test_kv_usage_moves_no_rule_of_the_request_count() -> None:
    # The KV cache is the token budget's: the same readings at 99% KV grow, cut and name
    # the limit exactly as at 10%; only the preemptions cut it.
    script = [(4, 0, 0), (8, 0, 0), (16, 0, 2), (11, 0, 0), (12, 3, 0), (12, 0, 0)]

    def run(kv: float) -> list[tuple[int, str]]:
        p = AdmissionPolicy(initial=4, maximum=64)
        seen = []
        for i, (running, waiting, preempted) in enumerate(script):
            p.observe(G(running=running, waiting=waiting, kv_cache_usage=kv,
                        generation_tokens_total=i), p.allowed, preempted=preempted)
            seen.append((p.allowed, p.reason))
        return seen

    assert run(0.99) == run(0.10) == [
        (8, "headroom"), (16, "headroom"), (11, "2 preemptions"), (12, "headroom"),
        (12, "requests arriving"), (13, "headroom")]


@pytest.mark.parametrize(("capacity", "let_in"), [(10_000, 4), (None, 5)])
async def test_with_the_capacity_known_the_budget_alone_holds_a_full_kv_cache(
        capacity: int | None, let_in: int) -> None:
    # Four 2,100-token requests at a 10,000-token cache reading 98%, nothing waiting: the
    # request count grows (the cache moves it no more), the budget keeps the fifth out (five
    # pass the 10,290 it may reserve, 0.98 × the start factor 1.05).
    # Without the capacity the budget admits everything and the fifth goes in.
    limits = Limits(Strategy.parse("adaptive"), 64, gauged=True)
    assert limits.budget is not None
    gate = Gate(4, limits.budget)
    limits.read(G(), 0.0, gate, [], capacity, 16)  # the counters' baseline
    release = asyncio.Event()

    async def call() -> None:
        async with gate.slot(claim=Claim(2_100)):
            await release.wait()

    calls = [asyncio.create_task(call()) for _ in range(5)]
    await asyncio.sleep(0)
    assert (gate.outstanding, gate.waiting) == (4, 1)  # the starting request limit
    limits.read(G(running=4, kv_cache_usage=0.98, generation_tokens_total=100), 1.0, gate, [],
                capacity, 16)
    assert (limits.policy.allowed, limits.policy.reason) == (8, "headroom")
    assert gate.outstanding == let_in
    release.set()
    await asyncio.gather(*calls)


def test_preemptions_cut_the_limit() -> None:
    p = AdmissionPolicy(initial=16, backoff=0.5, minimum=2)
    # Preemptions since the last reading, as limits.py counts them.
    assert p.observe(G(running=10), 10) == 16
    assert p.observe(G(running=16), 16, preempted=2) == 8
    assert p.reason == "2 preemptions"
    for new in (4, 11, 20, 40):
        p.observe(G(running=2), 2, preempted=new)
    assert p.allowed == 2  # never below the minimum


def test_server_restart_resets_the_baseline() -> None:
    p = AdmissionPolicy(initial=4, maximum=64)
    p.observe(G(running=4, generation_tokens_total=10_000, preemptions_total=7), 4)
    p.observe(G(running=8, waiting=3, generation_tokens_total=12_000, preemptions_total=7), 8)
    # Counters back at zero: a restarted server, not 7 negative preemptions (limits.py
    # detects it and says so).
    assert p.observe(G(generation_tokens_total=0, preemptions_total=0), 0, restarted=True) == 4
    assert p.reason == "server restarted"
    # The new baseline holds: the next reading sees no preemptions.
    assert p.observe(G(running=4, generation_tokens_total=50), 4) == 8


def test_a_restart_is_detected_once_by_the_limits_and_both_rules_start_over() -> None:
    limits = Limits(Strategy.parse("adaptive"), 64, gauged=True)
    assert limits.budget is not None
    gate = Gate(4, limits.budget)

    def read(**gauges: float) -> None:
        limits.read(G(**gauges), 0.0, gate, [], 100_000, 16)

    read(running=4, generation_tokens_total=10_000, preemptions_total=2)
    read(running=4, generation_tokens_total=12_000, preemptions_total=3)  # one preemption
    assert limits.budget.reason == "1 preemptions"
    read(running=0, generation_tokens_total=40, preemptions_total=0)  # counters went back
    assert limits.policy.reason == limits.budget.reason == "server restarted"
    assert (limits.policy.allowed, limits.budget.factor) == (4, limits.budget.overbook)
    # The next reading counts from the new server's counters: no preemption, no restart.
    read(running=2, generation_tokens_total=90, preemptions_total=0)
    assert limits.policy.reason != "server restarted"
    restarts = [t for t in figures.budget(limits.budget).trajectory if t[3] == "server restarted"]
    assert len(restarts) == 1


def test_the_first_reading_is_the_limits_baseline() -> None:
    # Preemptions and tokens from before the batch don't count: no cut on the first reading.
    limits = Limits(Strategy.parse("adaptive"), 64, gauged=True)
    assert limits.budget is not None
    gate = Gate(4, limits.budget)
    limits.read(G(running=4, generation_tokens_total=9_000, preemptions_total=7), 0.0, gate,
                [], 100_000, 16)
    assert (limits.policy.allowed, limits.budget.cuts) == (4, 0)
    assert "preemptions" not in limits.policy.reason + limits.budget.reason
    limits.read(G(running=4, generation_tokens_total=9_500, preemptions_total=9), 0.0, gate,
                [], 100_000, 16)
    assert limits.policy.reason == limits.budget.reason == "2 preemptions"


def test_queue_building_caps_the_limit() -> None:
    p = AdmissionPolicy(initial=32, queue_allowance=1)
    assert p.observe(G(running=14, waiting=18), 32) == 15
    assert p.reason == "server queue building"


def test_a_queue_within_what_the_server_has_run_is_arrivals_not_a_full_batch() -> None:
    # Readings from an H200 at 40 tickers: the server ran 32 at once early on; later a
    # chain's next calls waited a step for their prefill while 4 ran at 28% KV. The old
    # rule cut the limit to 4 + 1 at each such reading.
    p = AdmissionPolicy(initial=16, queue_allowance=1)
    assert p.observe(G(running=32, waiting=0, kv_cache_usage=0.5), 16) == 32
    assert p.observe(G(running=4, waiting=2, kv_cache_usage=0.28), 20) == 32
    assert p.reason == "requests arriving"
    assert p.observe(G(running=12, waiting=5, kv_cache_usage=0.55), 32) == 32
    # More waiting than it has ever run beside what runs: its batch is full.
    assert p.observe(G(running=32, waiting=4, kv_cache_usage=0.7), 32) == 32  # 32 + 1 caps
    assert p.reason == "server queue building"
    assert p.observe(G(running=20, waiting=30, kv_cache_usage=0.7), 32) == 21


def test_a_restart_forgets_what_the_server_ran() -> None:
    p = AdmissionPolicy(initial=32, queue_allowance=1)
    p.observe(G(running=32, generation_tokens_total=9_000, preemptions_total=2), 32)
    p.observe(G(generation_tokens_total=0, preemptions_total=0), 0, restarted=True)
    # A new server that runs 3 and queues 5 is full, whatever the old one ran.
    p.observe(G(running=3, waiting=0, generation_tokens_total=10), 4)
    assert p.observe(G(running=3, waiting=5, generation_tokens_total=20), 8) == 4


async def test_gate_serves_the_most_senior_waiter_first() -> None:
    gate = Gate(1)
    order: list[int] = []

    async def request(priority: int) -> None:
        async with gate.slot(Ticket(priority)):
            order.append(priority)
            await asyncio.sleep(0.01)

    holder = asyncio.create_task(request(-1))
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(request(p)) for p in (5, 3, 9, 0)]
    await asyncio.gather(holder, *waiters)
    assert order == [-1, 0, 3, 5, 9]


async def test_gate_limit_change_releases_waiters() -> None:
    gate = Gate(1)
    inside = 0
    peak = 0
    release = asyncio.Event()

    async def request() -> None:
        nonlocal inside, peak
        async with gate.slot():
            inside += 1
            peak = max(peak, inside)
            await release.wait()
            inside -= 1

    tasks = [asyncio.create_task(request()) for _ in range(5)]
    await asyncio.sleep(0.01)
    assert peak == 1 and gate.waiting == 4
    gate.set_limit(3)
    await asyncio.sleep(0.01)
    assert peak == 3
    release.set()
    await asyncio.gather(*tasks)
    assert gate.outstanding == 0


def grown_then_settled_at_31() -> AdmissionPolicy:
    p = AdmissionPolicy(initial=4, maximum=256)
    for i in range(4):  # 4 -> 8 -> 16 -> 32 -> 64 while every request runs
        p.observe(G(running=p.allowed, generation_tokens_total=100 * i), p.allowed)
    # 30 run and 30 wait: a full batch, so the queue rule settles at 30 + 1.
    p.observe(G(running=30, waiting=30, generation_tokens_total=500), 64)
    assert (p.allowed, p.reason) == (31, "server queue building")
    return p


def test_a_blind_spell_gives_back_the_limit_it_set_aside() -> None:
    p = grown_then_settled_at_31()
    assert p.fall_back() == 4  # blind: back to the start, never grow
    assert p.reason == "no /metrics"
    # Readings return from the same server (its counters carried on): 31 at once.
    assert p.observe(G(running=3, generation_tokens_total=900), 3) == 31
    # A second spell that ends in preemptions: the held limit is judged by the reading
    # (31 × 0.7, not the fallback's 4 × 0.7).
    p.fall_back()
    assert p.observe(G(running=25, generation_tokens_total=950), 25, preempted=2) == 21


def test_a_blind_spell_that_hid_a_restart_starts_over() -> None:
    p = grown_then_settled_at_31()
    p.fall_back()
    # Counters back near zero: the server that answers is a new one, with a cold cache.
    assert p.observe(G(running=0, generation_tokens_total=5), 0, restarted=True) == 4
    assert p.reason == "server restarted"

