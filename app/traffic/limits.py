"""One server's limits, moved together by each /metrics reading its server takes.

The request count (admission.py), the KV token budget (budget.py) and the chain footprint
(chains.py). The budget alone guards the KV cache, once it knows the capacity; failed
readings are counted and a restart is detected here, once, for both.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from app.promptsize import Counted
from app.traffic.chains import Footprint
from app.traffic.gate import Gate
from app.traffic.strategy import UNBOUNDED, Strategy
from app.traffic.ticket import Ticket
from serving.metrics import MetricsSnapshot

log = structlog.get_logger(__name__)


class Limits:
    """A server's request limit, KV token budget and chain footprint, under one strategy."""

    def __init__(self, strategy: Strategy, maximum: int, *, gauged: bool,
                 counted: Counted | None = None, name: str = "") -> None:
        self.strategy = strategy
        self.name = name  # the server's, for the log
        self.policy = strategy.admission_policy(maximum)
        # Behind a router one gate admits for every server: its start and ceiling are these
        # per server, times the servers read (docs/architecture.md, "Behind a router").
        self._per_server = (self.policy.initial, self.policy.maximum)
        self.servers = 1
        # The budget needs the gauges: without readings it could never learn the capacity.
        self._adaptive = gauged and strategy.adaptive
        self.budget = strategy.token_budget() if gauged else None
        if self.budget is not None and counted is not None:
            self.budget.counted = counted  # the first prompts costed by the server's own count
        # Tokens per active ticker (per chain, prefetching): how many chains fit.
        self.footprint = Footprint(chains_only=strategy.prefetch)
        self._capacity_said = False
        self._totals: tuple[float, float] | None = None  # the last reading's counters
        self.failed = 0  # readings failed in a row
        self.missed = 0  # readings failed in all
        self.blind_s = 0.0  # seconds without readings, adaptive (spells ended)
        self.blind_since: float | None = None  # when the spell going on began
        self._blind_said = False

    @property
    def first_request_limit(self) -> int:
        """Return the request limit a batch starts with: fixed, the policy's, or none."""
        return self.strategy.request_limit or (
            self.policy.allowed if self.strategy.adaptive else UNBOUNDED)

    def chain_slots(self) -> int | None:
        """Return the tickers whose chains the budget keeps going at once, or fixed-N's N
        when it prefetches (None: no cap)."""
        if self.budget is not None:
            return self.footprint.slots(self.budget.limit)
        if self.strategy.prefetch and not self.strategy.adaptive:
            return self.strategy.tickers_in_flight
        return None

    def read(self, snapshot: MetricsSnapshot | None, now: float, gate: Gate,
             tickets: Iterable[Ticket], capacity: int | None, block_size: int | None,
             servers: int | None = None) -> None:
        """Take one reading (None: it failed): count it and, adaptive with gauges, move the
        limits (readings taken only when a call asked leave them put). ``servers``: those
        read behind a router for this reading (None or 0: the endpoint counts as one)."""
        if snapshot is None:
            self.failed += 1
            self.missed += 1
            if self._adaptive and self.blind_since is None:
                self._go_blind(now, gate)
            return
        self.failed = 0
        if self.blind_since is not None:
            self.blind_s += now - self.blind_since
            self.blind_since = None
            log.info("the server's /metrics can be read again: adaptive admission resumes",
                     endpoint=self.name)
        if self._adaptive:
            self._scale(servers or 1, gate)
            self._observe(snapshot, gate, tickets, capacity, block_size)

    def _scale(self, servers: int, gate: Gate) -> None:
        """Make the request limit's start and ceiling ``servers`` times one server's, and
        move the limit in proportion: a server lost takes its share of the room with it."""
        if servers == self.servers:
            return
        policy, (initial, maximum) = self.policy, self._per_server
        policy.initial, policy.maximum = initial * servers, maximum * servers
        policy.limit = min(max(policy.limit * servers / self.servers, policy.minimum),
                           policy.maximum)
        self.servers = servers
        # Counters summed over other servers: a baseline, not a restart (their sum can fall).
        self._totals = None
        gate.set_limit(policy.allowed)
        log.info("request limit per server behind the router, summed", servers=servers,
                 limit=policy.allowed, ceiling=policy.maximum, endpoint=self.name)

    def _go_blind(self, now: float, gate: Gate) -> None:
        """Hold the limit at its start until readings return: blind, it must not grow."""
        self.blind_since = now
        gate.set_limit(self.policy.fall_back())
        if not self._blind_said:  # once, however often it happens
            self._blind_said = True
            log.warning("cannot read the server's /metrics: adaptive admission falls back "
                        "to its starting limit and pauses while the server looks down",
                        limit=gate.limit, endpoint=self.name)

    def _observe(self, snapshot: MetricsSnapshot, gate: Gate, tickets: Iterable[Ticket],
                capacity: int | None, block_size: int | None) -> None:
        """Move the request limit and the token budget with one new reading."""
        # The one baseline of the server's counters: what is new since the last reading. The
        # first reading is only the baseline; counters gone back are a restarted server's.
        totals, last = (snapshot.preemptions_total, snapshot.generation_tokens_total), self._totals
        self._totals = totals
        restarted = last is not None and (totals[0] < last[0] or totals[1] < last[1])
        preempted = generated = 0.0
        if restarted:
            log.info("server restarted: its limits start over", endpoint=self.name)
        elif last is not None:
            preempted, generated = totals[0] - last[0], totals[1] - last[1]
        self._budget_capacity(capacity, block_size)
        before = gate.limit
        gate.set_limit(self.policy.observe(snapshot, gate.outstanding, preempted=preempted,
                                           restarted=restarted))
        if gate.limit != before:
            log.debug("admission limit", limit=gate.limit, reason=self.policy.reason,
                      endpoint=self.name)
        if self.budget is not None:
            tokens = self.budget.observe(snapshot, preempted=preempted, generated=generated,
                                         restarted=restarted)
            self.footprint.sample(gate, tickets)
            gate.grant()
            log.debug("token budget", tokens=tokens, reserved=self.budget.reserved,
                      held=self.budget.held, reason=self.budget.reason, endpoint=self.name)

    def _budget_capacity(self, capacity: int | None, block_size: int | None) -> None:
        """Give the budget the server's KV capacity; say once how admission works."""
        if self.budget is None:
            return
        self.budget.set_capacity(capacity, block_size)
        if self._capacity_said:
            return
        self._capacity_said = True
        if self.budget.capacity:
            log.info("admission by token budget", kv_tokens=self.budget.capacity,
                     fill=self.budget.fill, endpoint=self.name)
        else:
            log.warning("KV capacity unknown (no vllm:cache_config_info): admission by "
                        "request count only, the KV cache guarded only by its preemption "
                        "backoff", endpoint=self.name)
