"""Build batches of constructed decisions through the real store, and hand-made statistics.

The hand-made statistics are written from their textbook formulas, independently of
app/quality/statistics.py (which calls scikit-learn and scipy), so a test compares two
separate computations.
"""

from __future__ import annotations

import math
from datetime import date

from sqlalchemy import Engine

from app.batch import store
from app.db.batchsettings import BatchSettings

AS_OF = date(2026, 11, 27)
SCALE = ("Buy", "Overweight", "Hold", "Underweight", "Sell")
# A score inside each rating's band, for decisions that must not contradict themselves.
INSIDE = {"Buy": 0.7, "Overweight": 0.3, "Hold": 0.0, "Underweight": -0.3, "Sell": -0.7}


def add_batch(engine: Engine, grades: dict[str, list[tuple[str, float]]], *,
              kind: str = "nightly", as_of: date = AS_OF, status: str = "succeeded",
              failed: tuple[str, ...] = (), settings: dict[str, object] | None = None) -> int:
    """Store a finished batch whose tickers got the given (rating, score) per sample."""
    tickers = [*grades, *failed]
    samples = max((len(v) for v in grades.values()), default=1)
    recorded = BatchSettings.read(settings or {"samples": samples})
    batch_id = store.create_batch(engine, kind=kind, as_of=as_of, tickers=tickers,
                                  samples=samples, settings=recorded, server_facts=None)
    for ticker, rows in grades.items():
        store.ticker_finished(engine, batch_id, ticker, [
            store.DecisionRow(ticker, i, rating, score, 0.5, f"{ticker} sample {i}")
            for i, (rating, score) in enumerate(rows)], None)
    for ticker in failed:
        store.ticker_finished(engine, batch_id, ticker, [], "LLM failed")
    store.finish_batch(engine, batch_id, status)
    return batch_id


def one_each(ratings: dict[str, str], scores: dict[str, float] | None = None,
             ) -> dict[str, list[tuple[str, float]]]:
    """Return single-sample grades; scores default to the middle of each rating's band."""
    return {t: [(r, (scores or {}).get(t, INSIDE[r]))] for t, r in ratings.items()}


def kappa_by_hand(a: list[str], b: list[str]) -> float:
    """Quadratic weighted kappa from its definition: 1 − Σ w·observed / Σ w·expected."""
    k, n = len(SCALE), len(a)
    observed = [[0.0] * k for _ in range(k)]
    for x, y in zip(a, b, strict=True):
        observed[SCALE.index(x)][SCALE.index(y)] += 1
    rows = [sum(observed[i]) for i in range(k)]
    cols = [sum(observed[i][j] for i in range(k)) for j in range(k)]
    num = den = 0.0
    for i in range(k):
        for j in range(k):
            weight = (i - j) ** 2 / (k - 1) ** 2
            num += weight * observed[i][j]
            den += weight * rows[i] * cols[j] / n
    return 1 - num / den


def ranks(values: list[float]) -> list[float]:
    """Rank 1..n, ties getting the mean of the positions they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    result = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for m in range(i, j + 1):
            result[order[m]] = (i + j) / 2 + 1
        i = j + 1
    return result


def pearson(x: list[float], y: list[float]) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy)


def spearman_by_hand(x: list[float], y: list[float]) -> float:
    """Spearman's rho: Pearson's correlation of the ranks."""
    return pearson(ranks(x), ranks(y))


def band_by_hand(score: float) -> str:
    """The rating of a mean score, from the band table as the docs state it."""
    if score >= 0.5:
        return "Buy"
    if score >= 0.15:
        return "Overweight"
    if score > -0.15:
        return "Hold"
    if score > -0.5:
        return "Underweight"
    return "Sell"


SAMPLES_A = {  # four samples per ticker: (rating, score)
    "AAA": [("Buy", 0.6), ("Overweight", 0.3), ("Buy", 0.9), ("Hold", 0.1)],
    "BBB": [("Hold", 0.0), ("Underweight", -0.2), ("Hold", 0.1), ("Sell", -0.6)],
    "CCC": [("Sell", -0.8), ("Underweight", -0.4), ("Hold", 0.0), ("Sell", -0.7)],
    "DDD": [("Overweight", 0.2), ("Hold", -0.1), ("Buy", 0.55), ("Overweight", 0.4)],
    "EEE": [("Hold", 0.05), ("Hold", -0.05), ("Overweight", 0.25), ("Underweight", -0.3)],
}
