"""Print the step model's night of one endpoint every 10 s, as fleet-rows-by-10s.py prints a
kept bench night: calls running, ready but not admitted, their stages, and the cache.

The model is docs/bench/fleet-tail-cache-model.py's ``night`` (its best schedule: every
ticker started at 0, longest remaining chain first, the budget as it is), so a bench night's
rows can be set beside the schedule it is measured against
(docs/lab/2026-12-05-fleet-start-at-once.md). ``PYTHONPATH=. python
docs/bench/fleet-model-rows-by-10s.py [TICKERS] [doubling]`` (from the repository's root;
``doubling``: the request limit's start).
"""

import importlib.util
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "model", Path(__file__).with_name("fleet-tail-cache-model.py"))
model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model)

tickers = int(sys.argv[1]) if len(sys.argv) > 1 else 100
starts = model.doubling(tickers) if "doubling" in sys.argv[2:] else None
trace = []
seconds, steps = model.night(tickers, starts=starts, trace=trace)
print(f"{tickers} tickers: {seconds:.1f} s, {steps} steps")
print("   t  running  waiting  stages_running  stages_waiting  reserved  kv_held")
mark = 0.0
for now, running, waiting, reserved, held, rs, ws in trace:
    if now < mark:
        continue
    mark += 10.0
    print(f"{now:4.0f} {running:8d} {waiting:8d} {min(rs, default=0):8d}-{max(rs, default=0):<6d}"
          f" {min(ws, default=0):8d}-{max(ws, default=0):<6d} {reserved / model.KV:8.3f}"
          f" {held / model.KV:8.3f}")
