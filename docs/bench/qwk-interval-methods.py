"""Which interval of QWK holds its 95%? A comparison of methods, used to choose one
(docs/lab/2026-12-07-qwk-interval.md). Not the product's code: QWK is computed here from
its confusion matrix for thousands of resamples at once (checked equal to scikit-learn's
``cohen_kappa_score(weights="quadratic")`` to 1e-12 on 200 random cases); the chosen
method's coverage is measured through the product by docs/bench/qwk-interval.py.

    .venv/bin/python docs/bench/qwk-interval-methods.py DRAWS SIZES WORLDS OUT.json

Worlds as docs/bench/qwk-interval.py's (other seeds). Methods, each a 95% interval from
one draw of n tickers: ``perc`` percentile bootstrap (1,000 resamples; the product's until
now), ``bca`` BCa (scipy's formulas), ``xperc`` Hesterberg's expanded percentile,
``boot_t`` θ ± t·(bootstrap sd), ``jack_t``/``jack_z`` θ ± t or z·(jackknife error),
``jack_fz`` tanh(atanh θ ± t·(jackknife error of atanh θ)), t Student's on n − 1 df.
OUT.json holds one record a draw and method: world, n, tickers off Hold by either side,
the fewer off Hold of the two sides, method, held (1/0); docs/bench/qwk-interval-methods.json
is its summary.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
from scipy import stats
from scipy.special import ndtr, ndtri

WEIGHTS = np.array([[(i - j) ** 2 for j in range(5)] for i in range(5)], float)
WORLDS = {"v2": (1, .8, 0), "close": (.5, .8, 0), "weak": (2, .8, 0), "hold": (1, .12, 0),
          "skew": (1, .8, .5), "rare": (1, .08, 0), "high": (.2, .8, 0),
          "rarehigh": (.3, .1, 0), "skewhigh": (.3, .8, .6)}
RECORDS: list[tuple[str, int, int, int, str, int]] = []


def codes(x: np.ndarray) -> np.ndarray:
    """Buy 0 … Sell 4, as agents.decision.rating_for_score grades a score."""
    return np.where(x >= 0.5, 0, np.where(x >= 0.15, 1, np.where(
        x > -0.15, 2, np.where(x > -0.5, 3, 4))))


def kappa_counts(c: np.ndarray) -> np.ndarray:
    """QWK of each confusion matrix (..., 25 counts); NaN where the product gives None."""
    observed = c.reshape((*c.shape[:-1], 5, 5)).astype(float)
    n = observed.sum((-1, -2))
    r, k = observed.sum(-1), observed.sum(-2)
    expected = r[..., :, None] * k[..., None, :] / n[..., None, None]
    num = (WEIGHTS * observed).sum((-1, -2))
    den = (WEIGHTS * expected).sum((-1, -2))
    with np.errstate(all="ignore"):
        out = 1 - num / den
    out = np.where(((r > 0).sum(-1) == 1) & ((k > 0).sum(-1) == 1), np.nan, out)
    return np.where(den == 0, np.nan, out)


def kappa_of(cells: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """QWK of each row of ticker indices ``idx`` (B, m); ``cells`` is 5·left + right."""
    b = idx.shape[0]
    flat = (np.arange(b)[:, None] * 25 + cells[idx]).ravel()
    return kappa_counts(np.bincount(flat, minlength=b * 25).reshape(b, 25))


def intervals(cells: np.ndarray, n: int, boot: np.ndarray, th: float,
              ) -> dict[str, tuple[float, float]]:
    tq, zq = stats.t.ppf(0.975, n - 1), 1.959964
    res: dict[str, tuple[float, float]] = {}
    res["perc"] = tuple(np.percentile(boot, [2.5, 97.5]))
    p = ((boot < th).sum() + (boot <= th).sum()) / (2 * len(boot))
    z0 = ndtri(p)
    jack = kappa_of(cells, np.array([np.delete(np.arange(n), i) for i in range(n)]))
    if np.isfinite(jack).all():
        dd = jack.mean() - jack
        acc = (dd ** 3).sum() / (6 * ((dd ** 2).sum()) ** 1.5) if (dd ** 2).sum() > 0 else 0
        al = [ndtr(z0 + (z0 + z) / (1 - acc * (z0 + z))) for z in (-zq, zq)]
        res["bca"] = tuple(np.percentile(boot, [100 * al[0], 100 * al[1]]))
        se = math.sqrt((n - 1) / n * ((jack - jack.mean()) ** 2).sum())
        res["jack_t"] = (th - tq * se, th + tq * se)
        res["jack_z"] = (th - zq * se, th + zq * se)
        if abs(th) < 1 and (np.abs(jack) < 1).all():
            zj = np.arctanh(jack)
            zse = math.sqrt((n - 1) / n * ((zj - zj.mean()) ** 2).sum())
            res["jack_fz"] = (math.tanh(np.arctanh(th) - tq * zse),
                              math.tanh(np.arctanh(th) + tq * zse))
        else:  # z infinite: the product gives none; here the plain jackknife one, capped
            res["jack_fz"] = (th - tq * se, min(1.0, th + tq * se))
    zx = stats.t.ppf(0.975, n - 1) * math.sqrt(n / (n - 1))
    res["xperc"] = tuple(np.percentile(boot, [100 * ndtr(-zx), 100 * ndtr(zx)]))
    bse = boot.std(ddof=1)
    res["boot_t"] = (th - tq * bse, th + tq * bse)
    return res


def run(world: str, n: int, draws: int, resamples: int = 1000, seed: int = 1) -> None:
    noise, scale, shift = WORLDS[world]
    rng = np.random.default_rng(seed)

    def scores(s: np.ndarray) -> np.ndarray:
        return np.tanh(scale * (s + rng.normal(0, noise, s.shape)) + shift)

    s = rng.normal(size=400_000)
    a, b = codes(scores(s)), codes(scores(s))
    true = float(kappa_counts(np.bincount(a * 5 + b, minlength=25)))
    hits: dict[str, int] = {}
    given: dict[str, int] = {}
    for _ in range(draws):
        s = rng.normal(size=n)
        cells = codes(scores(s)) * 5 + codes(scores(s))
        th = float(kappa_of(cells, np.arange(n)[None])[0])
        if not np.isfinite(th):
            continue
        boot = kappa_of(cells, rng.integers(0, n, (resamples, n)))
        if np.isnan(boot).mean() > 0.1:
            continue
        res = intervals(cells, n, boot[np.isfinite(boot)], th)
        off = int(((cells // 5 != 2) | (cells % 5 != 2)).sum())
        fewer = int(min((cells // 5 != 2).sum(), (cells % 5 != 2).sum()))
        for m, (lo, hi) in res.items():
            RECORDS.append((world, n, off, fewer, m, int(lo <= true <= hi)))
            given[m] = given.get(m, 0) + 1
            hits[m] = hits.get(m, 0) + (lo <= true <= hi)
    print(f"{world:9s} n={n} true={true:.3f} " + " ".join(
        f"{m}:{hits[m] / given[m]:.3f}({given[m]})" for m in hits), flush=True)


if __name__ == "__main__":
    count, sizes = int(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")]
    for name in sys.argv[3].split(","):
        for size in sizes:
            run(name, size, count)
    with open(sys.argv[4], "w") as f:
        json.dump(RECORDS, f)
