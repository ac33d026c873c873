"""Size of the 1d track verdict on null desks of few tickers a night, through the track's own
code: docs/quality.md ("Nights of three tickers"), docs/lab/2026-12-07-plan-bench-outside-4.md.

Scores and returns independent normal. Two paths, both the product's:
- ``horizon_record`` on the desk's nights built as ``NightReturns`` (``simulation.night_of``):
  the whole track, its ``TRACK_MIN_TICKERS`` rule, ``night_ic``'s Spearman and the verdict;
  4.2 ms a desk, so run on CHECKED desks a case;
- for the rest of the RUNS desks, each night's IC from ``spearman_rows`` (the unit tests check
  it is ``spearman``'s), the same rule (a night below ``TRACK_MIN_TICKERS`` tickers enters no
  test) and ``ic_verdict``. On the CHECKED desks the two must give the same p, or it stops.
"before the rule" is ``ic_verdict`` on every night's IC: the verdict as it was.
Run under the bench lock: ``.venv/bin/python docs/bench/track-tiny-nights.py`` (about a minute).
"""

from __future__ import annotations

import numpy as np

from app.quality.simulation import night_of
from app.quality.statistics import spearman_rows
from app.quality.track import SIGNIFICANCE, TRACK_MIN_TICKERS, horizon_record, ic_verdict

RUNS = 100_000  # SE ≤ 0.07 points at 5%
CHECKED = 3_000  # of them, through horizon_record too


def called(p: float | None) -> bool:
    return p is not None and p < SIGNIFICANCE


def rate(rng: np.random.Generator, tickers: int, nights: int) -> tuple[float, float, float]:
    """Return the shares of null desks called skilled at 5%, after and before the rule, and
    the standard error of a share at 5%."""
    scores = rng.normal(size=(RUNS, nights, tickers))
    returns = rng.normal(size=(RUNS, nights, tickers))
    ics = spearman_rows(scores, returns)
    after = before = 0
    for run in range(RUNS):
        every = [float(ic) for ic in ics[run] if np.isfinite(ic)]
        judged = every if tickers >= TRACK_MIN_TICKERS else []
        test = ic_verdict(judged, 1)
        p = None if test.withheld else test.p_value
        if run < CHECKED:
            record = horizon_record([night_of(s, r, i) for i, (s, r)
                                     in enumerate(zip(scores[run], returns[run], strict=True))], 1)
            assert record.judged == len(judged), (record.judged, len(judged))
            assert (record.p_value is None) == (p is None) and (
                p is None or abs(record.p_value - p) < 1e-9), (record.p_value, p)  # type: ignore[operator]
        after += called(p)
        before += called(ic_verdict(every, 1).p_value)
    return after / RUNS, before / RUNS, (0.05 * 0.95 / RUNS) ** 0.5


def main() -> None:
    rng = np.random.default_rng(2)
    for tickers, nights in ((3, 20), (3, 25), (4, 20), (4, 25)):
        after, before, error = rate(rng, tickers, nights)
        print(f"{tickers} tickers {nights} nights: {after:.4f} (before the rule {before:.4f}) "
              f"± {error:.4f}, {RUNS:,} desks, {CHECKED:,} through horizon_record", flush=True)


if __name__ == "__main__":
    main()
