"""Does QWK's calibrated "95%" interval hold 95%, at k = 1 and at k ≥ 2 samples averaged?
Measured through the product's own ``averaging.agreement_by_k``
(docs/lab/2026-12-07-qwk-interval-2.md). Run from a checkout, under the bench lock (about
10 minutes on 2 cores):

    flock /work/notes/bench.lock env PYTHONPATH=$PWD .venv/bin/python \\
        docs/bench/qwk-interval-2.py [--seed 22] [--jobs 2] [--quick] OUT.json

Worlds as docs/bench/qwk-interval.py's: a sample's score is tanh(scale·(signal + noise) +
shift), signal shared by the tickers' samples, noise fresh per sample, graded by
``rating_for_score``; each side has N samples a ticker and the row at k grades the band of
the mean of k (``between(N, N, k)``, the choices as ``quality repro`` takes them). The true
QWK at k is the population's (400,000 tickers, one choice). Coverage is the share of the
intervals given that hold it, ± one binomial standard error; the width before this change
is the same interval's with the half-width on z divided by ``KAPPA_INTERVAL_WIDEN``.
Seed 22 is fresh: the widening was fitted on docs/bench/qwk-interval-fit.py's draws.
"""

from __future__ import annotations

import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import numpy as np

from agents.decision import rating_for_score
from app.quality.averaging import agreement_by_k, between
from app.quality.grades import Grade
from app.quality.statistics import KAPPA_INTERVAL_WIDEN, quadratic_kappa

WORLDS = {  # name: (noise sd beside a signal of sd 1, scale, shift), qwk-interval.py's
    "v2": (1.0, 0.8, 0.0), "close": (0.5, 0.8, 0.0), "weak": (2.0, 0.8, 0.0),
    "hold": (1.0, 0.12, 0.0), "skew": (1.0, 0.8, 0.5), "rare": (1.0, 0.08, 0.0),
    "high": (0.2, 0.8, 0.0), "rarehigh": (0.3, 0.1, 0.0), "skewhigh": (0.3, 0.8, 0.6)}
# (world, tickers, samples a side N, k, draws): every world at 40 tickers, N = 1; the
# hard cells (most grades Hold, or skewed grades and high agreement) with more draws and
# at the sizes where the plain interval fell short; k = 1 and 2 of N = 2, and k = 2 of
# N = 4 (6 of its 36 choices in the interval), in three worlds.
CELLS = [(w, 40, 1, 1, 1000) for w in ("v2", "close", "weak", "skew", "high")] + [
    ("hold", 40, 1, 1, 1500), ("rare", 40, 1, 1, 1000), ("rarehigh", 40, 1, 1, 1000),
    ("skewhigh", 40, 1, 1, 3000), ("skewhigh", 60, 1, 1, 2000),
    ("hold", 100, 1, 1, 2500), ("rare", 100, 1, 1, 2500), ("rarehigh", 100, 1, 1, 1000),
    ("v2", 40, 2, 1, 400), ("v2", 40, 2, 2, 400), ("hold", 60, 2, 2, 400),
    ("skewhigh", 40, 2, 1, 400), ("skewhigh", 40, 2, 2, 400), ("skewhigh", 40, 4, 2, 200)]
CHUNK = 200  # draws a task: chunks spread over the jobs, each with its own seed


def scores(world: str, rng: np.random.Generator, signal: np.ndarray, n: int) -> np.ndarray:
    """N samples' scores a ticker, shape (tickers, N)."""
    noise, scale, shift = WORLDS[world]
    return np.tanh(scale * (signal[:, None] + rng.normal(0, noise, (len(signal), n))) + shift)


def true_qwk(world: str, k: int, seed: int) -> float:
    rng = np.random.default_rng([seed, 999, sorted(WORLDS).index(world), k])
    signal = rng.normal(size=400_000)
    a, b = ([rating_for_score(float(x)) for x in scores(world, rng, signal, k).mean(1)]
            for _ in range(2))
    value = quadratic_kappa(a, b)
    assert value is not None
    return value


def chunk(cell: tuple[str, int, int, int, int], index: int, draws: int, seed: int,
          true: float) -> list[list[float]]:
    """Each draw: [given, held, true below, true above, width, width before]."""
    world, n, samples, k, _ = cell
    rng = np.random.default_rng([seed, sorted(WORLDS).index(world), n, samples, k, index])
    out = []
    for draw in range(draws):
        signal = rng.normal(size=n)
        sides = [{f"T{i}": [Grade(s, rating_for_score(float(x)), float(x), False)
                            for s, x in enumerate(row)]
                  for i, row in enumerate(scores(world, rng, signal, samples))}
                 for _ in range(2)]
        rows = agreement_by_k(sides[0], sides[1], partial(between, samples, samples), [k],
                              resamples=1, seed=draw)
        (row,) = rows
        if row.qwk_ci is None:
            out.append([0, 0, 0, 0, math.nan, math.nan])
            continue
        lo, hi = row.qwk_ci
        centre, half = (math.atanh(hi) + math.atanh(lo)) / 2, (math.atanh(hi) - math.atanh(lo)) / 2
        before = math.tanh(centre + half / KAPPA_INTERVAL_WIDEN) - math.tanh(
            centre - half / KAPPA_INTERVAL_WIDEN)
        out.append([1, lo <= true <= hi, true < lo, true > hi, hi - lo, before])
    return out


def main(argv: list[str]) -> None:
    seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 22
    jobs = int(argv[argv.index("--jobs") + 1]) if "--jobs" in argv else 2
    cells = [(*c[:4], c[4] // 10) for c in CELLS] if "--quick" in argv else CELLS
    keys = sorted({(c[0], c[3]) for c in cells})  # (world, k): one population each
    tasks = [(c, i, min(CHUNK, c[4] - i * CHUNK)) for c in cells
             for i in range(math.ceil(c[4] / CHUNK))]
    with ProcessPoolExecutor(jobs) as pool:
        truths = dict(zip(keys, pool.map(true_qwk, [w for w, _ in keys], [k for _, k in keys],
                                         [seed] * len(keys)), strict=True))
        done = list(pool.map(chunk, [c for c, _, _ in tasks], [i for _, i, _ in tasks],
                             [d for _, _, d in tasks], [seed] * len(tasks),
                             [truths[c[0], c[3]] for c, _, _ in tasks]))
    result: dict[str, object] = {"seed": seed, "widen": KAPPA_INTERVAL_WIDEN, "cells": []}
    for cell in cells:
        world, n, samples, k, draws = cell
        rec = np.array([r for (c, _, _), part in zip(tasks, done, strict=True) if c == cell
                        for r in part])
        given = int(rec[:, 0].sum())
        held = rec[rec[:, 0] == 1]
        cover = float(held[:, 1].mean()) if given else math.nan
        error = math.sqrt(cover * (1 - cover) / given) if given else math.nan
        width, before = (float(np.median(held[:, j])) if given else math.nan for j in (4, 5))
        line = {"world": world, "tickers": n, "samples": samples, "k": k, "draws": draws,
                "true_qwk": round(truths[world, k], 4), "given": given,
                "coverage": round(cover, 4), "standard_error": round(error, 4),
                "true_below": int(held[:, 2].sum()), "true_above": int(held[:, 3].sum()),
                "median_width": round(width, 4), "median_width_before": round(before, 4)}
        result["cells"].append(line)  # type: ignore[attr-defined]
        print(f"{world:9s} n={n:3d} N={samples} k={k}: {cover:.2%} ± {error:.2%} of {given} "
              f"(drawn {draws}); below {line['true_below']}, above {line['true_above']}; "
              f"width {width:.3f} (before {before:.3f})", flush=True)
    with open(argv[-1], "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv)
