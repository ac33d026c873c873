"""The bench's lead verdict keeps its stated error rate: measured by simulation through
``_judge``, on arms of equal true mean (the false-lead rate) and of a large true lead (power)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from app.bench.schedulers import LEAD_LEVEL, BenchResult, _judge

TRIALS = 1000  # scipy's t-test takes ~0.5 ms a call: 9 cases of 1000 keep this file < 10 s
# The rate is a binomial share of TRIALS: allowed the level plus 3 Monte Carlo standard
# errors at that level (0.05 + 3 x 0.0069 = 0.071), so a sound test fails about 1 in 700.
BOUND = LEAD_LEVEL + 3 * math.sqrt(LEAD_LEVEL * (1 - LEAD_LEVEL) / TRIALS)
MEAN, SD = 100.0, 2.0  # tok/s and run-to-run sd: the CPU bench's quiet runs vary by ~2%

Noise = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


def normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.normal(0.0, SD, shape)


def lognormal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    # Skewed (skewness ~6: rare fast runs), mean 0, sd SD.
    sigma = 1.0
    raw = rng.lognormal(0.0, sigma, shape) - math.exp(sigma**2 / 2)
    return raw * SD / math.sqrt((math.exp(sigma**2) - 1) * math.exp(sigma**2))


def uneven(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    # Normal, the second half of the draws (the fixed arm) 3 times as noisy as the first.
    scale = np.ones(shape)
    scale[shape[0] // 2:] = 3.0
    return rng.normal(0.0, SD, shape) * scale


def calls(noise: Noise, runs: int, *, lead: float = 0.0, seed: int = 0,
          trials: int = TRIALS) -> Counter[str]:
    """Count the verdict's calls over ``trials`` benches of adaptive against fixed-all,
    ``runs`` runs each, adaptive's true mean ``lead`` tok/s above fixed-all's."""
    draws = MEAN + noise(np.random.default_rng(seed), (2 * trials, runs))
    counted: Counter[str] = Counter()
    for mine, other in zip(draws[:trials] + lead, draws[trials:], strict=True):
        result = BenchResult("w", 24, 408, arms=[
            {"strategy": s, "output_tokens_per_s": float(tok_s), "preemptions": 0}
            for s, row in (("adaptive", mine), ("fixed-all", other)) for tok_s in row])
        _judge(result)
        (verdict,) = result.verdicts
        counted[next(c for c in ("a lead", "a deficit", "not shown", "unresolved")
                     if c in verdict)] += 1
    return counted


@pytest.mark.parametrize("runs", [2, 3, 5])
@pytest.mark.parametrize("noise", [normal, lognormal, uneven])
def test_equal_arms_are_called_apart_at_most_at_the_level(noise: Noise, runs: int) -> None:
    counted = calls(noise, runs, seed=runs)
    assert counted["unresolved"] == 0
    false = (counted["a lead"] + counted["a deficit"]) / TRIALS
    assert false <= BOUND, f"{noise.__name__}, {runs} runs: false-lead rate {false:.3f}"


def test_a_large_true_lead_is_called_a_lead_with_five_runs() -> None:
    # A lead of 3 sd (6%: twice the spread of two quiet CPU runs) and its mirror: called a
    # lead 95% of the time in 5,000 simulated trials (docs/bench/lead-verdict-sim.py), so 90%
    # of 200 is 3 standard errors below it. Fewer runs would not do: min(n) - 1 df leaves
    # 3 runs a side 43% of the time at this lead.
    assert calls(normal, 5, lead=3 * SD, seed=7, trials=200)["a lead"] / 200 >= 0.9
    assert calls(normal, 5, lead=-3 * SD, seed=8, trials=200)["a deficit"] / 200 >= 0.9


def test_one_run_or_no_variance_leaves_the_lead_unresolved() -> None:
    assert calls(normal, 1, lead=10 * SD, trials=5) == Counter(unresolved=5)
    flat = BenchResult("w", 24, 408, arms=[
        {"strategy": s, "output_tokens_per_s": tok_s, "preemptions": 0}
        for s, tok_s in (("adaptive", 110.0), ("adaptive", 110.0), ("fixed-all", 100.0),
                         ("fixed-all", 100.0))])
    _judge(flat)
    assert flat.verdicts == ["adaptive vs fixed-all: +10.0% on the means (2 and 2 runs): "
                             "unresolved (every run of both arms gave the same tok/s: "
                             "no variance)"]
    assert flat.lead_test == {"test": "welch-t", "df": "min(n)-1", "sides": 2,
                              "level": LEAD_LEVEL}
