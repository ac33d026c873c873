"""Name how much work is in flight: `adaptive[:knobs]`, `fixed-N`, `fixed-all`, `sequential`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from app.errors import InputError
from app.traffic.admission import AdmissionPolicy
from app.traffic.budget import TokenBudget

# "No limit": a count no batch reaches.
UNBOUNDED = 1_000_000

POLICY_KNOBS = ("initial", "minimum", "maximum", "kv_high", "kv_full", "queue_allowance",
                "backoff")
# The token budget's knobs (app/traffic/budget.py), prefixed where a policy knob has the name.
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
    prefetch: bool = False  # analysts ahead of a free chain slot (app/traffic/chains.py);
    # ``parse`` turns it on for ``adaptive`` with the budget, as the default

    @classmethod
    def parse(cls, name: str) -> Strategy:
        """Parse ``adaptive[:knob=value,...]``, ``sequential``, ``fixed-N`` or ``fixed-all``.

        Knobs are the admission policy's fields, the token budget's (``fill``, ``overbook``,
        ``overbook_max``, ``overbook_step``, ``rise_after``, ``calm``, ``high_cut``,
        ``budget_backoff``, ``out_quantile``, ``min_samples``), ``tail=on|off``,
        ``budget=on|off`` and ``prefetch=on|off``, so a bench can put variants side by side:
        ``adaptive:kv_high=0.95,queue_allowance=0,tail=off`` or ``adaptive:budget=off``.
        """
        base, _, knobs = name.partition(":")
        if base == "adaptive":
            # prefetch: on by default where the budget is (it counts chains in budget tokens)
            switches: dict[str, bool | None] = {"tail": True, "budget": True, "prefetch": None}
            policy, budget_knobs = [], []
            for knob in filter(None, knobs.split(",")):
                key, _, value = knob.partition("=")
                if key in switches and value in ("on", "off"):
                    switches[key] = value == "on"
                elif key in POLICY_KNOBS and _is_number(value):
                    policy.append((key, float(value)))
                elif key in BUDGET_KNOBS and _is_number(value):
                    budget_knobs.append((BUDGET_KNOBS[key], float(value)))
                else:
                    raise InputError(
                        f"bad knob {knob!r} in strategy {name!r} (tail=on|off, budget=on|off, "
                        "prefetch=on|off, "
                        f"or a number for {', '.join((*POLICY_KNOBS, *BUDGET_KNOBS))})")
            if switches["prefetch"] and not switches["budget"]:
                raise InputError(f"strategy {name!r}: prefetch=on counts chains in budget "
                                 "tokens, so it needs budget=on")
            budget = bool(switches["budget"])
            prefetch = budget if switches["prefetch"] is None else bool(switches["prefetch"])
            strategy = cls(name, adaptive=True, tail=bool(switches["tail"]),
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


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
