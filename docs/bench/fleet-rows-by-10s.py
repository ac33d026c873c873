"""Print a kept fleet night's calls every 10 s: running, waiting at our gate, and their stages.

A diagnostic (docs/lab/2026-12-05-fleet-tail-order.md): reads the SQLite file of
``python -m tests.bench.fleet --database sqlite --keep-sqlite FILE``. Per ticker (every
tenth): its first call, its end, and its calls' summed wait at our gate (ready to sent);
then every 10 s the calls at the server and at our gate, their prompts' sum, and the chain
stages (1 = the first call after the analysts) of both.
``PYTHONPATH=. python docs/bench/fleet-rows-by-10s.py FILE`` (from the repository's root).
"""

import collections
import datetime as dt
import sqlite3
import sys

from agents.nodes import ANALYSTS

db = sqlite3.connect(sys.argv[1])
at = dt.datetime.fromisoformat
calls = db.execute("select ticker, node, ready_at, started_at, ended_at, prompt_tokens "
                   "from llm_calls where status = 'ok' order by started_at").fetchall()
t0 = min(at(c[3]) for c in calls)
by = collections.defaultdict(list)
for c in calls:
    by[c[0]].append(c)
print("ticker  first_s  end_s  gate_wait_s")
names = sorted(by)
for t in names[::10] + names[-1:]:
    cs = by[t]
    first = (min(at(c[3]) for c in cs) - t0).total_seconds()
    last = (max(at(c[4]) for c in cs) - t0).total_seconds()
    waited = sum((at(c[3]) - at(c[2])).total_seconds() for c in cs if c[2])
    print(f"{t} {first:7.1f} {last:6.1f} {waited:8.1f}")
stage = {}
for t, cs in by.items():
    chain = sorted((c for c in cs if c[1] not in ANALYSTS), key=lambda c: c[3])
    for i, c in enumerate(chain):
        stage[(t, c[1])] = i + 1
print("   t  running  at_gate  prompts_running_k  stages_running  stages_at_gate")
end = max((at(c[4]) - t0).total_seconds() for c in calls)
for s in range(0, int(end) + 10, 10):
    now = t0 + dt.timedelta(seconds=s)
    run = [c for c in calls if at(c[3]) <= now < at(c[4])]
    wait = [c for c in calls if c[2] and at(c[2]) <= now < at(c[3])]
    rs = [stage.get((c[0], c[1]), 0) for c in run]
    ws = [stage.get((c[0], c[1]), 0) for c in wait]
    print(f"{s:4d} {len(run):8d} {len(wait):8d} {sum(c[5] for c in run) / 1000:18.0f} "
          f"{min(rs, default=0):8d}-{max(rs, default=0):<6d} {min(ws, default=0):8d}-"
          f"{max(ws, default=0)}")
