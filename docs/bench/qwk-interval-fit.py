"""Fit the widening of QWK's jackknife interval (``statistics.KAPPA_INTERVAL_WIDEN``) on
draws of their own (docs/lab/2026-12-07-qwk-interval-2.md). Not the product's code: QWK
and its leave-one-out values come from docs/bench/qwk-interval-methods.py's confusion-matrix
copy (equal to scikit-learn's to 1e-12), so 3,000 draws a cell take seconds; the chosen
widening is judged on fresh draws through the product by docs/bench/qwk-interval-2.py.

    .venv/bin/python docs/bench/qwk-interval-fit.py DRAWS SIZES SEED OUT.json

For each world (qwk-interval.py's) and size, the interval tanh(z ± c·t·se) (z = atanh
QWK, se its jackknife error, t Student's on n − 1 df) under the shipped rule (40
tickers, 10 off Hold a side) for each candidate c: coverage of the population QWK, ± one
binomial standard error, and the median width. Seed 21 fitted 1.10.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

_spec = importlib.util.spec_from_file_location(
    "methods", Path(__file__).with_name("qwk-interval-methods.py"))
assert _spec and _spec.loader
methods = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(methods)
CANDIDATES = (1.0, 1.05, 1.08, 1.10, 1.12, 1.15)


def draws_of(world: str, n: int, draws: int, seed: int) -> tuple[float, np.ndarray]:
    """Return the population QWK and, a draw a row: z, its jackknife error (NaN: none given)."""
    noise, scale, shift = methods.WORLDS[world]
    rng = np.random.default_rng([seed, sorted(methods.WORLDS).index(world), n])

    def scores(s: np.ndarray) -> np.ndarray:
        return np.tanh(scale * (s + rng.normal(0, noise, s.shape)) + shift)

    s = rng.normal(size=400_000)
    a, b = methods.codes(scores(s)), methods.codes(scores(s))
    true = float(methods.kappa_counts(np.bincount(a * 5 + b, minlength=25)))
    out = np.full((draws, 2), np.nan)
    leave_out = np.array([np.delete(np.arange(n), i) for i in range(n)])
    for d in range(draws):
        s = rng.normal(size=n)
        a, b = methods.codes(scores(s)), methods.codes(scores(s))
        if min((a != 2).sum(), (b != 2).sum()) < 10 or n < 40:
            continue
        cells = a * 5 + b
        values = np.append(methods.kappa_of(cells, leave_out),
                           methods.kappa_of(cells, np.arange(n)[None]))
        if not np.all(np.abs(values) < 1):  # NaN too: the product gives no interval
            continue
        z = np.arctanh(values)
        out[d] = z[-1], math.sqrt((n - 1) / n * ((z[:-1] - z[:-1].mean()) ** 2).sum())
    return true, out


def main(argv: list[str]) -> None:
    draws, sizes, seed = int(argv[1]), [int(x) for x in argv[2].split(",")], int(argv[3])
    result: dict[str, object] = {"draws": draws, "seed": seed, "cells": []}
    worst = dict.fromkeys(CANDIDATES, 1.0)
    for world in methods.WORLDS:
        for n in sizes:
            true, rec = draws_of(world, n, draws, seed)
            rec = rec[~np.isnan(rec[:, 0])]
            line: dict[str, object] = {"world": world, "tickers": n, "true_qwk": round(true, 4),
                                       "given": len(rec)}
            t = float(stats.t.ppf(0.975, n - 1))
            for c in CANDIDATES:
                lo, hi = rec[:, 0] - c * t * rec[:, 1], rec[:, 0] + c * t * rec[:, 1]
                cover = float(np.mean((lo <= math.atanh(true)) & (math.atanh(true) <= hi)))
                if len(rec) >= 500:  # cells of fewer draws given are too noisy to fit on
                    worst[c] = min(worst[c], cover)
                line[str(c)] = {"coverage": round(cover, 4), "standard_error": round(
                    math.sqrt(cover * (1 - cover) / len(rec)), 4) if len(rec) else None,
                    "median_width": round(float(np.median(np.tanh(hi) - np.tanh(lo))), 4)
                    if len(rec) else None}
            result["cells"].append(line)  # type: ignore[attr-defined]
            print(world, n, len(rec), {c: line[str(c)]["coverage"]  # type: ignore[index]
                                       for c in CANDIDATES}, flush=True)
    result["worst_coverage"] = {str(c): round(v, 4) for c, v in worst.items()}
    print("worst cell (500+ given):", result["worst_coverage"])
    with open(argv[4], "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv)
