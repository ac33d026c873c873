"""Decide how many LLM requests may be outstanding, from the server's own gauges.

The KV cache is the token budget's (budget.py): this count moves on the server's queue,
its preemptions and restarts, never on KV usage. The rules, reading by reading, and why:
docs/architecture.md, "The request count".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serving.metrics import MetricsSnapshot


@dataclass
class AdmissionPolicy:
    """Additive-increase / multiplicative-decrease limit on outstanding requests."""

    initial: int = 4
    minimum: int = 1
    maximum: int = 64
    queue_allowance: int = 1
    backoff: float = 0.7
    limit: float = field(init=False)
    reason: str = field(init=False, default="start")
    _saturated_once: bool = field(init=False, default=False)
    _held: float | None = field(init=False, default=None)  # the limit a blind spell set aside
    _ran_most: float = field(init=False, default=0.0)  # the most seen running at once

    def __post_init__(self) -> None:
        # Knobs come from strategy names an operator writes (``adaptive:initial=8``): a value
        # that cannot mean a limit is refused here, not met as a stall or a crash mid-night.
        for name in ("initial", "minimum", "maximum"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.queue_allowance < 0:
            raise ValueError(f"queue_allowance must be at least 0 (got {self.queue_allowance})")
        if not 0 < self.backoff < 1:
            raise ValueError(f"backoff must be in (0, 1) (got {self.backoff})")
        self.limit = float(self.fallback_limit)

    @property
    def allowed(self) -> int:
        """Return how many requests may be outstanding now."""
        return int(self.limit)

    def fall_back(self) -> int:
        """Go back to the starting limit while the gauges cannot be read: blind, never grow."""
        if self._held is None:
            self._held = self.limit
        self.limit = float(min(self.limit, self.fallback_limit))
        self.reason = "no /metrics"
        return self.allowed

    @property
    def fallback_limit(self) -> int:
        """Return the limit used without gauges: the starting one."""
        return min(max(self.initial, self.minimum), self.maximum)

    def observe(self, gauges: MetricsSnapshot, outstanding: int, *, preempted: float = 0.0,
                restarted: bool = False) -> int:
        """Update the limit from one reading with ``preempted`` preemptions since the last
        (``restarted``: a new server's); return ``allowed``."""
        held, self._held = self._held, None
        if held is not None and not restarted:
            self.limit = max(self.limit, held)

        self._ran_most = max(0.0 if restarted else self._ran_most, gauges.running)

        if restarted:
            self.limit = float(self.initial)
            self._saturated_once = False
            self.reason = "server restarted"
        elif preempted > 0:
            self._saturated_once = True
            self.limit = self.limit * self.backoff
            self.reason = f"{preempted:.0f} preemptions"
        elif (gauges.waiting > self.queue_allowance
              and gauges.running + gauges.waiting > self._ran_most):
            self.limit = min(self.limit, gauges.running + self.queue_allowance)
            self._saturated_once = True
            self.reason = "server queue building"
        elif gauges.waiting > self.queue_allowance:
            self.reason = "requests arriving"  # within what it has run: no growth, no cut
        elif outstanding >= self.allowed and gauges.waiting == 0:
            self.limit = self.limit + 1 if self._saturated_once else self.limit * 2
            self.reason = "headroom"
        else:
            self.reason = "steady"
        self.limit = float(min(max(self.limit, self.minimum), self.maximum))
        return self.allowed
