"""Print a kept fleet night's handoffs: how long a call's first chunk took beyond its steps.

A diagnostic (docs/lab/2026-12-06-fleet-100-an-endpoint.md): reads the SQLite file of
``python -m tests.bench.fleet --database sqlite --keep-sqlite FILE``. A stepped endpoint
sends a call's first chunk after 16 steps (``--stream-interval 16``); whatever the call
waited beyond them, from the moment our gate let it go (``started_at``), is the way in (the
request sent, read and admitted by the endpoint, the step it joined mid-way sat out), time
the token budget held its tokens while the server did not run it. A step is taken as 20 ms +
0.2 ms a running request at the endpoint's nearest reading. Per endpoint, for every call and
for those sent once ``SINCE`` seconds into the night (where calls wait at our gate for
tokens); then, for the first endpoint, every 10 s the calls at the server and at our gate and
the servers' whole answers in flight ÷ the cache. The calls are read by fleet-stages.py's
``read_calls``, the one reading of such a file.
``PYTHONPATH=. python docs/bench/fleet-handoff-rows.py FILE [SINCE]`` (from the root).
"""

import bisect
import datetime as dt
import importlib.util
import math
import sqlite3
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "stages", Path(__file__).with_name("fleet-stages.py"))
stages = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stages)

KV, CHUNK = 1_488_240, 16

db = sqlite3.connect(sys.argv[1])
since = float(sys.argv[2]) if len(sys.argv) > 2 else 105.0
t0, calls = stages.read_calls(db)


def s(stamp):
    return (dt.datetime.fromisoformat(stamp) - t0).total_seconds()


samples = db.execute("select endpoint, sampled_at, running from server_samples "
                     "order by sampled_at").fetchall()
endpoints = sorted({c.endpoint for c in calls})
print("endpoint  calls  beyond 16 steps, all calls: p50 / mean / p90 s  |  "
      f"sent after {since:.0f} s: p50 / mean / p90 s (calls)")
for endpoint in endpoints:
    readings = [(s(r[1]), r[2]) for r in samples if r[0] and r[0].rstrip("/") in endpoint]
    times = [r[0] for r in readings]

    def step(t, readings=readings, times=times):
        nearest = readings[min(max(0, bisect.bisect(times, t) - 1), len(readings) - 1)]
        return 0.020 + 0.0002 * nearest[1]

    mine = [c for c in calls if c.endpoint == endpoint and c.first_token is not None]
    over = sorted(c.first_token - c.started - CHUNK * step(c.started) for c in mine)
    late = sorted(c.first_token - c.started - CHUNK * step(c.started) for c in mine
                  if c.started >= since)

    def spread(values):
        return (f"{values[len(values) // 2]:.3f} / {sum(values) / len(values):.3f} / "
                f"{values[int(0.9 * len(values))]:.3f}")

    print(f"{endpoint}  {len(mine)}  {spread(over)}  |  {spread(late)} ({len(late)})")

first = [c for c in calls if c.endpoint == endpoints[0]]
print(f"\n{endpoints[0]}: every 10 s")
print("   t  at_server  at_gate  whole_answers/KV")
end = max(c.ended for c in first)
for t in range(0, int(end) + 10, 10):
    running = [c for c in first if c.started <= t < c.ended]
    waiting = [c for c in first if c.ready is not None and c.ready <= t < c.started]
    whole = sum(math.ceil((c.prompt_tokens + c.completion_tokens) / 16) * 16
                for c in running) / KV
    print(f"{t:4d} {len(running):10d} {len(waiting):8d} {whole:17.3f}")
