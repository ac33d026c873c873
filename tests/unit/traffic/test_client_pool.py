"""The LLM client's connection pool never caps requests in flight below the engine's own limit.

httpx's default pool allows 100 connections and queues the rest silently, so the pool
only shows on a real socket: the fake servers, served on 127.0.0.1 here, hold every chat
request open until as many as the test expects are open at once (or a deadline passes),
then answer all.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from agents.data.snapshot import SnapshotProvider
from agents.fitting import fixed
from app.batch.engine import BatchEngine, BatchPlan, TickerWork, max_in_flight
from app.config import load_settings
from app.llm import CallTag
from app.traffic.client import TickerClient
from app.traffic.halt import Halt
from app.traffic.server import ServerSet
from app.traffic.strategy import Strategy
from app.usage import UsageRecorder
from tests.fakevllm import ChatRequest, FakeServer, Reply
from tests.fakevllm.router import FakeRouter
from tests.fakevllm.server import serving
from tests.integration.unattended import free_port
from tests.unit.support.call_rows import new_batch

EXPECT = 130  # over httpx's default pool of 100 connections
DEADLINE_S = 8.0  # then everyone is answered: the test reports how many were open


@pytest.fixture
async def holding() -> AsyncIterator[tuple[FakeServer, str]]:
    """Yield a fake that answers chats once ``EXPECT`` are open together, and its base URL."""
    all_open = asyncio.Event()
    asyncio.get_running_loop().call_later(DEADLINE_S, all_open.set)

    def hold(chat: ChatRequest) -> Reply:
        if chat.index + 1 >= EXPECT:
            all_open.set()
        return Reply("ok", hold=all_open)

    server = FakeServer(hold)
    async with serving([server.asgi()]) as (port,):
        yield server, f"http://127.0.0.1:{port}/v1"


@pytest.mark.slow
async def test_the_flood_arm_gets_more_than_a_hundred_requests_in_flight(
        sqlite_engine: Engine, tmp_path: Path, holding: tuple[FakeServer, str]) -> None:
    n, (server, url) = EXPECT, holding
    settings = load_settings(llm_base_url=url, check_context_length=False,
                             retry_backoff_s=0, max_attempts=1, record_requests=False)
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 4}

    async def work(ticker: str, gated: TickerClient, batch_id: int) -> list[Any]:
        await asyncio.gather(*(gated.send(CallTag(batch_id, ticker, f"n{i}"), body)
                               for i in range(n)))
        return []

    runner = BatchEngine(settings, sqlite_engine, provider=SnapshotProvider(tmp_path),
                         sample_metrics=False)
    # The bench's flood arm: every request of the workload at once.
    outcome = await runner.run(BatchPlan("bench", date(2025, 1, 2), ["AAA"], 1,
                                         "fixed-1000000"),
                               TickerWork(work, shapes={"AAA": (n, 1)}))
    assert outcome.status == "succeeded", outcome.failed
    assert len(server.served()) == n
    assert server.max_in_flight == n


def test_the_engine_sizes_the_pool_from_its_own_maximum() -> None:
    shapes = {"A": (17, 14), "B": (34, 14), "C": (17, 14)}
    # adaptive: no cap; its gate's ceiling grows with the servers read behind a router
    assert max_in_flight(Strategy.parse("adaptive"), shapes, max_concurrency=256) is None
    assert max_in_flight(Strategy.parse("sequential"), shapes, max_concurrency=64) == 1
    # fixed-N: N tickers at once, each with every request it has (the heaviest first)
    assert max_in_flight(Strategy.parse("fixed-2"), shapes, max_concurrency=64) == 34 + 17
    # more tickers allowed than there are: every request of the batch
    assert max_in_flight(Strategy.parse("fixed-1000000"), shapes, max_concurrency=64) == 68
    # nothing known of the work: no cap at all
    assert max_in_flight(Strategy.parse("fixed-3"), None, max_concurrency=64) is None


async def test_servers_read_behind_a_router_after_the_start_get_room_in_the_pool(
        sqlite_engine: Engine) -> None:
    # The router does not answer yet when the batch connects (restarting, or a stalled
    # host); its first reading then finds three servers, and the one gate may admit three
    # servers' ceilings. The client's pool must hold them all: they are requests the gate
    # let out, and a pool sized at the start would queue them silently.
    ceiling, servers = 4, 3
    wanted = servers * ceiling
    held: list[ChatRequest] = []  # chats open together before any was answered
    all_open = asyncio.Event()
    asyncio.get_running_loop().call_later(DEADLINE_S, all_open.set)

    def hold(chat: ChatRequest) -> Reply:
        if not all_open.is_set():
            held.append(chat)
            if len(held) == wanted:
                all_open.set()
        return Reply("ok", hold=all_open)

    fakes = [FakeServer(hold) for _ in range(servers)]
    batch_id, port = new_batch(sqlite_engine), free_port()
    router_root = f"http://127.0.0.1:{port}"
    settings = load_settings(llm_base_url=router_root + "/v1", max_concurrency=ceiling,
                             check_context_length=False, retry_backoff_s=0, max_attempts=1,
                             record_requests=False)
    strategy = Strategy.parse("adaptive")
    async with serving([fake.asgi() for fake in fakes]) as ports, \
            UsageRecorder(sqlite_engine) as recorder:
        fleet = ServerSet.connect(
            settings, strategy, recorder, engine=sqlite_engine, batch_id=batch_id,
            max_in_flight=max_in_flight(strategy, None, ceiling), halt=Halt())
        (server,) = fleet
        router = FakeRouter({f"http://127.0.0.1:{p}": fake for p, fake in zip(ports, fakes,
                                                                                strict=True)},
                            root=router_root)
        try:
            async with serving([router.asgi()], [port]):
                assert await server.sample_once() is not None
                assert server.limits.policy.maximum == wanted  # the gate's ceiling now
                await asyncio.gather(*(
                    server.llm.chat(CallTag(batch_id, f"T{i}", "analyst"),
                                    fixed([{"role": "user", "content": "hi"}]), max_tokens=4)
                    for i in range(wanted)))
        finally:
            await fleet.aclose()
    assert len(held) == wanted
    assert all(fake.chats for fake in fakes)  # the router spread them: three servers' room
