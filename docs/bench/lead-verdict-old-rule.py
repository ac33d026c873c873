"""The spread rule the lead verdict had before Welch's t, on the same simulated arms.

For docs/lab/2026-12-05-lead-verdict-test.md; not part of the package. Runs 35f8551's
``_judge`` (the last with the rule: "beyond the runs' spread" when the lead on the means
exceeds the larger relative max - min of the two arms) on normal noise: at a true lead of 0
the share called beyond either way, else the share called beyond in the lead's direction.
Usage, from a checkout: ``git show 35f8551:app/bench/schedulers.py > /tmp/old_schedulers.py;
PYTHONPATH=$PWD .venv/bin/python docs/bench/lead-verdict-old-rule.py``.
"""

import importlib.util
import sys

import numpy as np

from tests.unit.bench.test_schedulers_lead import MEAN, SD, normal

TRIALS = 20_000
spec = importlib.util.spec_from_file_location("old_schedulers", "/tmp/old_schedulers.py")
assert spec is not None and spec.loader is not None
old = importlib.util.module_from_spec(spec)
sys.modules["old_schedulers"] = old  # dataclasses look their module up here
spec.loader.exec_module(old)

for k in (0, 1, 2, 3, 5):
    for runs in (2, 3, 5):
        draws = MEAN + normal(np.random.default_rng(300 + runs + 10 * k), (2 * TRIALS, runs))
        beyond = 0
        for mine, other in zip(draws[:TRIALS] + k * SD, draws[TRIALS:], strict=True):
            result = old.BenchResult("w", 24, 408, arms=[
                {"strategy": s, "output_tokens_per_s": float(t), "preemptions": 0}
                for s, row in (("adaptive", mine), ("fixed-all", other)) for t in row])
            old._judge(result)
            means = result.means
            ahead = (means["adaptive"]["output_tokens_per_s"]
                     > means["fixed-all"]["output_tokens_per_s"])
            beyond += "beyond" in result.verdicts[0] and (k == 0 or ahead)
        print(f"spread rule, true lead {k} sd, {runs} runs a side: called beyond "
              f"{beyond / TRIALS:.4f}", flush=True)
