"""Welch's t at 5% on normal arms of equal mean, as one arm's noise grows (a measurement).

For docs/lab/2026-12-05-lead-verdict-test.md; not part of the package. The share called
apart with Welch–Satterthwaite df (scipy's p) beside the same statistic on min(n) − 1 df
(what ``welch_p`` reads), straight from scipy rather than through ``_judge``. Usage:
``.venv/bin/python docs/bench/lead-verdict-ratio.py``.
"""

import numpy as np
from scipy import stats

rng = np.random.default_rng(1)
N = 200_000
for ratio in (1, 3, 10, 100):
    row = []
    for n in (2, 3, 5):
        a = rng.normal(0, 1, (N, n))
        b = rng.normal(0, ratio, (N, n))
        r = stats.ttest_ind(a, b, axis=1, equal_var=False)
        p_min = 2 * stats.t.sf(np.abs(r.statistic), n - 1)
        row.append(f"n={n}: welch-df {np.mean(r.pvalue < 0.05):.4f} "
                   f"min-df {np.mean(p_min < 0.05):.4f}")
    print(f"sd ratio {ratio}:", "; ".join(row), flush=True)
