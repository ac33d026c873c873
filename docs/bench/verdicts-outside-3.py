"""The stated rates the second pass left, measured through the product's own code
(docs/lab/2026-12-07-verdicts-outside-3.md). Run from a checkout with ``PYTHONPATH=$PWD``
(it imports the tests' bench simulator), under the bench lock:

- ``.venv/bin/python docs/bench/verdicts-outside-3.py family 2000``: with two or three
  adaptive arms in one bench, how often at least one is called apart from fixed arms of
  the same true mean (``app.bench.schedulers._judge``, through
  ``tests.unit.support.bench_arms.judged_calls``), each arm's own rate, and the rates when
  one arm truly leads;
- ``... rounds 2000``: the lead verdict when noise is shared by every arm of a round (a
  loaded host slows the whole round of ``bench schedulers --repeat``) or drifts over the
  bench, and when ``bench combine`` joins arms that each ran in a call of their own;
- ``... bound 1000 [levels,...] [methods|product] [mean,median]``: how often the graph
  bound's 90% interval holds the true step's bound, with noise whose mean is the truth and,
  as the second pass drew it, whose median is: ``product``, the product's own interval
  (``app.bench.bound.bound_interval``); ``methods``, the percentile and BCa intervals of the
  product's fit from one set of resamples (the choice of a method);
- ``... kappa 400 [tickers,...]``: ``quality repro``'s QWK 95% interval
  (``averaging.agreement_by_k``, one sample a side, 1,000 resamples) with the size rule
  lifted, at the sizes the rule decides.

± is one binomial standard error; every case is seeded.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from tests.unit.support.bench_arms import judged_calls


def share(count: int, trials: int) -> str:
    if not trials:
        return "none given"
    rate = count / trials
    return f"{rate:.4f} ± {math.sqrt(rate * (1 - rate) / trials):.4f} ({count} of {trials})"


def apart(got: Counter[str], arm: int | None = None) -> int:
    if arm is None:
        return got["any apart"]
    return got[f"adaptive-{arm}: a lead"] + got[f"adaptive-{arm}: a deficit"]


def family_main(trials: int) -> None:
    seed = 100
    for k in (1, 4):
        for twins in (2, 3):
            for ratio in (1.0, 3.0):
                for runs in (2, 3, 5, 10):
                    seed += 1
                    got = judged_calls([(100.0, 2.0 * ratio)] * k, [(100.0, 2.0)] * twins,
                                       runs, trials, seed, first_all=True)
                    print(f"family: {twins} adaptive arms, {k} fixed (sd x{ratio:g}), {runs} "
                          f"runs, all equal: any apart {share(apart(got), trials)}; each "
                          + ", ".join(share(apart(got, j), trials).split(" (")[0]
                                      for j in range(twins)), flush=True)
    # One arm truly leads by 3 sd (6%); its twin is as fast as the fixed arms.
    for k in (1, 4):
        for runs in (3, 5, 10):
            seed += 1
            got = judged_calls([(100.0, 2.0)] * k, [(106.0, 2.0), (100.0, 2.0)], runs, trials,
                               seed, first_all=True)
            print(f"family, one arm +6% (3 sd), {k} fixed, {runs} runs: its lead "
                  f"{share(got['adaptive-0: a lead'], trials)}; the equal twin apart "
                  f"{share(apart(got, 1), trials)}", flush=True)


def rounds_main(trials: int) -> None:
    seed = 200
    for k in (1, 4):
        for shared, label in ((("round", 2.0),), "round sd = arm sd"), \
                ((("round", 6.0),), "round sd = 3 x arm sd"), \
                ((("drift", 1.0),), "drift step 1/2 arm sd"), \
                ((("drift", 3.0),), "drift step 1.5 x arm sd"):
            for runs in (2, 3, 5, 10):
                seed += 1
                kwargs = {f"{kind}_sd": sd for kind, sd in shared}
                got = judged_calls([(100.0, 2.0)] * k, (100.0, 2.0), runs, trials, seed,
                                   first_all=True, **kwargs)
                print(f"rounds: {label}, {k} fixed, {runs} runs, equal: apart "
                      f"{share(got['a lead'] + got['a deficit'], trials)}", flush=True)
        for runs in (3, 5, 10):
            seed += 1
            got = judged_calls([(100.0, 2.0)] * k, (106.0, 2.0), runs, trials, seed,
                               first_all=True, round_sd=6.0)
            print(f"rounds power: +6%, round sd = 3 x arm sd, {k} fixed, {runs} runs: a lead "
                  f"{share(got['a lead'], trials)}", flush=True)
    # bench combine of files that each hold one arm's runs: a call's effect is shared by one
    # arm's runs only (``call_sd``, drawn per arm per file).
    for k in (1, 4):
        for calls, runs in ((1, 3), (1, 5), (2, 2), (3, 2), (3, 3), (5, 2)):
            for call_sd in (2.0, 6.0):
                seed += 1
                got = combined_calls(k, calls, runs, call_sd, trials, seed)
                print(f"combine: each arm in {calls} call(s) of its own, {runs} runs each, call "
                      f"sd {call_sd / 2:g} x run sd, {k} fixed, equal: apart "
                      f"{share(got['a lead'] + got['a deficit'], trials)}; unresolved "
                      f"{got['unresolved']}", flush=True)


def combined_calls(k: int, calls: int, runs: int, call_sd: float, trials: int,
                   seed: int) -> Counter[str]:
    """Judge benches joined from files that each hold ``runs`` runs of one arm, ``calls``
    files an arm: every run of a file shares its call's effect (normal, ``call_sd``) besides
    its own noise (sd 2)."""
    from app.bench.schedulers import BenchResult, _judge
    from tests.unit.support.bench_arms import _call

    rng = np.random.default_rng(seed)
    counted: Counter[str] = Counter()
    names = ["fixed-all", *(f"fixed-{10 + j}" for j in range(1, k)), "adaptive"]
    for _ in range(trials):
        arms = [{"strategy": name, "output_tokens_per_s": float(v), "preemptions": 0,
                 "call": f"{name}-{c}"}  # as ``combine_results`` marks a file's runs
                for name in names for c in range(calls)
                for v in 100.0 + rng.normal(0, call_sd) + rng.normal(0, 2.0, runs)]
        result = BenchResult("w", 24, 408, arms=arms)
        _judge(result)
        counted[_call(result.verdicts[0])] += 1
    return counted


# The bound: the second pass's world (its script's GRAPH, STEP, KV, SEQS).
@cache
def _v2() -> Any:
    path = Path(__file__).with_name("verdicts-outside-2.py")
    spec = importlib.util.spec_from_file_location("verdicts_outside_2", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bound_draws(levels: int, noise: float, runs: int, seed: int, centre: str):
    """Yield ``runs`` drawn level sets of ``levels`` running levels, each level's seconds off
    the true step by a lognormal factor of log-sd ``noise`` whose ``centre`` (mean or
    median) is 1."""
    v2 = _v2()
    rng = np.random.default_rng(seed)
    shift = -noise**2 / 2 if centre == "mean" else 0.0
    for _ in range(runs):
        running = rng.choice(np.arange(1, v2.SEQS + 1), size=levels, replace=False)
        drawn = {}
        for r in running:
            tokens = float(rng.uniform(500, 20_000))
            drawn[int(r)] = [tokens, tokens / r * v2.STEP.at(r)
                             * float(np.exp(rng.normal(shift, noise)))]
        yield drawn


def methods(levels: dict[int, list[float]], which: str) -> dict[str, tuple[float, float]]:
    """``which`` "product": the product's own 90% interval of the bound; "methods": the
    percentile (the product's before this pass), BCa and expanded percentile intervals from
    one set of resamples of the product's fit (``bound._resampled_tok_s``, which gives
    ``_fit`` and ``graph_bound``'s figure to 1e-14), scipy's resamples and seed as the
    product has them."""
    from functools import partial

    from scipy import stats

    from app.bench.bound import (
        GraphFacts,
        StepCost,
        _resampled_tok_s,
        bound_interval,
        expanded_level,
        graph_bound,
    )

    v2 = _v2()
    graph: GraphFacts = v2.GRAPH
    if which == "product":
        product = bound_interval(graph, v2.KV, v2.SEQS, levels)
        return {"product": product} if product is not None else {}
    usable = [(r, t, s) for r, (t, s) in levels.items()]
    point = graph_bound(graph, v2.KV, v2.SEQS, StepCost(1.0, 0.0))
    assert point is not None
    statistic = partial(_resampled_tok_s, graph, point.steps, 1)
    columns = tuple(np.array(c, dtype=float) for c in zip(*usable, strict=True))
    first = stats.bootstrap(columns, statistic, paired=True, vectorized=True, n_resamples=999,
                            confidence_level=0.9, method="percentile",
                            rng=np.random.default_rng(0))
    found = {"percentile": tuple(first.confidence_interval)}
    bca = stats.bootstrap(columns, statistic, paired=True, vectorized=True, n_resamples=0,
                          confidence_level=0.9, method="BCa", bootstrap_result=first,
                          rng=np.random.default_rng(0))
    found["BCa"] = tuple(bca.confidence_interval)
    wider = expanded_level(0.9, len(usable))
    values = np.asarray(first.bootstrap_distribution)
    found["expanded"] = tuple(np.nanpercentile(values, [50 * (1 - wider), 50 * (1 + wider)]))
    return found


def bound_main(runs: int, sizes: str, which: str, centres: str) -> None:
    from app.bench.bound import graph_bound

    v2 = _v2()
    true = graph_bound(v2.GRAPH, v2.KV, v2.SEQS, v2.STEP)
    assert true is not None
    for centre in centres.split(","):
        pooled: Counter[str] = Counter()
        pooled_given: Counter[str] = Counter()
        for levels in (int(x) for x in sizes.split(",")):
            held: Counter[str] = Counter()
            given: Counter[str] = Counter()
            for drawn in bound_draws(levels, 0.1, runs, levels * 100 + 10, centre):
                for name, (low, high) in methods(drawn, which).items():
                    given[name] += 1
                    held[name] += low <= true.tok_s <= high
            pooled.update(held)
            pooled_given.update(given)
            print(f"bound 90%, {levels} levels, noise 10% ({centre} 1): " + "; ".join(
                f"{name} {share(held[name], given[name])}" for name in sorted(given)),
                flush=True)
        print(f"bound 90%, pooled, noise 10% ({centre} 1): " + "; ".join(
            f"{name} {share(pooled[name], pooled_given[name])}" for name in sorted(pooled_given)),
            flush=True)


def kappa_main(runs: int, sizes: str) -> None:
    import app.quality.averaging as averaging

    averaging.MIN_KAPPA_INTERVAL_N = 0  # the rule lifted: measure the interval it withholds
    _v2().repro_main(runs, sizes)


if __name__ == "__main__":
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    extra = sys.argv[3] if len(sys.argv) > 3 else ""
    if sys.argv[1] == "family":
        family_main(count or 2000)
    elif sys.argv[1] == "rounds":
        rounds_main(count or 2000)
    elif sys.argv[1] == "bound":
        bound_main(count or 1000, extra or "12,16,20,30",
                   sys.argv[4] if len(sys.argv) > 4 else "methods",
                   sys.argv[5] if len(sys.argv) > 5 else "mean,median")
    elif sys.argv[1] == "kappa":
        kappa_main(count or 400, extra or "20,25,30")
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}: family, rounds, bound or kappa")
