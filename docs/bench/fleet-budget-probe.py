"""Run tests.bench.fleet with the token budget's readings recorded (a diagnostic).

For docs/lab/2026-12-05-fleet-budget-factor.md; not part of the package. It wraps
``TokenBudget._steer`` (called on every reading without a preemption or a restart) and
records, per budget (one an endpoint), each reading's inputs to the factor's rise: KV usage
against ``kv_high``, whether a request was held back since the last reading (``refused``),
the footprint share (None: too little reserved), the server's queue growing or the calm
after a preemption (``held_back``), the outstanding requests costed from the defaults
(``unsettled``) and the share at the next step. The JSON has every reading of every budget
and, per budget, how many readings each condition stopped (a reading may be stopped by
several). Usage, from a checkout: ``PYTHONPATH=$PWD PROBE_OUT=out.json .venv/bin/python
docs/bench/fleet-budget-probe.py --tickers 500 --endpoints 5 --speedup 1 --output-scale 0.2``.
"""

import atexit
import collections
import json
import os
import sys
import time

from app.traffic import budget as budget_module

OUT = os.environ.get("PROBE_OUT", "var/fleet/budgetprobe.json")
readings: dict[int, list[dict]] = collections.defaultdict(list)
T0 = time.monotonic()
original = budget_module.TokenBudget._steer


def steer(self, gauges, at_reading, *, refused, held_back):
    reserved, _ = at_reading
    limit = self.limit or 0
    share = None
    if reserved and reserved >= limit / 2 and self.capacity:
        to_come = at_reading[1] - min(max(self._generated_out, 0.0), float(at_reading[1]))
        share = (gauges.kv_cache_usage * self.capacity + to_come
                 + gauges.waiting * self.typical_cost) / reserved
    rise = min(self.overbook_max, self.factor + self.overbook_step)
    before = self.factor
    original(self, gauges, at_reading, refused=refused, held_back=held_back)
    readings[id(self)].append({
        "t": round(time.monotonic() - T0, 2), "kv": round(gauges.kv_cache_usage, 4),
        "waiting": gauges.waiting, "refused": refused, "held_back": held_back,
        "unsettled": self._unsettled, "reserved": reserved, "limit": limit,
        "share": None if share is None else round(share, 4),
        "share_at_rise_ok": share is not None and share * rise * self.correction <= 1,
        "kv_high": gauges.kv_cache_usage >= self.kv_high,
        "factor_before": before, "factor_after": self.factor})


budget_module.TokenBudget._steer = steer


def save() -> None:
    summary = {}
    for index, rows in enumerate(readings.values()):
        stopped = collections.Counter()
        for r in rows:
            if r["kv_high"]:
                stopped["kv_at_kv_high"] += 1
                continue
            stopped["not_refused"] += not r["refused"]
            stopped["share_none"] += r["share"] is None
            stopped["held_back"] += r["held_back"]
            stopped["unsettled"] += r["unsettled"] > 0
            stopped["share_too_high"] += r["share"] is not None and not r["share_at_rise_ok"]
            only = [k for k, v in (("not_refused", not r["refused"]),
                                   ("share_none", r["share"] is None),
                                   ("held_back", r["held_back"]),
                                   ("unsettled", r["unsettled"] > 0),
                                   ("share_too_high", r["share"] is not None
                                    and not r["share_at_rise_ok"])) if v]
            if len(only) == 1:
                stopped["only_" + only[0]] += 1
            if not only:
                stopped["open"] += 1
        summary[f"budget_{index}"] = {"readings": len(rows), "stopped_by": dict(stopped),
                                      "rises": sum(r["factor_after"] > r["factor_before"]
                                                   for r in rows),
                                      "factor_peak": max((r["factor_after"] for r in rows),
                                                         default=None)}
    with open(OUT, "w") as out:
        json.dump({"summary": summary, "readings": list(readings.values())}, out)


atexit.register(save)

from tests.bench import run  # noqa: E402  (after the wrap)
from tests.bench.fleet import app  # noqa: E402

sys.argv = ["fleet", *sys.argv[1:]]
run(app)
