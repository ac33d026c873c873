"""Does QWK's "95%" interval hold 95%? Measured through the product's own code
(docs/lab/2026-12-07-qwk-interval.md). Run from a checkout, under the bench lock:

    PYTHONPATH=$PWD .venv/bin/python docs/bench/qwk-interval.py DRAWS SIZES WORLDS [OUT.json]
                                                  [--min-tickers N] [--seed S]

Two runs grade the same tickers, one sample a side: a ticker's score is
tanh(scale·(signal + noise) + shift), signal and noise normal, graded by
``agents.decision.rating_for_score``; the runs share the signal. The true QWK is the
population's (400,000 tickers, ``statistics.quadratic_kappa``). Each draw goes through
``averaging.agreement_by_k`` (k = 1, the interval as ``quality repro`` and ``quality samples``
give it, its rule on tickers and grades off Hold applied unless ``--min-tickers`` lowers
the ticker count); coverage is the share of the intervals given that hold the true QWK, ±
one binomial standard error. ``resamples`` is 1: QWK's interval does not resample, and
Spearman's (a bootstrap) is not measured here.
"""

from __future__ import annotations

import json
import math
import sys
from functools import partial

import numpy as np

from agents.decision import rating_for_score
from app.quality import averaging
from app.quality.averaging import agreement_by_k, between
from app.quality.grades import Grade
from app.quality.statistics import quadratic_kappa

WORLDS = {
    # name: (noise sd beside a signal of sd 1, scale, shift); the first five are
    # docs/bench/verdicts-outside-4.py's (v2 is verdicts-outside-2.py's and -3.py's world)
    "v2": (1.0, 0.8, 0.0),  # QWK 0.42, Buy and Sell 31% each
    "close": (0.5, 0.8, 0.0),  # runs that agree more: QWK 0.73
    "weak": (2.0, 0.8, 0.0),  # runs that agree less: QWK 0.15
    "hold": (1.0, 0.12, 0.0),  # Hold 63%
    "skew": (1.0, 0.8, 0.5),  # Buy 48%
    # new here, meant to be hard
    "rare": (1.0, 0.08, 0.0),  # Hold 82%: a handful of tickers off Hold at 30-40
    "high": (0.2, 0.8, 0.0),  # near-perfect agreement: QWK 0.93
    "rarehigh": (0.3, 0.1, 0.0),  # Hold 85% and QWK 0.70
    "skewhigh": (0.3, 0.8, 0.6),  # Buy 52% and QWK 0.86
}


def world_result(name: str, draws: int, sizes: list[int], seed: int) -> dict[str, object]:
    noise, scale, shift = WORLDS[name]
    rng = np.random.default_rng(sorted(WORLDS).index(name) + 100 + 1000 * seed)

    def scores(signal: np.ndarray) -> np.ndarray:
        return np.tanh(scale * (signal + rng.normal(0, noise, signal.shape)) + shift)

    signal = rng.normal(size=400_000)
    a = [rating_for_score(float(x)) for x in scores(signal)]
    b = [rating_for_score(float(x)) for x in scores(signal)]
    true = quadratic_kappa(a, b)
    assert true is not None
    shares = {g: round(a.count(g) / len(a), 3) for g in sorted(set(a), key=a.count, reverse=True)}
    print(f"{name}: true QWK {true:.4f}, grades {shares}", flush=True)
    out: dict[str, object] = {"noise": noise, "scale": scale, "shift": shift,
                              "true_qwk": round(true, 4), "grades": shares, "sizes": {}}
    for n in sizes:
        held = low = high = given = 0
        widths = []
        for draw in range(draws):
            signal = rng.normal(size=n)
            sides = [{f"T{i}": [Grade(0, rating_for_score(float(x)), float(x), False)]
                      for i, x in enumerate(scores(signal))} for _ in range(2)]
            (row,) = agreement_by_k(sides[0], sides[1], partial(between, 1, 1), [1],
                                    resamples=1, seed=draw)
            if row.qwk_ci is None:
                continue
            given += 1
            lo, hi = row.qwk_ci
            held += lo <= true <= hi
            low += true < lo
            high += true > hi
            widths.append(hi - lo)
        cover = held / given if given else float("nan")
        error = math.sqrt(cover * (1 - cover) / given) if given else float("nan")
        print(f"{name}, {n} tickers: {cover:.2%} ± {error:.2%} of {given} given ({draws} "
              f"drawn); true QWK above the interval {high}, below {low}; median width "
              f"{np.median(widths) if widths else float('nan'):.3f}", flush=True)
        out["sizes"][str(n)] = {  # type: ignore[index]
            "draws": draws, "given": given, "held": held, "coverage": round(cover, 4),
            "standard_error": round(error, 4), "true_above": high, "true_below": low,
            "median_width": round(float(np.median(widths)), 4) if widths else None}
    return out


def main(argv: list[str]) -> None:
    seed = 0
    if "--seed" in argv:  # other draws, for more of them
        at = argv.index("--seed")
        seed = int(argv[at + 1])
        argv = argv[:at] + argv[at + 2:]
    if "--min-tickers" in argv:
        at = argv.index("--min-tickers")
        averaging.MIN_KAPPA_INTERVAL_N = int(argv[at + 1])  # measure below the rule
        argv = argv[:at] + argv[at + 2:]
    draws, sizes = int(argv[1]), [int(x) for x in argv[2].split(",")]
    worlds = list(WORLDS) if argv[3] == "all" else argv[3].split(",")
    result = {"draws": draws, "seed": seed, "min_tickers": averaging.MIN_KAPPA_INTERVAL_N,
              "min_off_hold": averaging.MIN_KAPPA_OFF_HOLD,
              "worlds": {w: world_result(w, draws, sizes, seed) for w in worlds}}
    if len(argv) > 4:
        with open(argv[4], "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv)
