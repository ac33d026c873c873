"""Coverage of the quality reports' 95% bootstrap interval of Spearman
(``statistics.bootstrap_interval``, as ``quality repro`` and ``samples`` compute it) on tiny
nights: docs/lab/2026-12-07-plan-bench-outside-4.md. Run under the bench lock:
``.venv/bin/python docs/bench/quality-interval-coverage.py 200``.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from app.quality.statistics import bootstrap_interval, spearman

RHO = 0.5
TRUE = 6 / math.pi * math.asin(RHO / 2)  # Spearman's of a bivariate normal at RHO


def main(runs: int) -> None:
    rng = np.random.default_rng(5)
    for n in (5, 10, 30):
        covered = defined = 0
        for _ in range(runs):
            z = rng.multivariate_normal([0, 0], [[1, RHO], [RHO, 1]], size=n)
            x, y = z[:, 0], z[:, 1]

            def statistic(i: np.ndarray, x: np.ndarray = x, y: np.ndarray = y) -> float | None:
                return spearman(x[i], y[i])
            interval = bootstrap_interval(n, statistic, resamples=1000, seed=0)
            if interval is None:
                continue
            defined += 1
            covered += interval[0] <= TRUE <= interval[1]
        share = covered / defined
        print(f"n={n}: covered {share:.3f} ± {math.sqrt(share * (1 - share) / defined):.3f} "
              f"of {defined} intervals ({runs} runs)", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
