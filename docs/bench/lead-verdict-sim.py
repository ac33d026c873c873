"""The bench's lead verdict on simulated arms: its false-lead rate and power (a measurement).

For docs/lab/2026-12-05-lead-verdict-test.md; not part of the package. Every trial goes
through ``_judge`` (tests/unit/bench/test_schedulers_lead.py's ``calls``), with more trials than the
unit test affords. Usage, from a checkout: ``PYTHONPATH=$PWD .venv/bin/python
docs/bench/lead-verdict-sim.py``.
"""

import math

from tests.unit.bench.test_schedulers_lead import SD, calls, lognormal, normal, uneven

NULL_TRIALS, POWER_TRIALS = 20_000, 5_000

for noise in (normal, lognormal, uneven):
    for runs in (2, 3, 5):
        c = calls(noise, runs, seed=100 + runs, trials=NULL_TRIALS)
        rate = (c["a lead"] + c["a deficit"]) / NULL_TRIALS
        print(f"equal means, {noise.__name__}, {runs} runs a side: called apart {rate:.4f} "
              f"± {math.sqrt(rate * (1 - rate) / NULL_TRIALS):.4f} (a lead "
              f"{c['a lead'] / NULL_TRIALS:.4f}, a deficit {c['a deficit'] / NULL_TRIALS:.4f})",
              flush=True)
for runs in (2, 3, 5):
    for k in (1, 2, 3, 5):
        c = calls(normal, runs, lead=k * SD, seed=200 + 10 * runs + k, trials=POWER_TRIALS)
        print(f"true lead {k} sd, normal, {runs} runs a side: called a lead "
              f"{c['a lead'] / POWER_TRIALS:.3f}", flush=True)
