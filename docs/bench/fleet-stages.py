"""Print a kept fleet night's chain stages: when their calls started and ended, and waited.

A diagnostic (docs/lab/2026-12-05-fleet-start-and-end.md): reads the SQLite file of
``python -m tests.bench.fleet --database sqlite --keep-sqlite FILE``. Stage 0 is a ticker's
analysts (their first start, last end and mean wait), 1.. its chain's calls in order; per stage
the first and last start and end over all tickers, the mean and most a call waited at our
gate (ready to sent), and how many waited over a second.
``PYTHONPATH=. python docs/bench/fleet-stages.py FILE`` (from the repository's root).
``read_calls`` is the one reading of such a file's calls (fleet-handoff-rows.py loads it).
"""

from __future__ import annotations

import collections
import datetime as dt
import sqlite3
import sys
from typing import NamedTuple

from agents.nodes import ANALYSTS


class Call(NamedTuple):
    """One answered call; its times in seconds from the night's first call sent."""

    ticker: str
    node: str
    endpoint: str | None
    ready: float | None  # ready to be sent: its wait at our gate is started - ready
    started: float
    first_token: float | None
    ended: float
    prompt_tokens: int
    completion_tokens: int


def read_calls(db: sqlite3.Connection) -> tuple[dt.datetime, list[Call]]:
    """Return the night's first call sent (t0) and its answered calls in the order sent."""
    rows = db.execute("select ticker, node, endpoint, ready_at, started_at, first_token_at, "
                      "ended_at, prompt_tokens, completion_tokens from llm_calls "
                      "where status = 'ok' order by started_at").fetchall()
    t0 = min(dt.datetime.fromisoformat(r[4]) for r in rows)

    def sec(stamp: str | None) -> float | None:
        return None if stamp is None else (dt.datetime.fromisoformat(stamp) - t0).total_seconds()

    return t0, [Call(r[0], r[1], r[2], sec(r[3]), sec(r[4]) or 0.0, sec(r[5]),
                     sec(r[6]) or 0.0, r[7] or 0, r[8] or 0) for r in rows]


def wait(call: Call) -> float:
    return call.started - call.ready if call.ready is not None else 0.0


def main(path: str) -> None:
    _, calls = read_calls(sqlite3.connect(path))
    by = collections.defaultdict(list)
    for c in calls:
        by[c.ticker].append(c)
    rows = collections.defaultdict(list)  # stage: (start, end, wait at our gate) per ticker
    for cs in by.values():
        fan = [c for c in cs if c.node in ANALYSTS]
        rows[0].append((min(c.started for c in fan), max(c.ended for c in fan),
                        sum(wait(c) for c in fan) / len(fan)))
        chain = sorted((c for c in cs if c.node not in ANALYSTS), key=lambda c: c.started)
        for i, c in enumerate(chain):
            rows[i + 1].append((c.started, c.ended, wait(c)))
    print("stage   n  start_min start_max  end_min  end_max  gate_mean gate_max  waited>1s")
    for k in sorted(rows):
        r = rows[k]
        starts, ends, waits = zip(*r, strict=True)
        print(f"{k:5d} {len(r):3d} {min(starts):10.1f} {max(starts):9.1f} {min(ends):8.1f} "
              f"{max(ends):8.1f} {sum(waits) / len(r):10.2f} {max(waits):8.2f} "
              f"{sum(w > 1 for w in waits):10d}")


if __name__ == "__main__":
    main(sys.argv[1])
