"""Size of the 1d track verdict (the one-sample t on the nights' ICs, ``overlap_t`` at 1 day)
on null desks of few tickers a night: docs/lab/2026-12-07-plan-bench-outside-4.md.

Scores and returns independent normal; each night's IC from ``spearman_rows``. Run under the
bench lock: ``.venv/bin/python docs/bench/track-tiny-nights.py``.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from app.quality.statistics import overlap_t, spearman_rows

RUNS = 200_000  # 2,000 for a quick look


def rate(rng: np.random.Generator, tickers: int, nights: int, runs: int) -> tuple[float, float]:
    """Return the share of null desks called skilled at 5%, and its standard error."""
    scores = rng.normal(size=(runs, nights, tickers))
    returns = rng.normal(size=(runs, nights, tickers))
    ics = spearman_rows(scores, returns)
    t = ics.mean(axis=1) / (ics.std(axis=1, ddof=1) / np.sqrt(nights))  # overlap_t at 1 day
    share = float((2 * stats.t.sf(np.abs(t), nights - 1) < 0.05).mean())
    return share, (share * (1 - share) / runs) ** 0.5


def main() -> None:
    rng = np.random.default_rng(2)
    check = spearman_rows(rng.normal(size=(1, 20, 3)), rng.normal(size=(1, 20, 3)))[0]
    ours = overlap_t(list(check), 1)[1]
    mine = 2 * stats.t.sf(abs(check.mean() / (check.std(ddof=1) / np.sqrt(20))), 19)
    assert ours is not None and abs(ours - mine) < 1e-12  # the formula is overlap_t's
    for tickers, nights in ((3, 20), (3, 25), (3, 40), (4, 20), (5, 20), (5, 60), (8, 20),
                            (20, 20)):
        share, error = rate(rng, tickers, nights, RUNS)
        print(f"{tickers} tickers {nights} nights: {share:.4f} ± {error:.4f}", flush=True)


if __name__ == "__main__":
    main()
