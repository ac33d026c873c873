"""What the third pass left, measured through the product's own code
(docs/lab/2026-12-07-verdicts-outside-4.md). Run from a checkout with ``PYTHONPATH=$PWD``
(it imports the tests' bench simulator), under the bench lock:

- ``.venv/bin/python docs/bench/verdicts-outside-4.py holm 2000``: the bench's adaptive
  arms' verdicts (``app.bench.schedulers._judge``, Holm over the arms, through
  ``tests.unit.support.bench_arms.judged_calls``) when some arms truly differ and the others
  do not (the nulls Holm is meant to keep at 5% whatever the others do), with the fixed
  arms they share equal, unequal or noisier;
- ``... rounds 2000``: the lead verdict when the arms of a round share noise: a round's
  own effect, a random-walk drift, a steady trend over the bench, spells of a busy host;
- ``... bound 2000 [levels,...] [mean,median,small]``: the graph bound's 90% interval
  (``app.bench.bound.bound_interval``) with its size rule lifted, on the second pass's
  world (levels drawn from 1-64 running, noise of mean or median 1) and on a small
  server's (every level 1 to its ``max_num_seqs``), at 10% and 30% noise;
- ``... kappa 300 [tickers,...] [world,...]``: ``quality repro``'s QWK and Spearman 95%
  intervals (``averaging.agreement_by_k``, one sample a side, 1,000 resamples) with QWK's
  size rule lifted, in worlds of weaker and stronger agreement.

± is one binomial standard error; every case is seeded.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections import Counter
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from typing import Any

import numpy as np

from tests.unit.support.bench_arms import judged_calls


def share(count: int, trials: int) -> str:
    if not trials:
        return "none given"
    rate = count / trials
    return f"{rate:.4f} ± {math.sqrt(rate * (1 - rate) / trials):.4f} ({count} of {trials})"


def apart(got: Counter[str], arm: int) -> int:
    return got[f"adaptive-{arm}: a lead"] + got[f"adaptive-{arm}: a deficit"]


def holm_main(trials: int) -> None:
    """Partial nulls: ``arms`` gives each adaptive arm's true mean (sd 2 a run); the fixed
    arms are (mean, sd). A false call is a call on an arm equal to the best fixed arm, or
    a call the wrong way on one that truly differs."""
    equal = [(100.0, 2.0)]
    cases: list[tuple[str, list[tuple[float, float]], list[float]]] = [
        ("one arm +6% (3 sd), one equal; 1 fixed", equal, [106.0, 100.0]),
        ("one arm +6% (3 sd), one equal; 4 fixed", equal * 4, [106.0, 100.0]),
        ("one arm -6%, one equal; 1 fixed", equal, [94.0, 100.0]),
        ("one arm -6%, one equal; 4 fixed", equal * 4, [94.0, 100.0]),
        ("two arms +20%, one equal; 1 fixed", equal, [120.0, 120.0, 100.0]),
        ("two arms +20%, one equal; 4 fixed", equal * 4, [120.0, 120.0, 100.0]),
        ("one +20%, one -20%, one equal; 1 fixed", equal, [120.0, 80.0, 100.0]),
        ("two arms +20%, one equal; 1 fixed 3x noisier", [(100.0, 6.0)],
         [120.0, 120.0, 100.0]),
        ("two arms +20%, one equal; 4 fixed 3x noisier", [(100.0, 6.0)] * 4,
         [120.0, 120.0, 100.0]),
        ("one arm +6%, one equal; fixed 100/97/94/91", [(100.0, 2.0), (97.0, 2.0),
                                                       (94.0, 2.0), (91.0, 2.0)],
         [106.0, 100.0]),
        ("three equal; fixed 100/97/94/91", [(100.0, 2.0), (97.0, 2.0), (94.0, 2.0),
                                             (91.0, 2.0)], [100.0, 100.0, 100.0]),
        ("two equal; noisy best fixed (100, sd 6) and quiet (97, sd 0.5)",
         [(100.0, 6.0), (97.0, 0.5)], [100.0, 100.0]),
    ]
    seed = 400
    for label, fixed, means in cases:
        best = max(m for m, _ in fixed)
        for runs in (3, 5, 10):
            seed += 1
            sd = [0.5 if "quiet" in label else 2.0] * len(means)
            got = judged_calls(fixed, [(m, s) for m, s in zip(means, sd, strict=True)], runs,
                               trials, seed, first_all=True)
            false = []
            for j, mean in enumerate(means):
                if mean == best:
                    false.append(apart(got, j))
                else:  # the wrong way
                    false.append(got[f"adaptive-{j}: a {'deficit' if mean > best else 'lead'}"])
            truly = [got[f"adaptive-{j}: a {'lead' if m > best else 'deficit'}"]
                     for j, m in enumerate(means) if m != best]
            print(f"holm: {label}, {runs} runs: false calls, summed over arms (an upper "
                  f"bound of any false) {share(min(sum(false), trials), trials)}; per arm "
                  + ", ".join(str(f) for f in false)
                  + (f"; true calls per differing arm {truly}" if truly else ""), flush=True)


def trend(total: float) -> Callable[[np.random.Generator, tuple[int, int]], np.ndarray]:
    """A steady change over the bench in the order it ran, ``total`` from its first run to
    its last (the host growing busier)."""
    def shared(_rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
        size = shape[0] * shape[1]
        return np.linspace(0.0, total, size).reshape(shape)
    return shared


def spells(start: float, length: int, slowdown: float,
           ) -> Callable[[np.random.Generator, tuple[int, int]], np.ndarray]:
    """Spells of a busy host: at each run a spell starts with chance ``start`` (and one may
    be under way when the bench begins), and slows ``length`` runs in a row by
    ``slowdown``."""
    def shared(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
        size = shape[0] * shape[1]
        begins = rng.random(size + length) < start  # from ``length`` runs before the first
        busy = np.convolve(begins, np.ones(length), mode="full")[length:length + size] > 0
        return (-slowdown * busy).reshape(shape)
    return shared


def rounds_main(trials: int) -> None:
    seed = 500
    kinds: list[tuple[str, dict[str, Any]]] = [
        ("none (baseline)", {}),
        ("round effect, sd = a run's", {"round_sd": 2.0}),
        ("round effect, sd = 3 x a run's", {"round_sd": 6.0}),
        ("drift, a random walk of 1/2 a run's sd a run", {"drift_sd": 1.0}),
        ("drift, a random walk of 1.5 x a run's sd a run", {"drift_sd": 3.0}),
        ("trend over the bench, 3 run sds in all", {"shared": trend(6.0)}),
        ("trend over the bench, 10 run sds in all", {"shared": trend(20.0)}),
        ("busy spells of 3 runs (start 10% a run), 3 run sds slower",
         {"shared": spells(0.1, 3, 6.0)}),
        ("busy spells of 8 runs (start 5% a run), 3 run sds slower",
         {"shared": spells(0.05, 8, 6.0)}),
    ]
    for arms_label, fixed, adaptive in (
            ("1 fixed, 1 adaptive", [(100.0, 2.0)], (100.0, 2.0)),
            ("4 fixed, 1 adaptive", [(100.0, 2.0)] * 4, (100.0, 2.0)),
            ("1 fixed, 2 adaptive", [(100.0, 2.0)], [(100.0, 2.0), (100.0, 2.0)])):
        for label, kwargs in kinds:
            for runs in (3, 5, 10):
                seed += 1
                got = judged_calls(fixed, adaptive, runs, trials, seed, first_all=True,
                                   **kwargs)
                called = (got["any apart"] if isinstance(adaptive, list)
                          else got["a lead"] + got["a deficit"])
                print(f"rounds: {arms_label}, {label}, {runs} runs, equal: apart "
                      f"{share(called, trials)}", flush=True)
    for label, kwargs in kinds[:1] + kinds[2:3] + kinds[6:7]:
        for runs in (3, 5, 10):
            seed += 1
            got = judged_calls([(100.0, 2.0)], (106.0, 2.0), runs, trials, seed,
                               first_all=True, **kwargs)
            print(f"rounds power: +6% (3 sd), 1 fixed, {label}, {runs} runs: a lead "
                  f"{share(got['a lead'], trials)}", flush=True)


@cache
def _v3() -> Any:
    path = Path(__file__).with_name("verdicts-outside-3.py")
    spec = importlib.util.spec_from_file_location("verdicts_outside_3", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def small_server(levels: int, noise: float, runs: int, seed: int,
                 ) -> Any:
    """Yield ``runs`` level sets of a server of ``levels`` sequences read at every running
    level 1 to ``levels`` (a CPU server's few levels), noise as ``bound_draws``' of mean 1."""
    v2 = _v3()._v2()
    rng = np.random.default_rng(seed)
    for _ in range(runs):
        drawn = {}
        for r in range(1, levels + 1):
            tokens = float(rng.uniform(500, 20_000))
            drawn[r] = [tokens, tokens / r * v2.STEP.at(r)
                        * float(np.exp(rng.normal(-noise**2 / 2, noise)))]
        yield drawn


def bound_main(runs: int, sizes: str, worlds: str) -> None:
    import app.bench.bound as bound

    v2 = _v3()._v2()
    bound.MIN_INTERVAL_LEVELS = 3  # the rule lifted: measure the interval it withholds
    for noise in (0.1, 0.3):
        for centre in worlds.split(","):
            for levels in (int(x) for x in sizes.split(",")):
                held = given = 0
                widths = []
                seqs = levels if centre == "small" else v2.SEQS
                true = bound.graph_bound(v2.GRAPH, v2.KV, seqs, v2.STEP)
                assert true is not None
                draws = (small_server(levels, noise, runs, levels * 100 + 12)
                         if centre == "small" else
                         _v3().bound_draws(levels, noise, runs, levels * 100 + 11, centre))
                for drawn in draws:
                    found = bound.bound_interval(v2.GRAPH, v2.KV, seqs, drawn)
                    if found is None:
                        continue
                    given += 1
                    held += found[0] <= true.tok_s <= found[1]
                    widths.append((found[1] - found[0]) / true.tok_s)
                print(f"bound 90%, {levels} levels, noise {noise:.0%} "
                      f"({'small server' if centre == 'small' else centre + ' 1'}): "
                      f"{share(held, given)}; median width {np.median(widths):.1%} of the "
                      f"bound", flush=True)


WORLDS = {
    # name: (noise sd beside a signal of sd 1, scale, shift): tanh(scale (s + e) + shift)
    "v2": (1.0, 0.8, 0.0),  # the second pass's: QWK about 0.42
    "close": (0.5, 0.8, 0.0),  # runs that agree more
    "weak": (2.0, 0.8, 0.0),  # runs that agree less
    "hold": (1.0, 0.12, 0.0),  # most grades Hold (about 60%)
    "skew": (1.0, 0.8, 0.5),  # most grades Buy or Overweight
}


def kappa_main(runs: int, sizes: str, worlds: str) -> None:
    from agents.decision import rating_for_score
    from app.quality import averaging
    from app.quality.averaging import agreement_by_k, between
    from app.quality.grades import Grade
    from app.quality.statistics import quadratic_kappa

    averaging.MIN_KAPPA_INTERVAL_N = 0  # the rule lifted: measure the interval it withholds
    for world in worlds.split(","):
        noise, scale, shift = WORLDS[world]

        def scores(rng: np.random.Generator, signal: np.ndarray,
                   noise: float = noise, scale: float = scale, shift: float = shift,
                   ) -> np.ndarray:
            return np.tanh(scale * (signal + rng.normal(0, noise, signal.shape)) + shift)

        rng = np.random.default_rng(23)
        signal = rng.normal(size=400_000)
        a, b = scores(rng, signal), scores(rng, signal)
        grades = Counter(rating_for_score(float(x)) for x in a)
        true_qwk = quadratic_kappa([rating_for_score(float(x)) for x in a],
                                   [rating_for_score(float(x)) for x in b])
        true_rho = 6 / math.pi * math.asin(1 / (1 + noise**2) / 2)
        print(f"kappa world {world}: population QWK {true_qwk:.4f}, Spearman {true_rho:.4f}, "
              "grades " + ", ".join(f"{g} {c / len(a):.0%}" for g, c in grades.most_common()),
              flush=True)
        for n in (int(x) for x in sizes.split(",")):
            held: Counter[str] = Counter()
            given: Counter[str] = Counter()
            for run in range(runs):
                signal = rng.normal(size=n)
                sides = []
                for _ in range(2):
                    drawn = scores(rng, signal)
                    sides.append({f"T{i}": [Grade(0, rating_for_score(float(x)), float(x),
                                                  False)] for i, x in enumerate(drawn)})
                (row,) = agreement_by_k(sides[0], sides[1], partial(between, 1, 1), [1],
                                        resamples=1000, seed=run)
                for name, interval, true in (("qwk", row.qwk_ci, true_qwk),
                                             ("spearman", row.spearman_ci, true_rho)):
                    if interval is not None:
                        given[name] += 1
                        held[name] += interval[0] <= true <= interval[1]
            print(f"kappa world {world}, {n} tickers: QWK 95% {share(held['qwk'], given['qwk'])}"
                  f"; Spearman 95% {share(held['spearman'], given['spearman'])}", flush=True)


if __name__ == "__main__":
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    extra = sys.argv[3] if len(sys.argv) > 3 else ""
    if sys.argv[1] == "holm":
        holm_main(count or 2000)
    elif sys.argv[1] == "rounds":
        rounds_main(count or 2000)
    elif sys.argv[1] == "bound":
        bound_main(count or 2000, extra or "3,4,5,6,8,10,12",
                   sys.argv[4] if len(sys.argv) > 4 else "mean,median")
    elif sys.argv[1] == "kappa":
        kappa_main(count or 300, extra or "20,25,30",
                   sys.argv[4] if len(sys.argv) > 4 else "v2,close,weak,hold,skew")
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}: holm, rounds, bound or kappa")
