"""Start tickers' work under a strategy: adaptive (ours), fixed-N tickers in flight, sequential."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from app.batch.admission import AdmissionPolicy
from app.batch.gate import Gate, GatedLLM
from app.errors import InputError
from app.llm import TrackedLLM

log = structlog.get_logger(__name__)

UNBOUNDED = 1_000_000


@dataclass
class Job:
    """One ticker's work: ``run`` gets a gated client and does every call of the ticker."""

    key: str
    run: Callable[[GatedLLM], Awaitable[Any]]
    weight: float = 0.0  # expected work; heavier jobs start first so the tail is short


@dataclass(frozen=True)
class Strategy:
    """How much work is in flight: by the server's gauges, or by a fixed count of tickers."""

    name: str
    tickers_in_flight: int | None = None  # None: start a ticker whenever the gate has room
    request_limit: int | None = None  # a fixed cap on outstanding requests
    adaptive: bool = False

    @classmethod
    def parse(cls, name: str) -> Strategy:
        if name == "adaptive":
            return cls(name, adaptive=True)
        if name == "sequential":
            # TradingAgents' way: one ticker, one request at a time.
            return cls(name, tickers_in_flight=1, request_limit=1)
        match = re.fullmatch(r"fixed-(\d+)", name)
        if match and int(match.group(1)) > 0:
            return cls(name, tickers_in_flight=int(match.group(1)))
        raise InputError(f"unknown strategy {name!r} (adaptive, sequential, fixed-N)")


class GaugeSource(Protocol):
    """Anything holding the newest metrics reading (serving.metrics.MetricsSampler does)."""

    @property
    def latest(self) -> Any: ...


OnDone = Callable[[Job, Any, BaseException | None], Awaitable[None]]


class Scheduler:
    """Run jobs under one strategy; with ``adaptive`` the gate follows the admission policy."""

    def __init__(self, llm: TrackedLLM, strategy: Strategy, *, gauges: GaugeSource | None = None,
                 policy: AdmissionPolicy | None = None, interval_s: float = 1.0) -> None:
        self.llm = llm
        self.strategy = strategy
        self.gauges = gauges
        self.policy = policy or AdmissionPolicy(maximum=llm.settings.max_concurrency)
        self.interval_s = interval_s
        limit = strategy.request_limit or (self.policy.allowed if strategy.adaptive else UNBOUNDED)
        self.gate = Gate(limit)
        self.in_flight = 0
        self.started = 0

    async def run(self, jobs: list[Job], on_done: OnDone) -> None:
        """Run every job once; a failing job is reported to ``on_done``, never raised."""
        ordered = sorted(jobs, key=lambda j: -j.weight)
        tasks: list[asyncio.Task[None]] = []
        controller = (asyncio.create_task(self._control(), name="admission")
                      if self.strategy.adaptive and self.gauges is not None else None)
        slots = asyncio.Semaphore(self.strategy.tickers_in_flight or UNBOUNDED)
        try:
            for priority, job in enumerate(ordered):
                await slots.acquire()
                if self.strategy.tickers_in_flight is None:
                    await self.gate.wait_for_room()
                first_request = asyncio.Event()
                task = asyncio.create_task(
                    self._one(job, priority, first_request, slots, on_done), name=job.key)
                tasks.append(task)
                if self.strategy.tickers_in_flight is None:
                    # A started ticker has not asked for its place yet: wait until it has,
                    # or the gate would look free and we would start a burst of tickers.
                    done = asyncio.create_task(first_request.wait())
                    await asyncio.wait({done, task}, return_when=asyncio.FIRST_COMPLETED)
                    done.cancel()
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            if controller is not None:
                controller.cancel()
            await asyncio.gather(*tasks, *(c for c in [controller] if c), return_exceptions=True)

    async def _one(self, job: Job, priority: int, first_request: asyncio.Event,
                   slots: asyncio.Semaphore, on_done: OnDone) -> None:
        self.in_flight += 1
        self.started += 1
        result: Any = None
        error: BaseException | None = None
        try:
            result = await job.run(GatedLLM(self.llm, self.gate, priority, first_request))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one ticker's failure never stops the others
            error = exc
        finally:
            self.in_flight -= 1
            slots.release()
            first_request.set()
        await on_done(job, result, error)

    async def _control(self) -> None:
        seen = None
        while True:
            snapshot = self.gauges.latest if self.gauges is not None else None
            if snapshot is not None and snapshot is not seen:
                seen = snapshot
                before = self.gate.limit
                self.gate.set_limit(self.policy.observe(snapshot, self.gate.outstanding))
                if self.gate.limit != before:
                    log.debug("admission limit", limit=self.gate.limit, reason=self.policy.reason)
            await asyncio.sleep(self.interval_s / 2)
