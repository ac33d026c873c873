"""The LLM client's connection pool never caps requests in flight below the engine's own limit.

httpx's default pool allows 100 connections and queues the rest silently, so the pool
only shows on a real socket: the fake server, served on 127.0.0.1 here, holds every chat
request open until as many as the test expects are open at once (or a deadline passes),
then answers all.
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
from app.batch.engine import BatchEngine, BatchPlan, TickerWork, max_in_flight
from app.config import load_settings
from app.llm import CallTag
from app.traffic.client import TickerClient
from app.traffic.strategy import Strategy
from tests.fakevllm import ChatRequest, FakeServer, Reply
from tests.fakevllm.server import serving

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
    # adaptive: the admission policy's maximum, whatever the tickers
    assert max_in_flight(Strategy.parse("adaptive"), shapes, max_concurrency=256) == 256
    assert max_in_flight(Strategy.parse("sequential"), shapes, max_concurrency=64) == 1
    # fixed-N: N tickers at once, each with every request it has (the heaviest first)
    assert max_in_flight(Strategy.parse("fixed-2"), shapes, max_concurrency=64) == 34 + 17
    # more tickers allowed than there are: every request of the batch
    assert max_in_flight(Strategy.parse("fixed-1000000"), shapes, max_concurrency=64) == 68
    # nothing known of the work: no cap at all
    assert max_in_flight(Strategy.parse("fixed-3"), None, max_concurrency=64) is None
