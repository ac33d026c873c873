"""Start tickers' work under a strategy: adaptive (ours), fixed-N tickers in flight, sequential.

Under ``adaptive`` the gate follows the admission policy and serves tickers already under
way first (their start order is their priority), so results arrive steadily and a crash
leaves few tickers half done. That preference has a price at the end of a batch: tickers
started last still have their whole chain of one-after-another calls ahead of them while
the rest of the batch drains, and the server idles through that tail (on an H200 with 20
tickers the tail cost more throughput than any admission setting). So a ticker turns
*urgent* when its remaining chain is at least the batch's remaining work divided by the
limit, i.e. when it would finish after everything else: urgent tickers start at once and
go first, longest chain first (the classic critical-path rule for chains). Early in a
night of ~100 tickers nothing is urgent; only the last stretch is reordered.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from app.llm import TrackedLLM
from app.traffic.admission import AdmissionPolicy
from app.traffic.budget import TokenBudget
from app.traffic.client import TickerClient
from app.traffic.gate import Gate
from app.traffic.holdback import COLUMNS
from app.traffic.server import GaugeSource, ServerSet
from app.traffic.strategy import Strategy
from app.traffic.tasks import wait_first
from app.traffic.ticket import Ticket

log = structlog.get_logger(__name__)

# How long admission waits for the heaviest ticker's data before a lighter one goes first.
PREPARE_PATIENCE_S = 1.0


@dataclass
class Job:
    """One ticker's work: ``run`` gets the ticker's TickerClient and makes every call with it."""

    key: str
    run: Callable[[TickerClient], Awaitable[Any]]
    weight: float = 0.0  # expected work; heavier jobs start first so the tail is short
    requests: int = 0  # expected requests, 0 when unknown
    chain: int = 0  # the longest run of them that must go one after another
    # What the job needs before it may be admitted (its market data), run ahead of admission.
    prepare: Callable[[], Awaitable[Any]] | None = None


OnDone = Callable[[Job, Any, BaseException | None], Awaitable[None]]


class Scheduler:
    """Run jobs under one strategy; with ``adaptive`` each gate follows its admission policy.

    One server is ``llm`` with its ``gauges``; several come as an ``ServerSet``
    (app/traffic/server.py), each with its own gate, policy and budget. ``fixed-N`` and
    ``sequential`` then mean N tickers (and their request cap) per endpoint.
    """

    def __init__(self, llm: TrackedLLM | None, strategy: Strategy, *,
                 gauges: GaugeSource | None = None, policy: AdmissionPolicy | None = None,
                 endpoints: ServerSet | None = None) -> None:
        self.strategy = strategy
        if endpoints is None:
            if llm is None:
                raise ValueError("a scheduler needs a client or endpoints")
            endpoints = ServerSet.single(llm, strategy, gauges=gauges, policy=policy)
        self.endpoints = endpoints
        self.in_flight = 0
        self.started = 0
        self.left = 0  # requests of the batch not yet finished, as far as they are known
        self._loaded = asyncio.Event()  # set whenever a job's preparation ends
        self._waited: set[int] = set()
        self.tickers = 0
        self.stopping = False

    # The first endpoint's parts: with one server, the server's (live progress reads them).
    @property
    def llm(self) -> TrackedLLM:
        return self.endpoints.first.llm

    @property
    def gate(self) -> Gate:
        return self.endpoints.first.gate

    @property
    def policy(self) -> AdmissionPolicy:
        return self.endpoints.first.limits.policy

    @property
    def budget(self) -> TokenBudget | None:
        return self.endpoints.first.limits.budget

    @property
    def gauges(self) -> GaugeSource | None:
        return self.endpoints.first.gauges

    @property
    def metrics_fallback(self) -> bool:
        """Tell whether some server's /metrics cannot be read now (progress shows it)."""
        return self.endpoints.blind

    def fallback_record(self) -> dict[str, Any] | None:
        """Return what the batch stores of its time without /metrics (None: it had none)."""
        return self.endpoints.fallback_record()

    def stop(self) -> None:
        """Start no more tickers and let no new request through; requests out may finish."""
        self.stopping = True
        for endpoint in self.endpoints:
            endpoint.gate.hold("stopping")
        self.endpoints.changed.set()

    async def drained(self) -> None:
        """Return once no endpoint's gate has a request out (after ``stop``)."""
        for endpoint in self.endpoints:
            await endpoint.gate.drained()

    def close(self, error: BaseException) -> None:
        """Refuse every request still waiting at any endpoint's gate with ``error``."""
        for endpoint in self.endpoints:
            endpoint.gate.close(error)

    def urgent(self, ticket: Ticket) -> bool:
        """Return True when the ticker's remaining chain would outlast the rest of the batch."""
        if not self.strategy.tail or not ticket.chain or not ticket.remaining:
            return False
        # The batch's remaining rounds: its requests left over what runs at once. The count
        # limit alone overstates that where the budget fits fewer chains, and would make
        # every ticker not yet started urgent too soon.
        return ticket.remaining_chain >= self.left / max(1, self.endpoints.concurrency())

    def _work_left(self) -> int:
        return self.left

    def _may_pass(self, ticket: Ticket | None) -> bool:
        return self.stopping or (ticket is not None and self.urgent(ticket))

    def rank(self, ticket: Ticket) -> int:
        """Return a request's priority, lower first: urgent tickers by longest remaining
        chain, ties by start order, all before the others, which go by start order.

        One integer, because vLLM's per-request ``priority`` is one.
        """
        if not self.urgent(ticket):
            return ticket.order
        return ticket.order - (1 + ticket.remaining_chain) * self.tickers

    def _finished_one(self, ticket: Ticket) -> None:
        if ticket.done <= ticket.requests:
            self.left -= 1

    def _redone_one(self, ticket: Ticket) -> None:
        """Count a call sent again (its endpoint failed) as work left once more."""
        if ticket.done < ticket.requests:
            self.left += 1

    async def run(self, jobs: list[Job], on_done: OnDone) -> None:
        """Run every job once; a failing job is reported to ``on_done``, never raised."""
        self.endpoints.began = self.endpoints.clock()  # the hold-back rows' zero
        ordered = sorted(jobs, key=lambda j: -j.weight)
        self.left = sum(job.requests for job in ordered)
        self.tickers = len(ordered)
        tasks: list[asyncio.Task[None]] = []
        slots = self.strategy.tickers_in_flight
        # Jobs prepare (load their data) ahead of admission, and a ticker is admitted once
        # it is ready: one slow load never holds back the tickers behind it. Start order,
        # not weight order, is then the ticker's priority.
        loaded = [asyncio.Event() for _ in ordered]
        failures: dict[int, BaseException] = {}
        preparing = [asyncio.create_task(self._prepare(job, loaded[i], failures, i),
                                         name=f"prepare {job.key}")
                     for i, job in enumerate(ordered)]
        pending = list(range(len(ordered)))
        order = 0
        try:
            while pending and not self.stopping:
                index = await self._next_ready(pending, loaded)
                job = ordered[index]
                failure = failures.get(index)
                if failure is not None:  # never admitted: it has nothing to work on
                    self.left -= job.requests
                    await on_done(job, None, failure)
                    continue
                ticket = Ticket(order, job.requests, job.chain)
                # The endpoint with room, under its share of the work left and with the
                # most free budget tokens (routing.py); a stop ends the wait at once.
                self.endpoints.routing = True
                try:
                    endpoint = await self.endpoints.wait_for_room(
                        slots, or_else=functools.partial(
                            self._may_pass, ticket if slots is None else None),
                        # Adaptive spreads the work so the endpoints finish together;
                        # fixed-N keeps its meaning, N tickers per endpoint.
                        work_left=self._work_left if slots is None else None)
                finally:
                    self.endpoints.routing = False
                if self.stopping:
                    break  # the tickers not started stay queued, for a resume
                order += 1
                first_request = asyncio.Event()
                gated = TickerClient(self.endpoints, endpoint, ticket, first_request,
                                  rank=self.rank, on_finish=self._finished_one,
                                  on_redo=self._redone_one, may_pass=self._may_pass)
                task = asyncio.create_task(self._one(job, gated, first_request, on_done),
                                           name=job.key)
                tasks.append(task)
                if slots is None:
                    # A started ticker has not asked for its place yet: wait until it has,
                    # or the gate would look free and we would start a burst of tickers.
                    await wait_first(first_request.wait(), task)
            await asyncio.gather(*tasks)
        finally:
            for task in [*tasks, *preparing]:
                task.cancel()
            await asyncio.gather(*tasks, *preparing, return_exceptions=True)

    async def _prepare(self, job: Job, loaded: asyncio.Event,
                       failures: dict[int, BaseException], index: int) -> None:
        try:
            if job.prepare is not None:
                await job.prepare()
        except Exception as exc:  # the job fails alone, reported by run()
            failures[index] = exc
        finally:
            loaded.set()
            self._loaded.set()

    async def _next_ready(self, pending: list[int], loaded: list[asyncio.Event]) -> int:
        """Take the heaviest pending job whose preparation is over, waiting if none is.

        The heaviest of all gets a moment (``PREPARE_PATIENCE_S``, once) before a lighter
        ready one overtakes it: loads normally take moments, and weight order keeps the
        batch's tail short; a load slower than that no longer holds anyone back.
        """
        first = pending[0]
        if not loaded[first].is_set() and first not in self._waited:
            self._waited.add(first)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(loaded[first].wait(), PREPARE_PATIENCE_S)
        while True:
            for index in pending:
                if loaded[index].is_set():
                    pending.remove(index)
                    return index
            self._loaded.clear()
            await self._loaded.wait()

    async def _one(self, job: Job, gated: TickerClient, first_request: asyncio.Event,
                   on_done: OnDone) -> None:
        ticket = gated.ticket
        self.in_flight += 1
        self.started += 1
        result: Any = None
        error: BaseException | None = None
        try:
            result = await job.run(gated)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one ticker's failure never stops the others
            error = exc
        finally:
            # Requests it did not make (a failure cut it short) are no longer work left.
            self.left -= ticket.remaining
            ticket.done = max(ticket.done, ticket.requests)
            gated.close()
            self.in_flight -= 1
            first_request.set()
        await on_done(job, result, error)

    def holdback_timeline(self) -> dict[str, Any]:
        """Return each endpoint's rows of what held new tickers back (holdback.COLUMNS)."""
        return {"columns": list(COLUMNS),
                "endpoints": {e.name: e.holdback.timeline for e in self.endpoints}}

    def admission(self) -> dict[str, Any]:
        """Return how admission ended: the request limit and, when budgeted, the token budget.

        With several endpoints the limit is their sum and ``endpoints`` has each one's.
        """
        figures: dict[str, Any] = {"strategy": self.strategy.name,
                                   "request_limit": self.gate.limit}
        if self.strategy.adaptive:
            figures.update(self.endpoints.first.limits.summary())
            figures["new_tickers_held_back"] = self.endpoints.first.holdback.summary()
        if self.endpoints.several:
            figures["request_limit"] = sum(e.gate.limit for e in self.endpoints)
            figures["endpoints"] = self.endpoints.summary()
        return figures
