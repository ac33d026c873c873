"""A wide night of chains over a simulated server."""

from __future__ import annotations

import asyncio

import pytest

from agents.chat import CallTag
from app.traffic.chains import Footprint
from app.traffic.client import TickerClient
from app.traffic.scheduler import Job
from app.traffic.strategy import Strategy
from tests.unit.support.budget_sim import SimServer, body, reading
from tests.unit.support.servers import over_one_server


def run_wide(monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[list[int], SimServer]:
    if monkeypatch is not None:  # the control: the same batch without the cap
        monkeypatch.setattr(Footprint, "slots", lambda self, limit: None)
    server = SimServer(24_000)  # about 8 chains at their mean size
    scheduler = over_one_server(server, Strategy.parse(STRATEGY), gauges=server)
    server.budget = scheduler.endpoints.first.limits.budget
    started: list[int] = []
    live: set[str] = set()

    # A job that fails raises here.
    asyncio.run(reading(server, scheduler.run(
        [wide_then_chain(f"T{i}", started, live) for i in range(40)])))
    assert len(started) == 40
    return started, server


def wide_then_chain(key: str, started: list[int], live: set[str]) -> Job:
    """A ticker shaped like the pipeline's: four small calls at once, then a growing chain."""
    async def run(gated: TickerClient) -> None:
        live.add(key)
        started.append(len(live))
        try:
            await asyncio.gather(*(gated.send(CallTag(1, key, f"analyst{i}", 0),
                                              body(1_000, 100)) for i in range(4)))
            for step in range(10):
                await gated.send(CallTag(1, key, f"step{step}", 0),
                                 body(1_200 + step * 1_200, 300))
        finally:
            live.discard(key)
    return Job(key, run, requests=14, chain=11)


STRATEGY = "adaptive:tail=off,prefetch=off"  # test_chains_prefetch.py runs it with prefetching
