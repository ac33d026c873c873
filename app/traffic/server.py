"""A batch's servers: a ``Server`` per vLLM endpoint, also when there is one, and the
``ServerSet`` over them (routing, failover, one outage clock).

Each server has its own client, ``/metrics`` reader, limits and gate, and one health rule:
down after two failed readings in a row, or one asked for after a server fault; up at the
next good one (docs/architecture.md, "One health rule, for one server and several").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx
import structlog
from sqlalchemy import Engine

from app.config import Settings
from app.errors import ServerOutage
from app.llm import TrackedLLM
from app.promptsize import PromptCounter
from app.tasks import beside
from app.traffic.chains import prefetch_depth
from app.traffic.clock import Clock, loop_clock
from app.traffic.gate import Gate
from app.traffic.halt import Halt, HaltReason
from app.traffic.holdback import CHAIN_CAP, ROOM, HoldBack
from app.traffic.limits import Limits
from app.traffic.routing import Load, choose
from app.traffic.sampler import MetricsSampler
from app.traffic.strategy import Strategy
from app.traffic.ticket import Ticket
from app.usage import UsageRecorder
from serving.metrics import MetricsSnapshot
from serving.urls import redact

log = structlog.get_logger(__name__)

# Readings failed in a row that make a server down: one slow or lost read is no outage.
MIN_FAILED_READS = 2
HOLD = "server down"  # the gate's hold while the server is down


class GaugeSource(Protocol):
    """A server's reader (MetricsSampler is one): its server takes each reading, None if failed."""

    interval_s: float | None  # None: it reads only when asked, so no gauges to admit by
    kv_capacity: int | None  # the KV cache's tokens and block, as the last reading published
    block_size: int | None
    fleet_read: int | None  # servers read behind a router at the last reading

    @property
    def latest(self) -> MetricsSnapshot | None: ...

    async def read(self) -> MetricsSnapshot | None: ...

    async def store(self, snapshot: MetricsSnapshot, chain_slots: int | None) -> None: ...

    async def fresh(self) -> None: ...


class Server:
    """One vLLM server of a batch: its client, gauges, admission policy, token budget and gate."""

    def __init__(self, index: int, url: str, llm: TrackedLLM, strategy: Strategy, *,
                 gauges: GaugeSource | None = None, changed: asyncio.Event | None = None,
                 clock: Clock = loop_clock, counter: PromptCounter | None = None) -> None:
        """``counter`` (the client itself, for a TrackedLLM) counts prompts with the server's
        /tokenize for the token budget; None: the budget costs by bytes until answers come."""
        self.index = index
        self.name = redact(url)  # what logs and summaries call it: no password
        self.llm = llm
        self.gauges = gauges
        self._taking: asyncio.Task[None] | None = None  # takes the reader's paced readings
        self.strategy = strategy
        # A reader that reads only when asked (no interval) gives no gauges to admit by.
        gauged = gauges is not None and gauges.interval_s is not None
        self.limits = Limits(strategy, llm.settings.calls.max_concurrency, gauged=gauged,
                             counted=counter.counted if counter else None, name=self.name)
        self.gate = Gate(self.limits.first_request_limit, self.limits.budget, changed=changed,
                         counter=counter, clock=clock)
        self.holdback = HoldBack()  # what kept new tickers from starting here, per reading
        self.clock = clock  # what outages are timed on
        self.servers: ServerSet | None = None  # the set, told of every reading
        self.up = True
        self.outages_seen: list[dict[str, Any]] = []  # start and seconds of each, for the batch
        self.last_failed_at: float | None = None  # when a reading last failed
        self._suspect = False  # a call met a server fault: the next failed reading is down
        self._down_since = 0.0
        self.here: dict[int, Ticket] = {}  # tickers whose calls go here now, by start order
        self.started = 0  # tickers routed here when they started
        self.moved_in = 0
        self.moved_out = 0

    def arrive(self, ticket: Ticket) -> None:
        """Count a ticker whose calls now go here."""
        self.here[ticket.order] = ticket

    def leave(self, ticket: Ticket) -> None:
        """Stop counting a ticker here: it ended, or moved to another endpoint."""
        self.here.pop(ticket.order, None)

    @property
    def tickers(self) -> int:
        return len(self.here)

    @property
    def starting(self) -> int:
        """Return the tickers started here whose first request has not asked the gate yet."""
        return sum(1 for ticket in self.here.values() if not ticket.asked)

    @property
    def work(self) -> int:
        """Return the requests the tickers here have left."""
        return sum(ticket.remaining for ticket in self.here.values())

    def chain_slots(self) -> int | None:
        """Return the tickers whose chains the budget keeps going at once (None: no cap)."""
        return self.limits.chain_slots()

    @property
    def chains(self) -> int:
        """Return the tickers here whose chain was let in (prefetching) and is not over."""
        return sum(1 for t in self.here.values() if t.chained and not t.finished)

    @property
    def fanning(self) -> int:
        """Return the tickers here in their fan-out or waiting for a chain slot."""
        return sum(1 for t in self.here.values() if t.fanning)

    def _capped(self) -> bool:
        """Return True when the chains the budget keeps going leave no room for a new ticker."""
        slots = self.chain_slots()
        if slots is None:
            return False
        if not (self.strategy.prefetch and any(t.fan_out for t in self.here.values())):
            return self.tickers >= slots  # no fan-out to run ahead: a ticker is a chain
        chain = max((t.chain for t in self.here.values()), default=0)
        return self.fanning >= prefetch_depth(slots, self.chains, chain)

    async def enter_chain(self, ticket: Ticket) -> bool:
        """Wait until a ticker whose fan-out is done may start its chain (prefetching).

        It goes once a chain slot is free, nothing is capped yet, it is urgent, or the
        endpoint is down or closed; while it waits it holds no budget tokens. A ticker
        without a fan-out is a chain from its first call. True: its chain has begun (its
        client marks the ticket, which only the client and the gate write).
        """
        if ticket.chained:
            return True
        if ticket.fan_out and ticket.done < ticket.fan_out:
            return False  # a call of its fan-out: what prefetching runs early
        if ticket.fan_out and ticket.outstanding == 0:
            waited = False
            while True:
                slots = self.chain_slots()
                if (slots is None or self.chains < slots or not self.up or ticket.urgent
                        or self.gate.closed):
                    break
                if not waited:
                    self.gate.release_hold(ticket)
                waited = True
                self.gate.changed.clear()
                await self.gate.changed.wait()
        return True

    def concurrency(self) -> int:
        """Return the requests this endpoint runs at once: its limit, or the chains that fit."""
        slots = self.chain_slots()
        return self.gate.limit if slots is None else min(self.gate.limit, slots)

    def load(self, ticker_slots: int | None, weight: float = 1.0) -> Load:
        """Return what routing sees of this endpoint now."""
        if ticker_slots is not None and not self.strategy.prefetch:
            room = self.tickers < ticker_slots
        else:
            # fixed-N prefetching: N chains (chain_slots) and the fan-outs that feed them.
            # Adaptive: a request would go at once beside one for each ticker started here
            # that has not asked yet, and one more chain fits (chains.py).
            room = (self.gate.has_room(self.starting if ticker_slots is None else 0)
                    and not self._capped())
        return Load(self.index, self.up, room,
                    budget.free if (budget := self.limits.budget) is not None else None,
                    max(0, self.gate.limit - self.gate.outstanding), self.tickers,
                    self.work, weight)

    def blocker(self) -> str:
        """Return the first thing short for a new ticker here, in the order ``load`` checks."""
        return (self.gate.short(starting=self.starting)
                or (CHAIN_CAP if self._capped() else ROOM))

    def note_start_wait(self, t_s: float) -> None:
        """Record what held a new ticker back at this reading, ``t_s`` into the batch."""
        budget = self.limits.budget
        self.holdback.note(t_s, self.blocker(), {
            "tickers": self.tickers, "chain_slots": self.chain_slots(),
            "request_limit": self.gate.limit, "outstanding": self.gate.outstanding,
            "queued": self.gate.waiting,
            **({"budget_limit": budget.limit, "reserved": budget.reserved, "held": budget.held}
               if budget is not None else {}),
            # Prefetching's two counts (None without it): chains let in, tickers fanning out.
            **({"chains": self.chains, "fanning": self.fanning}
               if self.strategy.prefetch else {})})

    @property
    def outages(self) -> int:
        return len(self.outages_seen)

    async def _take_all(self, gauges: MetricsSampler) -> None:
        async with contextlib.aclosing(gauges.readings()) as readings:
            async for snapshot in readings:
                await self._take(snapshot)

    async def sample_once(self) -> MetricsSnapshot | None:
        """Take a reading now, apply it and store it; return it (None: it failed)."""
        assert self.gauges is not None
        return await self._take(await self.gauges.read())

    async def _take(self, snapshot: MetricsSnapshot | None) -> MetricsSnapshot | None:
        if snapshot is not None and (not self.up or not self.llm.asked):
            # First read, or back from down: a restart may serve other weights under the
            # same name. The server stays down (no call goes to it) and the batch stops.
            other = await self.llm.other_model()
            if other is not None and self.servers is not None and self.servers.halt:
                self.servers.halt.request(HaltReason("failed", other, 2))
                snapshot = None
        self.reading(snapshot)
        if snapshot is not None and self.gauges is not None:
            # The slots once this reading is applied: the ETA reads them from the rows.
            await self.gauges.store(snapshot, self.chain_slots())
        return snapshot

    def reading(self, snapshot: MetricsSnapshot | None) -> None:
        """Apply one /metrics reading (None: it failed): limits, then health."""
        now = self.clock()
        g, unknown = self.gauges, (None, None, None)
        self.limits.read(snapshot, now, self.gate, self.here.values(),
                         *((g.kv_capacity, g.block_size, g.fleet_read) if g else unknown))
        servers = self.servers
        if snapshot is None:
            self.last_failed_at = now
            if self.up and (self.limits.failed >= MIN_FAILED_READS or self._suspect):
                self._went(up=False, now=now)
        else:
            self._suspect = False
            if self.strategy.adaptive and servers is not None and servers.routing:
                self.note_start_wait(now - servers.began)
            if not self.up:
                self._went(up=True, now=now)
        if servers is not None:
            servers.judge(now)

    def _went(self, *, up: bool, now: float) -> None:
        self.up = up
        if up:
            seconds = round(now - self._down_since, 1)
            self.outages_seen[-1]["seconds"] = seconds
            self.gate.release(HOLD)
            log.warning("LLM server answers again: admission resumes", endpoint=self.name,
                        down_s=seconds)
        else:
            self._down_since = now
            self.outages_seen.append({"endpoint": self.name, "seconds": None,
                                      "start": datetime.now(UTC).isoformat()})
            self.gate.hold(HOLD)
            log.warning("LLM server does not answer: admission paused, its tickers move to "
                        "a server that is up", endpoint=self.name,
                        failed_reads=self.limits.failed)
        if self.servers is not None:
            self.servers.health_changed()

    async def check(self) -> None:
        """After a server fault: take a reading now; a failed one makes the server down."""
        if self.gauges is not None:
            self._suspect = True
            # Its paced readings take one now; none paced (not started, or over): read here.
            taking = self._taking is not None and not self._taking.done()
            await (self.gauges.fresh() if taking else self.sample_once())


class ServerSet:
    """A batch's endpoints in the configured order: routing, failover, one outage clock."""

    def __init__(self, endpoints: list[Server], changed: asyncio.Event, *,
                 halt: Halt | None = None, outage_budget_s: float = float("inf"),
                 clock: Clock = loop_clock) -> None:
        self.endpoints = endpoints
        for endpoint in endpoints:
            endpoint.servers = self
        self.clock = clock  # what the outage budget runs on
        self.changed = changed  # every gate's, also set when a ticker ends or a server changes
        self._health = asyncio.Event()
        # Every endpoint down: since when, and whether the budget ran out.
        self.halt = halt
        self.outage_budget_s = outage_budget_s
        self.all_down_since: float | None = None
        self.gave_up = asyncio.Event()
        self.routing = False  # a ready ticker waits for room: readings note what held it
        self.began = 0.0  # when the scheduler began: the hold-back rows' zero
        self.stopping = False  # the batch starts no more tickers

    @classmethod
    def connect(cls, settings: Settings, strategy: Strategy, recorder: UsageRecorder, *,
                engine: Engine, batch_id: int, sample: bool = True,
                http_client: httpx.AsyncClient | None = None, max_in_flight: int | None = None,
                halt: Halt, clock: Clock = loop_clock,
                ) -> ServerSet:
        """Make a client (its pool ``max_in_flight`` connections, None: no cap) and a /metrics
        reader for every configured endpoint.

        The readers store rows when ``sample``, and read on their interval when sampling or
        with several endpoints, else only after a server fault (health, no gauges). ``halt``
        stops the batch when no server answers for ``outage_budget_s``.
        """
        changed = asyncio.Event()
        urls = settings.llm.urls
        periodic = sample or len(urls) > 1
        endpoints = []
        for index, url in enumerate(urls):
            interval_s = settings.llm.metrics_interval_s if periodic else None
            sampler = MetricsSampler(url, engine if sample else None, batch_id,
                                     interval_s=interval_s,
                                     probe_s=settings.llm.server_probe_interval_s,
                                     client=http_client, endpoint=url,
                                     fleet=settings.llm.router_urls, discover=True)
            llm = TrackedLLM(settings, recorder, http_client=http_client, base_url=url,
                             max_in_flight=max_in_flight)
            endpoints.append(Server(index, url, llm, strategy, gauges=sampler, changed=changed,
                                    clock=clock, counter=llm))
        if len(endpoints) > 1:
            log.info("endpoints", urls=[e.name for e in endpoints])
        return cls(endpoints, changed, halt=halt, outage_budget_s=settings.batch.outage_budget_s,
                   clock=clock)

    def __iter__(self) -> Iterator[Server]:
        return iter(self.endpoints)

    def __len__(self) -> int:
        return len(self.endpoints)

    @property
    def first(self) -> Server:
        return self.endpoints[0]

    @property
    def several(self) -> bool:
        return len(self.endpoints) > 1

    def loads(self, ticker_slots: int | None = None) -> list[Load]:
        # Shares of the work follow KV capacity where every endpoint's is known.
        capacities = [e.limits.budget.capacity if e.limits.budget is not None else None
                      for e in self.endpoints]
        known = all(capacity for capacity in capacities)
        return [endpoint.load(ticker_slots, float(capacity) if known and capacity else 1.0)
                for endpoint, capacity in zip(self.endpoints, capacities, strict=True)]

    def _serving(self) -> list[Server]:
        """Return the endpoints that are up (all of them, if none is)."""
        return [e for e in self.endpoints if e.up] or self.endpoints

    def request_limit(self) -> int:
        """Return the requests the endpoints that are up admit together."""
        return sum(e.gate.limit for e in self._serving())

    def concurrency(self) -> int:
        """Return the requests the endpoints that are up run together (``Server.concurrency``)."""
        return sum(e.concurrency() for e in self._serving())

    async def wait_for_room(self, ticker_slots: int | None = None, ticket: Ticket | None = None,
                            unstarted: int | None = None) -> Server | None:
        """Return the endpoint a new ticker starts on, once one has room (None: stopping).

        ``ticker_slots`` is the tickers each endpoint may have in flight (fixed-N); None
        means room is the gate's (adaptive). An urgent ``ticket`` needs no room. With
        ``unstarted`` (the requests of the tickers not started yet) the ticker waits for an
        endpoint under its share of the batch's work left (routing.py).
        """
        while not self.stopping:
            loads = self.loads(ticker_slots)
            total = None if unstarted is None else unstarted + sum(x.work for x in loads)
            chosen = choose(loads, total_work=total)
            if chosen is None and ticket is not None and ticket.urgent:
                chosen = choose(loads, need_room=False, total_work=total)
            if chosen is not None:
                return self.endpoints[chosen]
            self.changed.clear()
            await self.changed.wait()
        return None

    def alternative(self, endpoint: Server) -> Server | None:
        """Return the endpoint that is up to take over ``endpoint``'s tickers (None: none is):
        the best under its share of the work routed, else the best.

        The share is what spreads the tickers of a server that went down: they all ask at
        once, before any has reserved tokens where it moved, so free tokens alone send every
        one to the same server (a move counts its ticker's work there at once).
        """
        loads = self.loads()
        total = sum(load.work for load in loads)
        chosen = choose(loads, need_room=False, exclude=endpoint.index, down_if_all=False,
                        total_work=total or None)
        if chosen is None:
            chosen = choose(loads, need_room=False, exclude=endpoint.index, down_if_all=False)
        return None if chosen is None else self.endpoints[chosen]

    async def after_failure(self, endpoint: Server, started_at: float, *,
                            reached: bool = True) -> Server | None:
        """Return where a call that failed at ``endpoint`` goes next; None: it fails.

        For a server fault once the client's retries are spent, a reading taken now
        decides: down sends it to a server that is up, or waits for one (ServerOutage past
        the budget); up after readings failed during the call (a restart), or a call that
        never ``reached`` the server, goes to the best server; else it is the request's own
        failure.
        """
        if endpoint.gauges is None:
            return None
        await endpoint.check()
        while not endpoint.up:
            other = self.alternative(endpoint)
            if other is not None or self.halt is None:
                return other
            if self.gave_up.is_set():
                raise ServerOutage(self.outage_message())
            await self._health.wait()  # set at every change of health, and on giving up
        failed = endpoint.last_failed_at
        if reached and (failed is None or failed < started_at):
            return None
        chosen = choose(self.loads(), need_room=False, down_if_all=False)
        return None if chosen is None else self.endpoints[chosen]

    def health_event(self) -> asyncio.Event:
        """Return the event set when an endpoint next goes down or comes back (take it before
        looking at the endpoints, or a change in between is missed)."""
        return self._health

    def health_changed(self) -> None:
        """Wake whoever waits on a server's health; start or stop the outage clock."""
        now = self.clock()
        if any(endpoint.up for endpoint in self.endpoints):
            if self.all_down_since is not None and self.several:
                log.warning("an endpoint answers again: calls go on",
                            down_s=round(now - self.all_down_since, 1))
            self.all_down_since = None
        elif self.all_down_since is None:
            self.all_down_since = now
            if self.several:
                log.warning("every endpoint is down: calls wait for one to come back",
                            budget_s=self.outage_budget_s)
        self._wake()
        self.changed.set()

    def _wake(self) -> None:
        self._health.set()
        self._health = asyncio.Event()

    def judge(self, now: float) -> None:
        """Halt the batch once every server has been down for longer than the budget."""
        if (self.all_down_since is not None and now - self.all_down_since > self.outage_budget_s
                and self.halt is not None and not self.gave_up.is_set()):
            self.gave_up.set()
            self._wake()  # calls waiting for a server stop
            for endpoint in self.endpoints:  # the outages end here, for the batch's record
                endpoint.outages_seen[-1]["seconds"] = round(now - endpoint._down_since, 1)
            self.halt.request(HaltReason("interrupted", self.outage_message(),
                                         ServerOutage.exit_code))

    def outage_message(self) -> str:
        """Say what an outage of every server past the budget did (the batch's one line)."""
        what = (f"none of the {len(self.endpoints)} LLM endpoints answered" if self.several
                else f"the LLM server at {self.first.name} did not answer")
        return f"{what} for {self.outage_budget_s:.0f} s (the outage budget): batch interrupted"

    @contextlib.asynccontextmanager
    async def taking(self) -> AsyncIterator[ServerSet]:
        """Take every endpoint's /metrics readings, and watch our loop's lag, beside the body.
        On exit the readers stop: the reading being taken and (on an interval) a last one,
        the batch's end, are applied and stored (not cancelled: no row is lost half-way)."""
        readers = [(e, e.gauges) for e in self.endpoints if isinstance(e.gauges, MetricsSampler)]
        async with beside(*(gauges.stop for _, gauges in readers)) as group:
            for endpoint, gauges in readers:
                endpoint._taking = group.create_task(endpoint._take_all(gauges),
                                                     name="metrics-sampler")
                group.create_task(gauges.watch_lag(), name="client-lag")
            yield self

    async def aclose(self) -> None:
        """Close every endpoint's clients: its LLM client's and its reader's (made here)."""
        for endpoint in self.endpoints:
            await endpoint.llm.aclose()
            if isinstance(endpoint.gauges, MetricsSampler):
                await endpoint.gauges.aclose()

    @property
    def outages(self) -> list[dict[str, Any]]:
        """Return every server's outages (endpoint, start, seconds), for the batch's record."""
        return [outage for endpoint in self.endpoints for outage in endpoint.outages_seen]
