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
OnOff = Literal["on", "off"]


class Knobs(BaseModel):
    """What ``NAME:knob=value,...`` may set, each as its setting's type; a knob left out
    keeps its default. A count given with a fraction is refused (``int`` would cut it
    without a word), and nan and inf are no setting."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    # Unset: the strategy's own default (adaptive: on; a fixed count: off).
    tail: OnOff | None = None
    prefetch: OnOff | None = None
    # AdmissionPolicy's (POLICY_KNOBS).
    initial: int | None = None
    minimum: int | None = None
    maximum: int | None = None
    queue_allowance: int | None = None
    backoff: float | None = None
    # TokenBudget's, ``budget_`` prefixed where a policy knob has the name; the server gives
    # the block size and the capacity, the server's counts the ratio.
    fill: float | None = None
    overbook: float | None = None
    overbook_max: float | None = None
    overbook_step: float | None = None
    rise_after: int | None = None
    calm: int | None = None
    high_cut: float | None = None
    kv_high: float | None = None
    budget_backoff: float | None = None
    out_quantile: float | None = None
    min_samples: int | None = None


POLICY_KNOBS = ("initial", "minimum", "maximum", "queue_allowance", "backoff")
NUMBERS = tuple(name for name in Knobs.model_fields if name not in ("tail", "prefetch"))


@dataclass(frozen=True)
class Strategy:
    """How much work is in flight: by the server's gauges, or by a fixed count of tickers."""

    name: str
    tickers_in_flight: int | None = None  # None: start a ticker whenever the gate has room
    request_limit: int | None = None  # a fixed cap on outstanding requests
    adaptive: bool = False
    tail: bool = False  # urgent tickers start at once and go first (scheduler.py)
    # AdmissionPolicy's and TokenBudget's settings that differ, each as its field's type.
    policy: tuple[tuple[str, Any], ...] = ()
    budget_knobs: tuple[tuple[str, Any], ...] = ()
    prefetch: bool = False  # fan-outs ahead of a free chain slot; adaptive's default

    @classmethod
    def parse(cls, name: str) -> Strategy:
        """Parse ``adaptive``, ``sequential``, ``fixed-N`` or ``fixed-all``, each with
        ``:knob=value,...``.

        Knobs are ``Knobs``' fields, e.g. ``adaptive:kv_high=0.95,tail=off`` or
        ``fixed-15:tail=on,prefetch=on``: every strategy takes the tail rule, fixed-N
        prefetching too (its N tickers are N chains, more start their fan-out ahead), only
        adaptive the rest; raise InputError for a bad name or knob.
        """
        base, _, knobs = name.partition(":")
        chosen = _parse_knobs(name, knobs)
        if base == "adaptive":
            numbers = [(key, value) for key, value in chosen.items() if key in NUMBERS]
            policy = tuple((key, value) for key, value in numbers if key in POLICY_KNOBS)
            budget_knobs = tuple((key.removeprefix("budget_"), value) for key, value in numbers
                                 if key not in POLICY_KNOBS)
            strategy = cls(name, adaptive=True, tail=chosen.get("tail", "on") == "on",
                           policy=policy, budget_knobs=budget_knobs,
                           prefetch=chosen.get("prefetch", "on") == "on")
            try:  # both built once here, so a bad value is refused before any work
                strategy.token_budget()
                strategy.admission_policy(maximum=AdmissionPolicy.maximum)
            except ValueError as error:
                raise InputError(f"strategy {name!r}: {error}") from None
            return strategy
        fixed = _fixed(base, name)
        if set(chosen) - {"tail", "prefetch"}:
            raise InputError(f"only adaptive takes admission and budget knobs, not {name!r} "
                             f"({base} takes tail=on|off and, fixed-N, prefetch=on|off)")
        prefetch = chosen.get("prefetch") == "on"
        if prefetch and (base == "fixed-all" or not base.startswith("fixed-")):
            # Prefetching runs fan-outs ahead of a free chain slot: it needs a number of
            # chains, N of fixed-N (adaptive's come from its token budget).
            raise InputError(f"prefetch=on needs a number of chains (fixed-N or adaptive), "
                             f"not {name!r}")
        return cls(name, tickers_in_flight=fixed.tickers_in_flight,
                   request_limit=fixed.request_limit, tail=chosen.get("tail") == "on",
                   prefetch=prefetch)

    def admission_policy(self, maximum: int) -> AdmissionPolicy:
        """Return a fresh admission policy of at most ``maximum`` (unless a knob says)."""
        return AdmissionPolicy(**{"maximum": maximum, **dict(self.policy)})

    def token_budget(self) -> TokenBudget | None:
        """Return a fresh token budget: adaptive's (None for a fixed count of tickers)."""
        return TokenBudget(**dict(self.budget_knobs)) if self.adaptive else None


def _parse_knobs(name: str, knobs: str) -> dict[str, Any]:
    """Return the knobs written after a strategy's colon, checked (InputError otherwise)."""
    if ":" in name and not knobs.strip(", "):
        raise InputError(f"strategy {name!r} has a colon and no knob after it (e.g. "
                         f"{name.partition(':')[0]}:tail=on)")
    listed = [knob.partition("=")[0] for knob in filter(None, knobs.split(","))]
    twice = sorted({key for key in listed if listed.count(key) > 1})
    if twice:  # only the last would count, so the name would say what the arm is not
        raise InputError(f"knob {', '.join(twice)} given more than once in strategy {name!r}")
    written = {knob.partition("=")[0]: knob for knob in filter(None, knobs.split(","))}
    given = {key: knob.partition("=")[2] for key, knob in written.items()}
    try:
        return Knobs.model_validate(given).model_dump(exclude_none=True)
    except ValidationError as error:
        loc = error.errors()[0]["loc"]
        key = str(loc[0]) if loc else ""
        raise InputError(
            f"bad knob {written.get(key, key)!r} in strategy {name!r} "
            "(tail=on|off, prefetch=on|off, "
            f"or a number for {', '.join(NUMBERS)})") from None


def _fixed(base: str, name: str) -> Strategy:
    """Return the strategy a fixed count names, before its knobs."""
    if base == "sequential":
        # TradingAgents' way: one ticker, one request at a time.
        return Strategy(base, tickers_in_flight=1, request_limit=1)
    if base == "fixed-all":
        # Every ticker's graph in flight at once, dependencies still respected.
        return Strategy(base, tickers_in_flight=UNBOUNDED)
    match = re.fullmatch(r"fixed-([0-9]+)", base)  # ASCII: "fixed-١" is no name either
    if match and int(match.group(1)) > 0:
        if match.group(1).startswith("0"):
            # One name per strategy: fixed-01 would be recorded, compared and shown beside
            # fixed-1 as another.
            raise InputError(f"strategy {name!r}: write N without leading zeros "
                             f"(fixed-{int(match.group(1))})")
        return Strategy(base, tickers_in_flight=int(match.group(1)))
    raise InputError(f"unknown strategy {name!r} (adaptive, sequential, fixed-N, fixed-all)")
