"""Name how much work is in flight: `adaptive[:knobs]`, `fixed-N`, `fixed-all`, `sequential`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from app.errors import InputError
from app.traffic.admission import AdmissionPolicy
from app.traffic.budget import TokenBudget

# "No limit": a count no batch reaches.
UNBOUNDED = 1_000_000

POLICY_KNOBS = ("initial", "minimum", "maximum", "kv_high", "kv_full", "queue_allowance",
                "backoff")
# The token budget's knobs, ``budget_`` prefixed where a policy knob has the name.
BUDGET_KNOBS = ("fill", "overbook", "overbook_max", "overbook_step", "rise_after", "calm",
                "high_cut", "budget_backoff", "out_quantile", "min_samples")
WHOLE_BUDGET_KNOBS = ("min_samples", "rise_after", "calm")

OnOff = Literal["on", "off"]


class Knobs(BaseModel):
    """What ``adaptive:knob=value,...`` may set; a knob left out keeps its default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tail: OnOff = "on"
    budget: OnOff = "on"
    prefetch: OnOff | None = None  # None: on where the budget is (it counts chains in its tokens)
    # The admission policy's (app/traffic/admission.py).
    initial: float | None = None
    minimum: float | None = None
    maximum: float | None = None
    kv_high: float | None = None
    kv_full: float | None = None
    queue_allowance: float | None = None
    backoff: float | None = None
    # The token budget's; ``budget_backoff`` is its ``backoff``.
    fill: float | None = None
    overbook: float | None = None
    overbook_max: float | None = None
    overbook_step: float | None = None
    rise_after: float | None = None
    calm: float | None = None
    high_cut: float | None = None
    budget_backoff: float | None = None
    out_quantile: float | None = None
    min_samples: float | None = None


@dataclass(frozen=True)
class Strategy:
    """How much work is in flight: by the server's gauges, or by a fixed count of tickers."""

    name: str
    tickers_in_flight: int | None = None  # None: start a ticker whenever the gate has room
    request_limit: int | None = None  # a fixed cap on outstanding requests
    adaptive: bool = False
    tail: bool = False  # urgent tickers start at once and go first (scheduler.py)
    policy: tuple[tuple[str, float], ...] = ()  # admission policy settings that differ
    budget: bool = False  # admit by a KV token budget too, when the capacity is known
    budget_knobs: tuple[tuple[str, float], ...] = ()  # token budget settings that differ
    prefetch: bool = False  # analysts ahead of a free chain slot; adaptive's default

    @classmethod
    def parse(cls, name: str) -> Strategy:
        """Parse ``adaptive[:knob=value,...]``, ``sequential``, ``fixed-N`` or ``fixed-all``.

        Knobs are ``Knobs``' fields, e.g. ``adaptive:kv_high=0.95,tail=off``; raise
        InputError for a bad name or knob.
        """
        base, _, knobs = name.partition(":")
        if base == "adaptive":
            written = {knob.partition("=")[0]: knob for knob in filter(None, knobs.split(","))}
            given = {key: knob.partition("=")[2] for key, knob in written.items()}
            try:
                chosen = Knobs.model_validate(given)
            except ValidationError as error:
                loc = error.errors()[0]["loc"]
                key = str(loc[0]) if loc else ""
                raise InputError(
                    f"bad knob {written.get(key, key)!r} in strategy {name!r} "
                    "(tail=on|off, budget=on|off, prefetch=on|off, "
                    f"or a number for {', '.join((*POLICY_KNOBS, *BUDGET_KNOBS))})") from None
            if chosen.prefetch == "on" and chosen.budget == "off":
                raise InputError(f"strategy {name!r}: prefetch=on counts chains in budget "
                                 "tokens, so it needs budget=on")
            budget = chosen.budget == "on"
            prefetch = budget if chosen.prefetch is None else chosen.prefetch == "on"
            values = chosen.model_dump(exclude_none=True)
            policy = [(key, float(values[key])) for key in POLICY_KNOBS if key in values]
            budget_knobs = [(key.removeprefix("budget_"), float(values[key]))
                            for key in BUDGET_KNOBS if key in values]
            strategy = cls(name, adaptive=True, tail=chosen.tail == "on",
                           policy=tuple(policy), budget=budget,
                           budget_knobs=tuple(budget_knobs), prefetch=prefetch)
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
