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
import functools
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from app.batch.admission import AdmissionPolicy
from app.batch.budget import TokenBudget
from app.batch.gate import Gate, GatedLLM, Ticket
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
    requests: int = 0  # expected requests, 0 when unknown
    chain: int = 0  # the longest run of them that must go one after another


POLICY_KNOBS = ("initial", "minimum", "maximum", "kv_high", "kv_full", "queue_allowance",
                "backoff")
# The token budget's knobs (app/batch/budget.py), prefixed where a policy knob has the name.
BUDGET_KNOBS = {"fill": "fill", "overbook": "overbook", "overbook_max": "overbook_max",
                "overbook_step": "overbook_step", "rise_after": "rise_after", "calm": "calm",
                "high_cut": "high_cut", "budget_backoff": "backoff",
                "out_quantile": "out_quantile", "min_samples": "min_samples"}
WHOLE_BUDGET_KNOBS = ("min_samples", "rise_after", "calm")


@dataclass(frozen=True)
class Strategy:
    """How much work is in flight: by the server's gauges, or by a fixed count of tickers."""

    name: str
    tickers_in_flight: int | None = None  # None: start a ticker whenever the gate has room
    request_limit: int | None = None  # a fixed cap on outstanding requests
    adaptive: bool = False
    tail: bool = False  # urgent tickers (see the module's doc) start at once and go first
    policy: tuple[tuple[str, float], ...] = ()  # admission policy settings that differ
    budget: bool = False  # admit by a KV token budget too, when the capacity is known
    budget_knobs: tuple[tuple[str, float], ...] = ()  # token budget settings that differ

    @classmethod
    def parse(cls, name: str) -> Strategy:
        """Parse ``adaptive[:knob=value,...]``, ``sequential``, ``fixed-N`` or ``fixed-all``.

        Knobs are the admission policy's fields, the token budget's (``fill``, ``overbook``,
        ``overbook_max``, ``overbook_step``, ``rise_after``, ``calm``, ``high_cut``,
        ``budget_backoff``, ``out_quantile``, ``min_samples``), ``tail=on|off`` and
        ``budget=on|off``, so a bench can put variants side by side:
        ``adaptive:kv_high=0.95,queue_allowance=0,tail=off`` or ``adaptive:budget=off``.
        """
        base, _, knobs = name.partition(":")
        if base == "adaptive":
            tail, budget, policy, budget_knobs = True, True, [], []
            for knob in filter(None, knobs.split(",")):
                key, _, value = knob.partition("=")
                if key in ("tail", "budget") and value in ("on", "off"):
                    if key == "tail":
                        tail = value == "on"
                    else:
                        budget = value == "on"
                elif key in POLICY_KNOBS and _is_number(value):
                    policy.append((key, float(value)))
                elif key in BUDGET_KNOBS and _is_number(value):
                    budget_knobs.append((BUDGET_KNOBS[key], float(value)))
                else:
                    raise InputError(
                        f"bad knob {knob!r} in strategy {name!r} (tail=on|off, budget=on|off, "
                        f"or a number for {', '.join((*POLICY_KNOBS, *BUDGET_KNOBS))})")
            strategy = cls(name, adaptive=True, tail=tail, policy=tuple(policy), budget=budget,
                           budget_knobs=tuple(budget_knobs))
            try:
                strategy.token_budget()
            except ValueError as error:
                raise InputError(f"strategy {name!r}: {error}") from None
            return strategy
        if knobs:
            raise InputError(f"only adaptive takes knobs, not {name!r}")
        if name == "sequential":
            # TradingAgents' way: one ticker, one request at a time.
            return cls(name, tickers_in_flight=1, request_limit=1)
        if name == "fixed-all":
            # Every ticker's graph in flight at once, dependencies still respected.
            return cls(name, tickers_in_flight=UNBOUNDED)
        match = re.fullmatch(r"fixed-(\d+)", name)
        if match and int(match.group(1)) > 0:
            return cls(name, tickers_in_flight=int(match.group(1)))
        raise InputError(f"unknown strategy {name!r} (adaptive, sequential, fixed-N, "
                         "fixed-all)")

    def admission_policy(self, maximum: int) -> AdmissionPolicy:
        knobs: dict[str, Any] = {"maximum": maximum}
        for key, value in self.policy:
            knobs[key] = int(value) if key in ("initial", "minimum", "maximum",
                                               "queue_allowance") else value
        return AdmissionPolicy(**knobs)

    def token_budget(self) -> TokenBudget | None:
        """Return a fresh token budget for this strategy (None when it admits by count only)."""
        if not self.budget:
            return None
        knobs: dict[str, Any] = {key: int(value) if key in WHOLE_BUDGET_KNOBS else value
                                 for key, value in self.budget_knobs}
        return TokenBudget(**knobs)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class GaugeSource(Protocol):
    """Anything holding the newest metrics reading (app.batch.sampler.MetricsSampler does)."""

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
        self.policy = policy or strategy.admission_policy(llm.settings.max_concurrency)
        self.interval_s = interval_s
        limit = strategy.request_limit or (self.policy.allowed if strategy.adaptive else UNBOUNDED)
        # The budget needs the gauges: without readings it could never learn the capacity.
        self.budget = strategy.token_budget() if gauges is not None else None
        if self.budget is not None:
            # One high-water mark: once the budget owns the KV cache it is the budget's.
            self.budget.kv_high = self.policy.kv_high
        self.gate = Gate(limit, self.budget)
        self._capacity_said = False
        self.in_flight = 0
        self.started = 0
        self.left = 0  # requests of the batch not yet finished, as far as they are known
        self.tickers = 0

    def urgent(self, ticket: Ticket) -> bool:
        """Return True when the ticker's remaining chain would outlast the rest of the batch."""
        if not self.strategy.tail or not ticket.chain or not ticket.remaining:
            return False
        return ticket.remaining_chain >= self.left / max(1, self.gate.limit)

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

    async def run(self, jobs: list[Job], on_done: OnDone) -> None:
        """Run every job once; a failing job is reported to ``on_done``, never raised."""
        ordered = sorted(jobs, key=lambda j: -j.weight)
        tickets = [Ticket(i, job.requests, job.chain) for i, job in enumerate(ordered)]
        self.left = sum(job.requests for job in ordered)
        self.tickers = len(tickets)
        tasks: list[asyncio.Task[None]] = []
        controller = (asyncio.create_task(self._control(), name="admission")
                      if self.strategy.adaptive and self.gauges is not None else None)
        slots = asyncio.Semaphore(self.strategy.tickers_in_flight or UNBOUNDED)
        try:
            for ticket, job in zip(tickets, ordered, strict=True):
                await slots.acquire()
                if self.strategy.tickers_in_flight is None:
                    await self.gate.wait_for_room(or_else=functools.partial(self.urgent, ticket))
                first_request = asyncio.Event()
                task = asyncio.create_task(
                    self._one(job, ticket, first_request, slots, on_done), name=job.key)
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

    async def _one(self, job: Job, ticket: Ticket, first_request: asyncio.Event,
                   slots: asyncio.Semaphore, on_done: OnDone) -> None:
        self.in_flight += 1
        self.started += 1
        result: Any = None
        error: BaseException | None = None
        try:
            result = await job.run(GatedLLM(self.llm, self.gate, ticket, first_request,
                                            rank=self.rank, on_finish=self._finished_one))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one ticker's failure never stops the others
            error = exc
        finally:
            # Requests it did not make (a failure cut it short) are no longer work left.
            self.left -= ticket.remaining
            ticket.done = max(ticket.done, ticket.requests)
            self.gate.drop_hold(ticket)
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
                self._budget_capacity()
                before = self.gate.limit
                self.gate.set_limit(self.policy.observe(snapshot, self.gate.outstanding))
                if self.gate.limit != before:
                    log.debug("admission limit", limit=self.gate.limit, reason=self.policy.reason)
                if self.budget is not None:
                    tokens = self.budget.observe(snapshot)
                    self.gate.reconsider()
                    log.debug("token budget", tokens=tokens, reserved=self.budget.reserved,
                              held=self.budget.held, reason=self.budget.reason)
            await asyncio.sleep(self.interval_s / 2)

    def admission(self) -> dict[str, Any]:
        """Return how admission ended: the request limit and, when budgeted, the token budget."""
        figures: dict[str, Any] = {"strategy": self.strategy.name,
                                   "request_limit": self.gate.limit}
        if self.strategy.adaptive:
            figures["request_limit_reason"] = self.policy.reason
            figures["token_budget"] = self.budget.summary() if self.budget else None
        return figures

    def _budget_capacity(self) -> None:
        """Give the budget the server's KV capacity; say once how admission works."""
        if self.budget is None:
            return
        capacity = getattr(self.gauges, "kv_capacity", None)
        self.budget.set_capacity(capacity, getattr(self.gauges, "block_size", None))
        if self._capacity_said:
            return
        self._capacity_said = True
        if self.budget.known:
            # The budget owns the KV cache now: the count policy's KV rules would stop
            # growth at a usage the budget has already reserved room for.
            self.policy.kv_high = self.policy.kv_full = float("inf")
            log.info("admission by token budget", kv_tokens=self.budget.capacity,
                     fill=self.budget.fill)
        else:
            log.warning("KV capacity unknown (no vllm:cache_config_info): admission by "
                        "request count only")
