"""A batch's servers: a ``Server`` per vLLM endpoint, also when there is one, and the ``ServerSet``.

Each server has its own client, ``/metrics`` sampler (its rows name it), admission policy,
token budget and gate. ``NIGHTDESK_LLM_BASE_URL`` may list several endpoints (one vLLM per
GPU or per host). A ticker's whole chain goes to one endpoint, chosen
when it starts by the most free budget tokens (app/traffic/routing.py), so its prompt prefix
stays in that replica's cache.

An endpoint whose ``/metrics`` has failed ``MIN_FAILED_READS`` times in a row and for at
least ``endpoint_grace_s`` (the reads come every ``metrics_interval_s``) is *down*: it gets
no new tickers, and the tickers on it move to the endpoints that are up (app/traffic/client.py:
a chain goes on from its next call there; a call in flight is cancelled and sent again).
A read that succeeds again makes it *up*; a restarted server's reset counters are handled by
its own admission policy and budget, as with one server.

With one endpoint no call ever moves: the set runs that server's outage watch
(app/traffic/outage.py), which holds its gate and waits out a server that is down.
When every endpoint is down, a call that failed waits for one to come back, as with one
server: for at most the outage budget (``outage_budget_s``) from the moment the last one
went down; past it the batch is halted as ``interrupted`` (exit 5), its tickers resumable,
none failed for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from sqlalchemy import Engine

from app.config import Settings
from app.errors import ServerOutage
from app.llm import CallStats, TrackedLLM
from app.promptsize import PromptCounter
from app.traffic.admission import AdmissionPolicy
from app.traffic.chains import prefetch_depth
from app.traffic.clock import Clock, loop_clock
from app.traffic.gate import Gate
from app.traffic.halt import Halt, HaltReason
from app.traffic.holdback import CHAIN_CAP, ROOM, HoldBack
from app.traffic.limits import Limits
from app.traffic.outage import ServerWatch
from app.traffic.routing import Load, choose
from app.traffic.sampler import MetricsSampler
from app.traffic.strategy import Strategy
from app.traffic.tasks import cancel_and_wait, wait_first
from app.traffic.ticket import Ticket
from app.usage import UsageRecorder
from serving.urls import redact

log = structlog.get_logger(__name__)

# One slow or lost read is not an outage, however short the grace is set.
MIN_FAILED_READS = 2


class GaugeSource(Protocol):
    """Anything holding the newest metrics reading (app.traffic.sampler.MetricsSampler does)."""

    @property
    def latest(self) -> Any: ...


class Server:
    """One vLLM server of a batch: its client, gauges, admission policy, token budget and gate."""

    def __init__(self, index: int, url: str, llm: TrackedLLM, strategy: Strategy, *,
                 gauges: GaugeSource | None = None, policy: AdmissionPolicy | None = None,
                 changed: asyncio.Event | None = None, grace_s: float = 10.0) -> None:
        self.index = index
        self.url = url
        # What logs, summaries and messages call it: the URL without its password.
        self.name = redact(url)
        self.llm = llm
        self.gauges = gauges
        self.strategy = strategy
        counter = llm if isinstance(llm, PromptCounter) else None  # fakes count nothing
        self.limits = Limits(strategy, llm.settings.max_concurrency, gauged=gauges is not None,
                             policy=policy, counted=counter.counts if counter else None,
                             name=self.name)
        self.gate = Gate(self.limits.first_request_limit, self.limits.budget, changed=changed,
                         counter=counter)
        self.holdback = HoldBack()  # what kept new tickers from starting here, per reading
        self.grace_s = grace_s
        self.up = True
        self.gone = asyncio.Event()  # set while the endpoint is down
        self.here: dict[int, Ticket] = {}  # tickers whose calls go here now, by start order
        self.started = 0  # tickers routed here when they started
        self.moved_in = 0
        self.moved_out = 0
        self.outages = 0
        self.watched_since: float | None = None  # when its reads began (loop time)

    def arrive(self, ticket: Ticket) -> None:
        """Count a ticker whose calls now go here."""
        self.here[ticket.order] = ticket

    def leave(self, ticket: Ticket) -> None:
        """Stop counting a ticker here: it ended, or moved to another endpoint."""
        self.here.pop(ticket.order, None)

    @property
    def tickers(self) -> int:
        """Return how many tickers' calls go here now."""
        return len(self.here)

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

    def _capped(self, slots: int) -> bool:
        """Return True when a new ticker may not start here under ``slots`` chains."""
        if not (self.strategy.prefetch and any(t.fan_out for t in self.here.values())):
            return self.tickers >= slots  # no fan-out to run ahead: a ticker is a chain
        chain = max((t.chain for t in self.here.values()), default=0)
        return self.fanning >= prefetch_depth(slots, self.chains, chain)

    async def enter_chain(self, ticket: Ticket) -> None:
        """Wait until a ticker whose fan-out is done may start its chain (prefetching).

        A chain slot is free, or nothing is capped yet, or the ticker is urgent, or the
        endpoint is down or its gate closed (the call then meets what any call there
        meets). While it waits
        it holds no budget tokens: its chain's prompts open with its analysts' reports, not
        their prompts, so no cached prefix is lost. A ticker without a fan-out of that
        shape (a chain only, or samples side by side) is a chain from its first call.
        """
        if ticket.chained:
            return
        if ticket.fan_out and ticket.done < ticket.fan_out:
            return  # a call of its fan-out: what prefetching runs early
        if ticket.fan_out and ticket.outstanding == 0:
            waited = False
            while True:
                slots = self.chain_slots()
                if (slots is None or self.chains < slots or not self.up or ticket.urgent
                        or self.gate.closed):
                    break
                if not waited:
                    waited = True
                    if ticket.held_by is not None:
                        ticket.held_by.release_hold(ticket)
                self.gate.changed.clear()
                await self.gate.changed.wait()
        ticket.chained = True

    def concurrency(self) -> int:
        """Return the requests this endpoint runs at once: its limit, or the chains that fit."""
        return self.limits.concurrency(self.gate.limit)

    def load(self, ticker_slots: int | None, weight: float = 1.0) -> Load:
        """Return what routing sees of this endpoint now."""
        if ticker_slots is not None:
            room = self.tickers < ticker_slots
        else:
            # Adaptive: a request would go at once, and one more chain fits (chains.py).
            slots = self.chain_slots()
            room = self.gate.has_room() and (slots is None or not self._capped(slots))
        return Load(self.index, self.up, room,
                    budget.free if (budget := self.limits.budget) is not None else None,
                    max(0, self.gate.limit - self.gate.outstanding), self.tickers,
                    self.work, weight)

    def blocker(self) -> str:
        """Return the first thing short for a new ticker here, in the order ``load`` checks."""
        short = self.gate.short()
        if short is not None:
            return short
        slots = self.chain_slots()
        if slots is not None and self._capped(slots):
            return CHAIN_CAP
        return ROOM

    def note_start_wait(self, t_s: float) -> None:
        """Record what held a new ticker back at this reading, ``t_s`` into the batch."""
        budget = self.limits.budget
        self.holdback.note(t_s, self.blocker(), {
            "tickers": self.tickers, "chain_slots": self.chain_slots(),
            "request_limit": self.gate.limit, "outstanding": self.gate.outstanding,
            "queued": self.gate.waiting,
            "budget_limit": budget.limit if budget is not None else None,
            "reserved": budget.reserved if budget is not None else None,
            "held": budget.held if budget is not None else None,
            # Prefetching's two counts (None without it): chains let in, tickers fanning out.
            **({"chains": self.chains, "fanning": self.fanning}
               if self.strategy.prefetch else {})})

    def judge(self, now: float) -> bool:
        """Update up/down from the sampler's reads; return True when the state changed."""
        failed = getattr(self.gauges, "failed_in_a_row", 0)
        last_ok = getattr(self.gauges, "last_ok_at", None)
        if self.up:
            since = last_ok if last_ok is not None else self.watched_since
            if failed >= MIN_FAILED_READS and since is not None and now - since >= self.grace_s:
                self.up = False
                self.outages += 1
                self.gone.set()
                log.warning("endpoint down: its tickers move to the others", endpoint=self.name,
                            failed_reads=failed, silent_s=round(now - since, 1))
                return True
        elif failed == 0 and last_ok is not None:
            self.up = True
            self.gone.clear()
            log.info("endpoint back: it takes tickers again", endpoint=self.name)
            return True
        return False

    def admit(self, snapshot: Any) -> None:
        """Move the limits with one new reading (the sampler's KV capacity with it)."""
        self.limits.observe(snapshot, self.gate, self.here.values(),
                            getattr(self.gauges, "kv_capacity", None),
                            getattr(self.gauges, "block_size", None))

    def summary(self) -> dict[str, Any]:
        """Return how this endpoint's admission ended and what routing gave it."""
        figures: dict[str, Any] = {
            "request_limit": self.gate.limit, "tickers_started": self.started,
            "tickers_moved_in": self.moved_in, "tickers_moved_out": self.moved_out,
            "outages": self.outages, "up": self.up}
        if self.strategy.adaptive:
            figures.update(self.limits.summary())
            figures["new_tickers_held_back"] = self.holdback.summary()
        return figures


@dataclass
class _Combined:
    """Several endpoints' newest gauges as one (for live progress): summed, KV the highest."""

    running: float
    waiting: float
    kv_cache_usage: float


class ServerSet:
    """The endpoints of one batch, in the configured order; routing and failover over them."""

    def __init__(self, endpoints: list[Server], changed: asyncio.Event, *,
                 halt: Halt | None = None, outage_budget_s: float = float("inf"),
                 resume_hint: str = "", watch: ServerWatch | None = None,
                 clock: Clock = loop_clock) -> None:
        self.endpoints = endpoints
        # What health is judged by: grace periods and the outage budget run on it.
        self.clock = clock
        # One server's outage watch (app/traffic/outage.py): it holds that server's gate
        # while the server does not answer. Several servers fail over instead (below).
        self.watch = watch
        self._watching: asyncio.Task[None] | None = None
        # Shared by every gate, and set when a ticker ends or an endpoint changes state:
        # whoever waits for room anywhere wakes.
        self.changed = changed
        self._health = asyncio.Event()
        # Every endpoint down: since when (loop time), and whether the budget ran out.
        self.halt = halt
        self.outage_budget_s = outage_budget_s
        self.resume_hint = resume_hint
        self.all_down_since: float | None = None
        self.gave_up = asyncio.Event()
        self.stopping = False  # the batch starts no more tickers

    @classmethod
    def single(cls, llm: TrackedLLM, strategy: Strategy, *, gauges: GaugeSource | None = None,
               policy: AdmissionPolicy | None = None) -> ServerSet:
        """Wrap one client and its gauges: a batch against one server, as it always was."""
        changed = asyncio.Event()
        url = getattr(llm, "base_url", "")
        return cls([Server(0, url, llm, strategy, gauges=gauges, policy=policy,
                             changed=changed)], changed)

    @classmethod
    def connect(cls, settings: Settings, strategy: Strategy, recorder: UsageRecorder, *,
                engine: Engine, batch_id: int, sample: bool = True,
                http_client: Any = None, max_in_flight: int | None = None,
                attempts_before: Mapping[tuple[str, str, int], int] | None = None,
                halt: Halt, resume_hint: str = "", clock: Clock = loop_clock,
                ) -> ServerSet:
        """Make a client and sampler for every configured endpoint (through ``http_client``).

        One endpoint gets an outage watch, which its client consults after a server fault;
        with several, failover takes its place. Either way ``halt`` stops the batch when
        no server answers for ``outage_budget_s``.
        """
        changed = asyncio.Event()
        urls = settings.base_urls
        watch = None
        if len(urls) == 1:
            watch = ServerWatch(urls[0], budget_s=settings.outage_budget_s,
                                interval_s=settings.server_probe_interval_s, halt=halt,
                                client=http_client, resume_hint=resume_hint, clock=clock)
        endpoints = []
        for index, url in enumerate(urls):
            llm = TrackedLLM(settings, recorder, http_client=http_client, base_url=url,
                             max_in_flight=max_in_flight,
                             watch=watch,
                             attempts_before=attempts_before)
            sampler = None
            # With several endpoints the reads also say which are up, so they run even when
            # no rows are to be stored.
            if sample or len(urls) > 1:
                sampler = MetricsSampler(url, engine if sample else None, batch_id,
                                         interval_s=settings.metrics_interval_s,
                                         client=http_client, endpoint=url, clock=clock)
            endpoints.append(Server(index, url, llm, strategy, gauges=sampler,
                                      changed=changed, grace_s=settings.endpoint_grace_s))
        if len(endpoints) > 1:
            log.info("endpoints", urls=[e.name for e in endpoints],
                     grace_s=settings.endpoint_grace_s)
        if watch is not None:
            watch.gate = endpoints[0].gate
        return cls(endpoints, changed, halt=halt, outage_budget_s=settings.outage_budget_s,
                   resume_hint=resume_hint, watch=watch, clock=clock)

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

    # --- routing -------------------------------------------------------------------------

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
        """Return the requests the endpoints that are up run together: each one's limit, or
        the chains its budget keeps going where fewer."""
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
        """Return the endpoint that is up to take over ``endpoint``'s tickers (None: none is)."""
        chosen = choose(self.loads(), need_room=False, exclude=endpoint.index,
                        down_if_all=False)
        return None if chosen is None else self.endpoints[chosen]

    async def after_failure(self, endpoint: Server, started_at: float, *,
                            reached: bool = True) -> Server | None:
        """Return where a call that failed at ``endpoint`` goes next; None: it fails, as today.

        Called for failures of the server (connection, stream, timeout, 5xx), once the
        client's own retries are spent. The endpoint's next reads decide: down (the grace
        ran out) sends the call to an endpoint that is up; up again after reads failed
        during the call (a restart) sends it again to the best endpoint, this one included;
        reads that never failed make it the request's own failure — unless the call never
        ``reached`` the server (refused connections say the server was away, whatever a
        lagging reader saw), which is sent again like a restart. With one endpoint the call
        fails: its outage is the client's own watch's to wait out.
        """
        if not self.several or endpoint.gauges is None:
            return None
        sampler = endpoint.gauges
        failed_at = self.clock()
        event: asyncio.Event | None = getattr(sampler, "read", None)
        while True:
            self.judge_all(self.clock())
            if not endpoint.up:
                other = self.alternative(endpoint)
                if other is not None or self.halt is None:
                    return other
                # Every endpoint is down: wait for one to come back, or the budget to end.
                while self.all_down_since is not None and not self.gave_up.is_set():
                    changed = self._health  # taken now: a change meanwhile replaces it
                    await wait_first(changed.wait(), self.gave_up.wait())
                if self.gave_up.is_set():
                    raise ServerOutage(self.outage_message())
                continue
            last_ok = getattr(sampler, "last_ok_at", None)
            if last_ok is not None and last_ok > failed_at:
                last_failed = getattr(sampler, "last_failed_at", None)
                if reached and (last_failed is None or last_failed < started_at):
                    return None
                chosen = choose(self.loads(), need_room=False, down_if_all=False)
                return None if chosen is None else self.endpoints[chosen]
            if event is None:
                return None
            event.clear()
            # Bounded: a read ends within its own timeout, and reads keep coming.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=endpoint.grace_s)

    def health_event(self) -> asyncio.Event:
        """Return the event set at the next time an endpoint goes down or comes back.

        Taken when called, not when first awaited: a coroutine that read ``_health`` only
        once it ran would wait on the event that replaced it, missing a change that came
        between its caller's look at the endpoint and its own start.
        """
        return self._health

    def judge_all(self, now: float) -> None:
        """Decide every endpoint's health from its reads; wake whoever waits on a change.

        Also keeps the outage budget of a batch whose endpoints are all down.
        """
        changed = any([endpoint.judge(now) for endpoint in self.endpoints])
        if self.several and self.halt is not None:
            self._judge_all_down(now)
        if changed:
            self._health.set()
            self._health = asyncio.Event()
            self.changed.set()

    def _judge_all_down(self, now: float) -> None:
        if any(endpoint.up for endpoint in self.endpoints):
            if self.all_down_since is not None:
                log.warning("an endpoint answers again: calls go on",
                            down_s=round(now - self.all_down_since, 1))
                self.all_down_since = None
        elif self.all_down_since is None:
            self.all_down_since = now
            log.warning("every endpoint is down: calls wait for one to come back",
                        budget_s=self.outage_budget_s)
        elif now - self.all_down_since > self.outage_budget_s and not self.gave_up.is_set():
            self.gave_up.set()
            assert self.halt is not None
            self.halt.request(HaltReason("interrupted", self.outage_message(),
                                         ServerOutage.exit_code))

    def outage_message(self) -> str:
        """Say what an outage of every endpoint past the budget did (the batch's one line)."""
        return (f"none of the {len(self.endpoints)} LLM endpoints answered for "
                f"{self.outage_budget_s:.0f} s (the outage budget): batch interrupted"
                f"{self.resume_hint}")

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start every endpoint's sampler, and the outage watch of one server; the grace of
        an endpoint that never answers runs from here."""
        now = self.clock()
        for endpoint in self.endpoints:
            endpoint.watched_since = now
            if isinstance(endpoint.gauges, MetricsSampler):
                await endpoint.gauges.start()
        if self.watch is not None and self._watching is None:
            self._watching = asyncio.create_task(self.watch.run(), name="server-watch")

    async def stop(self) -> None:
        """Stop the outage watch, then every sampler (each takes its last reading)."""
        if self._watching is not None:
            await cancel_and_wait(self._watching)
            self._watching = None
        for endpoint in self.endpoints:
            if isinstance(endpoint.gauges, MetricsSampler):
                await endpoint.gauges.stop()

    async def aclose(self) -> None:
        for endpoint in self.endpoints:
            await endpoint.llm.aclose()

    def note_metrics(self, ok: bool) -> None:
        """Tell the outage watch of one server whether a /metrics reading was taken."""
        if self.watch is not None:
            self.watch.note_metrics(ok)

    @property
    def outages(self) -> list[dict[str, Any]]:
        """Return the outages the watch of one server saw (start, seconds), for the batch."""
        return self.watch.outages if self.watch is not None else []

    def controlled(self, adaptive: bool) -> bool:
        """Tell whether a control loop has work: admission by gauges, or several to watch.

        The loop itself is the scheduler's (``Scheduler._control``): it also tracks /metrics
        readings that fail, for the outage watch of one server.
        """
        return self.several or (adaptive and self.first.gauges is not None)

    # --- what progress and reports read -------------------------------------------------

    @property
    def stats(self) -> CallStats:
        """Return every endpoint's call totals added up."""
        parts = [endpoint.llm.stats for endpoint in self.endpoints]
        starts = [p.first_start for p in parts if p.first_start is not None]
        ends = [p.last_end for p in parts if p.last_end is not None]
        return CallStats(sum(p.calls for p in parts), sum(p.failed for p in parts),
                         sum(p.prompt_tokens for p in parts),
                         sum(p.completion_tokens for p in parts),
                         min(starts) if starts else None, max(ends) if ends else None)

    @property
    def latest(self) -> _Combined | None:
        """Return the endpoints' newest gauges combined (None before any reading)."""
        readings = [getattr(e.gauges, "latest", None) for e in self.endpoints]
        seen = [r for r in readings if r is not None]
        if not seen:
            return None
        return _Combined(sum(r.running for r in seen), sum(r.waiting for r in seen),
                         max(r.kv_cache_usage for r in seen))

    def summary(self) -> dict[str, dict[str, Any]]:
        return {endpoint.name: endpoint.summary() for endpoint in self.endpoints}
