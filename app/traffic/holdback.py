"""Say, reading by reading, what kept the next ticker from starting on an endpoint.

The first thing short, counted per reason, and a row of the figures behind it
(docs/architecture.md, "What held new tickers back").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# Rows kept per endpoint: an hour of readings at the default 2 s; later ones are counted only.
TIMELINE_MAX = 1800
COLUMNS = ("t_s", "tickers", "chain_slots", "request_limit", "outstanding", "queued",
           "budget_limit", "reserved", "held", "blocker", "chains", "fanning")

ROOM = "room"  # nothing was short: the next ticker was on its way, or none was ready
HELD = "gate held"
REQUEST_LIMIT = "request limit"
QUEUED = "chains waiting for tokens"  # a started ticker's call waits at the gate
TOKEN_BUDGET = "token budget"
CHAIN_CAP = "chain cap"


@dataclass
class HoldBack:
    """Per-reason counts of readings, and their rows, while tickers waited to start."""

    counts: Counter[str] = field(default_factory=Counter)
    timeline: list[list[Any]] = field(default_factory=list)

    def note(self, t_s: float, reason: str, row: dict[str, Any]) -> None:
        """Count one reading's ``reason`` and keep its figures (``row`` by ``COLUMNS``) at
        ``t_s`` seconds from the batch's start."""
        self.counts[reason] += 1
        if len(self.timeline) < TIMELINE_MAX:
            row = {**row, "t_s": round(t_s, 2), "blocker": reason}
            self.timeline.append([row.get(name) for name in COLUMNS])
