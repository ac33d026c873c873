"""Print a kept fleet night's chain stages: when their calls started and ended, and waited.

A diagnostic (docs/lab/2026-12-05-fleet-start-and-end.md): reads the SQLite file of
``python -m tests.bench.fleet --database sqlite --keep-sqlite FILE``. Stage 0 is a ticker's
analysts (their first start, last end and mean wait), 1.. its chain's calls in order; per stage
the first and last start and end over all tickers, the mean and most a call waited at our
gate (ready to sent), and how many waited over a second.
``PYTHONPATH=. python docs/bench/fleet-stages.py FILE`` (from the repository's root).
"""

import collections
import datetime as dt
import sqlite3
import sys

from agents.nodes import ANALYSTS

db = sqlite3.connect(sys.argv[1])
at = dt.datetime.fromisoformat
calls = db.execute("select ticker, node, ready_at, started_at, ended_at from llm_calls "
                   "where status = 'ok' order by started_at").fetchall()
t0 = min(at(c[3]) for c in calls)


def sec(stamp):
    return (at(stamp) - t0).total_seconds()


def wait(call):
    return sec(call[3]) - sec(call[2]) if call[2] else 0.0


by = collections.defaultdict(list)
for c in calls:
    by[c[0]].append(c)
rows = collections.defaultdict(list)  # stage: (start, end, wait at our gate) per ticker
for cs in by.values():
    fan = [c for c in cs if c[1] in ANALYSTS]
    rows[0].append((min(sec(c[3]) for c in fan), max(sec(c[4]) for c in fan),
                    sum(wait(c) for c in fan) / len(fan)))
    chain = sorted((c for c in cs if c[1] not in ANALYSTS), key=lambda c: c[3])
    for i, c in enumerate(chain):
        rows[i + 1].append((sec(c[3]), sec(c[4]), wait(c)))
print("stage   n  start_min start_max  end_min  end_max  gate_mean gate_max  waited>1s")
for k in sorted(rows):
    r = rows[k]
    starts, ends, waits = zip(*r, strict=True)
    print(f"{k:5d} {len(r):3d} {min(starts):10.1f} {max(starts):9.1f} {min(ends):8.1f} "
          f"{max(ends):8.1f} {sum(waits) / len(r):10.2f} {max(waits):8.2f} "
          f"{sum(w > 1 for w in waits):10d}")
