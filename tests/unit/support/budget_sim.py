"""Scripted gauges and a simulated KV cache for the token budget's tests.

``SimServer`` is a KV cache in tokens: a request's prompt enters the cache when it is sent,
its answer grows a step at a time after admission, and a cache over its capacity counts a
preemption at every step it stays over. Prompts really hold a quarter token per byte, and
every answer runs to its ``max_tokens``. With ``shared`` above 0, that share of every
prompt is already in the cache (a prefix another request brought), so it takes no new
blocks: the room a budget of estimated prompts cannot see.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from agents.chat import CallTag
from app.traffic.budget import TokenBudget
from app.traffic.client import TickerClient
from app.traffic.scheduler import Job, Scheduler
from app.traffic.strategy import Strategy
from tests.unit.support.servers import Unread, over_one_server


@dataclass
class G:
    """One scripted /metrics reading."""

    kv_cache_usage: float = 0.0
    preemptions_total: float = 0
    generation_tokens_total: float = 0
    running: float = 0
    waiting: float = 0
    taken_at: datetime | None = field(default=None)


def body(prompt_bytes: int, max_tokens: int) -> dict[str, Any]:
    """Return a chat body of two messages: a 2-byte system text and a user text of the rest."""
    return {"messages": [{"role": "system", "content": "hi"},
                         {"role": "user", "content": "x" * (prompt_bytes - 2)}],
            "max_tokens": max_tokens}


def blocks(tokens: float, size: int = 16) -> int:
    """Return ``tokens`` rounded up to whole blocks."""
    return math.ceil(tokens / size) * size


class KVGauges(Unread):
    """The KV capacity a server publishes (``vllm:cache_config_info``), as the sampler has it."""

    capacity: int
    block: int

    @property
    def kv_capacity(self) -> int:
        return self.capacity

    @property
    def block_size(self) -> int:
        return self.block


class SimServer(KVGauges):
    """A KV cache in tokens that answers chat bodies step by step (see the module's doc)."""

    def __init__(self, capacity: int, block: int = 16, shared: float = 0.0) -> None:
        self.capacity, self.block, self.shared = capacity, block, shared
        self.settings = SimpleNamespace(calls=SimpleNamespace(max_concurrency=64))
        self.live: dict[int, list[int]] = {}  # id -> [prompt tokens in the cache, generated]
        self.preemptions = 0
        self.generated = 0
        self.peak_used = 0
        self.budget: TokenBudget | None = None
        self.peak_reserved = 0
        self._ids = 0
        # The server's, wired by the test (support/servers.one_server) as its reading task.
        self.push: Callable[[G], None] | None = None

    async def read(self, every_s: float) -> None:
        """Push a reading every ``every_s``, as the batch's /metrics reader does."""
        while True:
            if self.push is not None:
                self.push(self.latest)
            await asyncio.sleep(every_s)

    def used(self) -> int:
        return sum(math.ceil((p + g) / self.block) * self.block for p, g in self.live.values())

    @property
    def latest(self) -> G:
        return G(kv_cache_usage=min(1.0, self.used() / self.capacity),
                 preemptions_total=self.preemptions, generation_tokens_total=self.generated,
                 running=len(self.live), taken_at=datetime.now(UTC))

    async def attempt(self, tag: CallTag, call: Any, body: dict[str, Any], *,
                      priority: int | None = None, ready_at: Any = None,
                      trimmed: Any = None) -> SimpleNamespace:
        # Called with the gate's place and tokens held, as TrackedLLM's attempt is.
        return await self._serve(body)

    async def _serve(self, body: dict[str, Any]) -> SimpleNamespace:
        if self.budget is not None:
            self.peak_reserved = max(self.peak_reserved, self.budget.reserved)
        self._ids += 1
        rid = self._ids
        size = sum(len(m["content"].encode()) for m in body["messages"])
        self.live[rid] = [math.ceil(size // 4 * (1 - self.shared)), 0]
        steps = 10
        for _ in range(steps):
            await asyncio.sleep(0.002)
            self.live[rid][1] += body["max_tokens"] // steps
            self.generated += body["max_tokens"] // steps
            used = self.used()
            self.peak_used = max(self.peak_used, used)
            if used > self.capacity:
                self.preemptions += 1
        del self.live[rid]
        return SimpleNamespace(prompt_tokens=size // 4, completion_tokens=body["max_tokens"])


def chain_job(key: str, length: int, first_bytes: int, step_bytes: int, out: int) -> Job:
    """Return a ticker of ``length`` calls one after another, each prompt longer than the last."""
    async def run(gated: TickerClient) -> None:
        for step in range(length):
            await gated.send(CallTag(1, key, f"n{step}", 0),
                             body(first_bytes + step * step_bytes, out))
    return Job(key, run, requests=length, chain=length)


async def reading(server: SimServer, batch: Coroutine[Any, Any, None],
                  every_s: float = 0.002) -> None:
    """Run ``batch`` while ``server`` pushes a reading every ``every_s``."""
    async with asyncio.TaskGroup() as group:
        reader = group.create_task(server.read(every_s))
        try:
            await batch
        finally:
            reader.cancel()


def run_sim(strategy: str, capacity: int, *, tickers: int = 12, shared: float = 0.0
            ) -> tuple[SimServer, Scheduler]:
    """Run chains of 5 calls (prompts 500-900 tokens, answers 400) under ``strategy``."""
    server = SimServer(capacity, shared=shared)
    scheduler = over_one_server(server, Strategy.parse(strategy), gauges=server)
    server.budget = scheduler.endpoints.first.limits.budget

    jobs = [chain_job(f"T{i}", 5, 2_000, 400, 400) for i in range(tickers)]
    asyncio.run(reading(server, scheduler.run(jobs)))  # a job that fails raises here
    return server, scheduler
