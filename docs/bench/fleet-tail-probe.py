"""Run tests.bench.fleet with the tail rule's inputs recorded (a diagnostic).

For docs/lab/2026-12-05-fleet-tail-order.md; not part of the package. It wraps
``Scheduler._mark_tail`` and, at most once a second, records the work left, the concurrency
the rule divides by, the first endpoint's budget (limit, reserved, held), its chains, the
tickets marked urgent, the gate's requests out and waiting, and every ticket's remaining
chain. Usage, from a checkout: ``PYTHONPATH=$PWD PROBE_OUT=out.json .venv/bin/python
docs/bench/fleet-tail-probe.py --tickers 100 --endpoints 1 --speedup 1 --output-scale 0.2
--database sqlite --keep-sqlite rows.sqlite``; ``docs/bench/fleet-rows-by-10s.py
rows.sqlite`` then prints the kept rows' calls running and waiting at our gate every 10 s.
"""

import atexit
import json
import os
import sys
import time

from app.traffic import scheduler

OUT = os.environ.get("PROBE_OUT", "var/fleet/tailprobe.json")
records = []
original = scheduler.Scheduler._mark_tail
last = [0.0]


def mark(self):
    flipped = original(self)
    now = time.monotonic()
    if now - last[0] >= 1.0:
        last[0] = now
        endpoints = list(self.endpoints)
        tickets = [t for e in endpoints for t in e.here.values()]
        first = endpoints[0]
        budget = first.limits.budget
        records.append({
            "t": now, "left": self.left, "conc": self.endpoints.concurrency(),
            "limit": first.gate.limit, "slots": first.chain_slots(),
            "per_chain": first.limits.footprint.tokens(),
            "budget_limit": budget.limit if budget else None,
            "reserved": budget.reserved if budget else None,
            "held": budget.held if budget else None, "tickets": len(tickets),
            "chains": first.chains, "fanning": first.fanning,
            "urgent": sum(t.urgent for t in tickets), "outstanding": first.gate.outstanding,
            "gate_waiting": first.gate.waiting,
            "rem_chain": sorted(t.remaining_chain for t in tickets)})
    return flipped


scheduler.Scheduler._mark_tail = mark


def save() -> None:
    with open(OUT, "w") as out:
        json.dump(records, out)


atexit.register(save)

from tests.bench import run  # noqa: E402  (after the wrap)
from tests.bench.fleet import app  # noqa: E402

sys.argv = ["fleet", *sys.argv[1:]]
run(app)
