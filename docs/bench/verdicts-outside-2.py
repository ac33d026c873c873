"""Two stated rates of the bench measured through its own code
(docs/lab/2026-12-07-verdicts-outside-2.md). Run from a checkout with ``PYTHONPATH=$PWD``
(it imports the tests' simulator), under the bench lock:

- ``.venv/bin/python docs/bench/verdicts-outside-2.py lead 2000`` (about a minute on 2 cores):
  the lead verdict when the best fixed arm is picked by the same runs, through
  ``app.bench.schedulers._judge`` (what ``bench schedulers --repeat`` and ``bench combine``
  run);
- ``.venv/bin/python docs/bench/verdicts-outside-2.py bound 200``: how often the graph
  bound's "90% interval" (``app.bench.bound.bound_interval``) holds the bound of the true
  step, levels drawn from a known ``a + b × running`` step with noise;
- ``.venv/bin/python docs/bench/verdicts-outside-2.py eta``: the ETA interval's stated share
  (``eta.LEVEL``) against what it held on the recorded nights replayed through
  ``eta.reading``, each night judged by the others' percentiles (the replay test's own
  helpers), with an error over nights, not readings: a night's readings move together;
- ``.venv/bin/python docs/bench/verdicts-outside-2.py band 4000``: how often the Track record
  page's 95% band (``track.running_mean``) holds a null desk's true mean IC, 0, at each
  night; each night's IC from ``statistics.spearman_rows`` on independent scores and returns;
- ``.venv/bin/python docs/bench/verdicts-outside-2.py repro 200``: how often ``quality
  repro``'s 95% intervals of QWK and Spearman (``averaging.agreement_by_k``, one sample a
  side, 1,000 resamples) hold the two runs' population QWK and Spearman;
- ``.venv/bin/python docs/bench/verdicts-outside-2.py quality 1000``: the quality verdicts
  re-measured at this commit through the project's own simulation (``simulation.verdict_rates``
  for the track verdict, ``simulation.monitor_rates`` for the monitor) and ``statistics.ic_test``
  (``quality forward``'s p) on scores and returns with no relation.

Every case is a null for the call it counts: ``apart`` counts leads and deficits of an
adaptive arm whose true mean equals every fixed arm's; ``false lead`` counts leads of an
adaptive arm whose true mean equals the truly best fixed arm's (a noisy one) while a quieter
fixed arm sits 3% below. ± is one binomial standard error.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from functools import partial

import numpy as np

from app.bench.bound import GraphFacts, StepCost, bound_interval, graph_bound
from tests.unit.support.bench_arms import judged_calls


def calls(fixed: list[tuple[float, float]], adaptive: tuple[float, float], runs: int,
          trials: int, seed: int) -> Counter[str]:
    """Judge ``trials`` benches: fixed arms and adaptive given as (true mean, sd) of tok/s."""
    return judged_calls(fixed, adaptive, runs, trials, seed, first_all=True)


def share(count: int, trials: int) -> str:
    if not trials:
        return "none given"
    rate = count / trials
    return f"{rate:.4f} ± {math.sqrt(rate * (1 - rate) / trials):.4f}"


def main(trials: int) -> None:
    seed = 0
    for k in (1, 4, 7):
        for ratio in (1.0, 3.0):
            for runs in (2, 3, 5, 10):
                seed += 1
                got = calls([(100.0, 2.0 * ratio)] * k, (100.0, 2.0), runs, trials, seed)
                print(f"equal arms, {k} fixed (sd x{ratio:g}), {runs} runs: apart "
                      f"{share(got['a lead'] + got['a deficit'], trials)} (lead "
                      f"{got['a lead']}, deficit {got['a deficit']})", flush=True)
    for k in (1, 4):
        for runs in (5, 10):
            for lead in (6.0, -6.0):
                seed += 1
                got = calls([(100.0, 2.0)] * k, (100.0 + lead, 2.0), runs, trials, seed)
                call = "a lead" if lead > 0 else "a deficit"
                print(f"power: adaptive {lead:+.0f}% (3 sd), {k} fixed, {runs} runs: {call} "
                      f"{share(got[call], trials)}", flush=True)
    for runs in (3, 5, 10):
        seed += 1
        got = calls([(100.0, 6.0), (97.0, 0.5)], (100.0, 0.5), runs, trials, seed)
        print(f"noisy best, quiet arm 3% below, {runs} runs: false lead "
              f"{share(got['a lead'], trials)}", flush=True)


GRAPH = GraphFacts(output_tokens=200_000, kv_token_steps=4e8, critical_path_tokens=3_000,
                   calls=400)
STEP = StepCost(0.020, 0.0004)  # 20 ms a step + 0.4 ms per running request
KV, SEQS = 200_000, 64


def bound_coverage(levels: int, noise: float, runs: int, seed: int) -> tuple[int, int]:
    """Return (intervals holding the true step's bound, intervals given) over ``runs`` draws
    of ``levels`` running levels spread over 1..SEQS, each level's seconds off the true step
    by a lognormal factor of sd ``noise``, its tokens 500-20,000."""
    rng = np.random.default_rng(seed)
    true = graph_bound(GRAPH, KV, SEQS, STEP)
    assert true is not None
    held = given = 0
    for _ in range(runs):
        running = rng.choice(np.arange(1, SEQS + 1), size=levels, replace=False)
        drawn = {}
        for r in running:
            tokens = float(rng.uniform(500, 20_000))
            drawn[int(r)] = [tokens, tokens / r * STEP.at(r) * float(np.exp(rng.normal(0, noise)))]
        interval = bound_interval(GRAPH, KV, SEQS, drawn)
        if interval is None:
            continue
        given += 1
        held += interval[0] <= true.tok_s <= interval[1]
    return held, given


def bound_main(runs: int, cases: str) -> None:
    for case in cases.split(","):
        levels, noise = int(case.split("@")[0]), float(case.split("@")[1])
        held, given = bound_coverage(levels, noise, runs, seed=levels * 100 + int(noise * 100))
        print(f"bound 90% interval, {levels} levels, noise {noise:.0%}: held "
              f"{share(held, given)} of {given}", flush=True)


def band_main(desks: int) -> None:
    from types import SimpleNamespace

    from app.quality.statistics import spearman_rows
    from app.quality.track import running_mean

    looks = (2, 3, 5, 10, 20, 60)
    for tickers in (4, 5, 10, 100):
        rng = np.random.default_rng(tickers)
        shape = (desks, max(looks), tickers)
        ics = spearman_rows(rng.normal(size=shape), rng.normal(size=shape))
        held = Counter[int]()
        given = Counter[int]()
        for row in ics:
            nights = [SimpleNamespace(as_of=str(i), ic=float(ic)) for i, ic in enumerate(row)]
            points = running_mean(SimpleNamespace(horizon_days=1, nights=nights))
            for look in looks:
                point = points[look - 1]
                if point.low is not None and point.high is not None:
                    given[look] += 1
                    held[look] += point.low <= 0.0 <= point.high
        print(f"band at 1d, {tickers} tickers: " + "; ".join(
            f"{look} nights {share(held[look], given[look])}" for look in looks), flush=True)


def repro_main(runs: int, sizes: str) -> None:
    from agents.decision import rating_for_score
    from app.quality.averaging import agreement_by_k, between
    from app.quality.grades import Grade
    from app.quality.statistics import quadratic_kappa

    noise = 1.0  # a sample's score: tanh(0.8 (signal + noise)), signal and noise N(0, 1)

    def scores(rng: np.random.Generator, signal: np.ndarray) -> np.ndarray:
        return np.tanh(0.8 * (signal + rng.normal(0, noise, signal.shape)))

    rng = np.random.default_rng(17)
    signal = rng.normal(size=400_000)
    a, b = scores(rng, signal), scores(rng, signal)
    true_qwk = quadratic_kappa([rating_for_score(x) for x in a], [rating_for_score(x) for x in b])
    true_rho = 6 / math.pi * math.asin(1 / (1 + noise**2) / 2)
    print(f"population QWK {true_qwk:.4f}, Spearman {true_rho:.4f}", flush=True)
    for n in (int(x) for x in sizes.split(",")):
        held = Counter[str]()
        given = Counter[str]()
        for run in range(runs):
            signal = rng.normal(size=n)
            sides = []
            for _ in range(2):
                drawn = scores(rng, signal)
                sides.append({f"T{i}": [Grade(0, rating_for_score(float(x)), float(x), False)]
                              for i, x in enumerate(drawn)})
            (row,) = agreement_by_k(sides[0], sides[1], partial(between, 1, 1), [1],
                                    resamples=1000, seed=run)
            for name, interval, true in (("qwk", row.qwk_ci, true_qwk),
                                         ("spearman", row.spearman_ci, true_rho)):
                if interval is not None:
                    given[name] += 1
                    held[name] += interval[0] <= true <= interval[1]
        print(f"repro 95% interval, {n} tickers: QWK {share(held['qwk'], given['qwk'])} of "
              f"{given['qwk']}; Spearman {share(held['spearman'], given['spearman'])} of "
              f"{given['spearman']}", flush=True)


def quality_main(runs: int) -> None:
    from app.config import load_settings
    from app.quality.simulation import World, monitor_rates, verdict_rates
    from app.quality.statistics import ic_test

    for tickers in (4, 20):
        rows = verdict_rates(World(tickers, 250, 0.95), (1, 5, 20), (20, 100, 250), runs,
                             seed=tickers)
        for row in rows:
            if row["rule"] == "chosen" and row["nights"] >= 5 * row["horizon_days"]:
                hits = round(row["rate"] * runs)
                print(f"track verdict, {tickers} tickers, {row['horizon_days']}d, "
                      f"{row['nights']} nights: {share(hits, runs)} (withheld "
                      f"{row['withheld']:.0%})", flush=True)
    settings = load_settings(check_context_length=False)
    null = (0.1, 0.15, 0.5, 0.15, 0.1)
    for tickers in (5, 20, 100):
        rates = monitor_rates(tickers, null, None, 4 * runs, settings, seed=tickers)
        hits = round(rates.get("any", 0.0) * 4 * runs)
        print(f"monitor, unchanged, {tickers} tickers: any warning {share(hits, 4 * runs)} "
              f"(stated at most {settings.quality.false_alarm_rate:.0%})", flush=True)
    rng = np.random.default_rng(3)
    for tickers in (5, 6, 8, 12, 30):
        hits = sum((p := ic_test(rng.normal(size=tickers), rng.normal(size=tickers))[1])
                   is not None and p < 0.05 for _ in range(runs))
        print(f"forward p < 0.05, {tickers} tickers, no relation: {share(hits, runs)}",
              flush=True)


def eta_main() -> None:
    import tempfile
    from pathlib import Path

    from app.morning import eta

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: its tests
    from tests.unit.morning.test_eta_replay import percentiles, ratios

    for before in (True, False):
        with tempfile.TemporaryDirectory() as folder:
            found = ratios(Path(folder), before)
        shares = []
        for name, values in found.items():
            low, high = percentiles([r for o, v in found.items() if o != name for r in v])
            held = sum(low <= r <= high for r in values)
            shares.append(held / len(values))
            print(f"  {name}: {held} of {len(values)}", flush=True)
        pooled = sum(len(v) for v in found.values())
        weights = np.array([len(v) / pooled for v in found.values()])
        share_of = np.array(shares)
        mean = float(weights @ share_of)
        # A ratio estimate's error over nights (clusters): sqrt(sum w^2 (x - mean)^2 * m/(m-1)).
        m = len(shares)
        error = math.sqrt(float((weights**2) @ (share_of - mean) ** 2) * m / (m - 1))
        print(f"{'with the night before' if before else 'first night'}: stated "
              f"{eta.LEVEL:.0%}, held {mean:.3f} ± {error:.3f} over {m} nights "
              f"({pooled} readings); nights below the stated share: "
              f"{sum(x < eta.LEVEL for x in shares)}", flush=True)


if __name__ == "__main__":
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    if sys.argv[1] == "bound":
        # levels@noise cases, e.g. 3@0.1,30@0.1
        bound_main(count or 200, sys.argv[3] if len(sys.argv) > 3 else
                   "3@0.1,5@0.1,10@0.1,30@0.1,10@0.3")
    elif sys.argv[1] == "eta":
        eta_main()
    elif sys.argv[1] == "repro":
        repro_main(count or 200, sys.argv[3] if len(sys.argv) > 3 else "10,30")
    elif sys.argv[1] == "quality":
        quality_main(count or 1000)
    elif sys.argv[1] == "band":
        band_main(count or 4000)
    else:
        main(count or 2000)
