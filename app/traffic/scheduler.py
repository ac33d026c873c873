"""Start tickers' work under a strategy: adaptive (ours), fixed-N tickers in flight, sequential.

With ``tail`` a ticker whose remaining chain would outlast the rest of the batch is marked
urgent (docs/architecture.md, "Order").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from app.tasks import beside, first_error
from app.traffic.client import TickerClient
from app.traffic.server import ServerSet
from app.traffic.strategy import Strategy
from app.traffic.ticket import Ticket

# How long admission waits for the heaviest ticker's data before a lighter one goes first.
PREPARE_PATIENCE_S = 1.0


@dataclass
class Job:
    """One ticker's whole work, its end included: ``run`` gets the ticker's TickerClient and
    makes every call with it, or, never admitted, the failure of its ``prepare``. The
    scheduler reports nothing back: a job that raises ends the run."""

    key: str
    run: Callable[[TickerClient | Exception], Awaitable[Any]]
    weight: float = 0.0  # expected work; heavier jobs start first so the tail is short
    requests: int = 0  # expected requests, 0 when unknown
    chain: int = 0  # the longest run of them that must go one after another
    # What the job needs before it may be admitted (its market data), run ahead of admission.
    prepare: Callable[[], Awaitable[Any]] | None = None


class Scheduler:
    """Run jobs under one strategy over a batch's ``servers``.

    ``fixed-N`` and ``sequential`` mean N tickers (and their request cap) per endpoint.
    """

    def __init__(self, strategy: Strategy, servers: ServerSet) -> None:
        self.strategy = strategy
        self.endpoints = servers
        self._unstarted = 0  # requests of the tickers not started yet
        self._next: Ticket | None = None  # the ticker waiting for room to start
        self._waited: set[int] = set()

    def stop(self) -> None:
        """Start no more tickers and let no new request through; requests out may finish."""
        self.endpoints.stopping = True
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

    @property
    def left(self) -> int:
        """Return the batch's requests not yet finished, as far as they are known."""
        return self._unstarted + sum(endpoint.work for endpoint in self.endpoints)

    def _mark_tail(self) -> bool:
        """Mark urgent each ticker whose remaining chain would outlast the rest of the batch
        (the requests left over what runs at once); return True when a mark changed."""
        # Less one round: a ticker passed over at a gate that holds calls back waits about
        # a call for room, so one within a round of the critical path is on it by then.
        rounds = self.left / max(1, self.endpoints.concurrency()) - 1
        tickets = [ticket for endpoint in self.endpoints for ticket in endpoint.here.values()]
        flipped = False
        for ticket in [*tickets, *([self._next] if self._next is not None else [])]:
            urgent = bool(ticket.chain and ticket.remaining) and ticket.remaining_chain >= rounds
            flipped |= urgent != ticket.urgent
            ticket.urgent = urgent
        if flipped:  # calls already queued move with their tickers' marks
            for endpoint in self.endpoints:
                endpoint.gate.reorder()
        return flipped

    async def _follow_tail(self) -> None:
        """Keep the urgent marks current: after every change at a gate, server or ticker."""
        changed = self.endpoints.changed
        while True:
            if self._mark_tail():
                changed.set()  # an urgent ticker waiting for room or a chain slot goes now
            changed.clear()
            await changed.wait()

    async def run(self, jobs: list[Job]) -> None:
        """Run every job once; return once every started job has ended (after ``stop`` the
        others stay queued)."""
        self.endpoints.began = self.endpoints.clock()  # the hold-back rows' zero
        ordered = sorted(jobs, key=lambda j: -j.weight)
        self._unstarted = sum(job.requests for job in ordered)
        loops: list[asyncio.Task[None]] = []
        async with beside(lambda: [loop.cancel() for loop in loops]) as group:
            if self.strategy.tail:
                loops.append(group.create_task(self._follow_tail(), name="tail"))
            try:  # a TaskGroup, not ``beside``: a cut in ``_start`` must cancel the tickers
                async with asyncio.TaskGroup() as tickers:
                    await self._start(ordered, tickers)
            except BaseExceptionGroup as errors:
                raise first_error(errors) from None

    async def _start(self, ordered: list[Job], tickers: asyncio.TaskGroup) -> None:
        """Start each job as admission allows, in ``tickers``; return when all are started."""
        slots = self.strategy.tickers_in_flight
        # Jobs load their data ahead of admission, so one slow load holds nobody back.
        preparing = [tickers.create_task(_prepare(job), name=f"prepare {job.key}")
                     for job in ordered]
        pending = list(range(len(ordered)))
        order = 0
        while pending and not self.endpoints.stopping:
            index = await self._next_ready(pending, preparing)
            job = ordered[index]
            failure = preparing[index].result()
            if failure is not None:  # never admitted: it has nothing to work on
                self._unstarted -= job.requests
                await job.run(failure)
                continue
            ticket = self._next = Ticket(order, job.requests, job.chain)
            if self.strategy.tail:
                self._mark_tail()
            # Adaptive routes by share of the work left (endpoints finish together).
            self.endpoints.routing = True
            try:
                endpoint = await self.endpoints.wait_for_room(
                    slots, ticket, self._unstarted if slots is None else None)
            finally:
                self.endpoints.routing, self._next = False, None
            if endpoint is None:
                break  # stopping: the tickers not started stay queued, for a resume
            order += 1
            self._unstarted -= job.requests
            # Until it asks, the endpoint's room counts one request for it (Server.starting):
            # the next start need not wait for this one's first turn.
            tickers.create_task(_one(job, TickerClient(self.endpoints, endpoint, ticket)),
                                name=job.key)
        for task in preparing:
            task.cancel()

    async def _next_ready(self, pending: list[int],
                          preparing: list[asyncio.Task[Exception | None]]) -> int:
        """Take the heaviest pending job whose preparation is over, waiting if none is.

        The heaviest of all is waited for once, ``PREPARE_PATIENCE_S``, before a lighter
        ready one overtakes it.
        """
        first = pending[0]
        if not preparing[first].done() and first not in self._waited:
            self._waited.add(first)
            await asyncio.wait([preparing[first]], timeout=PREPARE_PATIENCE_S)
        while True:
            for index in pending:
                if preparing[index].done():
                    pending.remove(index)
                    return index
            await asyncio.wait([preparing[i] for i in pending],
                               return_when=asyncio.FIRST_COMPLETED)


async def _one(job: Job, client: TickerClient) -> None:
    try:
        await job.run(client)
    finally:
        client.close()  # unless the job did, before its own end work


async def _prepare(job: Job) -> Exception | None:
    """Run what ``job`` needs before admission; return its failure (the job fails alone)."""
    try:
        if job.prepare is not None:
            await job.prepare()
    except Exception as exc:  # reported by run(), as the job's outcome
        return exc
    return None
