"""The LLM client's connection pool never caps requests in flight below the engine's own limit.

httpx's default pool allows 100 connections and queues the rest silently, so the pool
only shows on a real socket: a tiny HTTP server here holds every chat request open until
as many as the test expects are open at once (or a deadline passes), then answers all.
"""

from __future__ import annotations

import asyncio
import json
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

ANSWER = "".join(
    f"data: {json.dumps(c)}\n\n" for c in (
        {"id": "r", "object": "chat.completion.chunk", "created": 0, "model": "m",
         "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]},
        {"id": "r", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [],
         "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}},
    )) + "data: [DONE]\n\n"


class HoldingServer:
    """Answer chat requests only once ``expect`` are open together, or after ``deadline_s``."""

    def __init__(self, expect: int, deadline_s: float = 8.0) -> None:
        self.expect = expect
        self.deadline_s = deadline_s
        self.open = 0
        self.max_open = 0
        self.answered = 0
        self._all_open = asyncio.Event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: one connection may carry several requests
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                self.open += 1
                self.max_open = max(self.max_open, self.open)
                if self.open >= self.expect:
                    self._all_open.set()
                try:
                    await asyncio.wait_for(self._all_open.wait(), self.deadline_s)
                except TimeoutError:
                    self._all_open.set()  # release everyone: the test then reports max_open
                body = ANSWER.encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
                self.open -= 1
                self.answered += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=1024)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()


@pytest.fixture
async def holding() -> AsyncIterator[HoldingServer]:
    yield HoldingServer(expect=130)


@pytest.mark.slow
async def test_the_flood_arm_gets_more_than_a_hundred_requests_in_flight(
        sqlite_engine: Engine, tmp_path: Path, holding: HoldingServer) -> None:
    n = holding.expect  # over httpx's default pool of 100 connections
    async with holding as url:
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
    assert holding.answered == n
    assert holding.max_open == n


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
