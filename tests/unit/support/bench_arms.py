"""A scheduler bench's arms as its JSON holds them, with one graph and server to judge them by."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from app.bench.schedulers import BenchResult, _judge

# Every arm ran the same 60,000 output tokens; one reading level: 20,000 tokens made in
# 40 s at 20 running, so a step takes 40 / (20,000 / 20) = 0.04 s. With 32 sequences the
# fewest steps are 60,000 / 32 = 1,875 (the KV term gives 6e7 / 49,152 = 1,221, the chain
# 1,000): 75 s at least, a graph bound of 800 tok/s.
GRAPH = {"output_tokens": 60_000, "kv_token_steps": 6.0e7, "critical_path_tokens": 1_000,
         "calls": 1_700}
SERVER = {"kv_cache_tokens": 49_152, "max_num_seqs": 32}
CALLS = ("a lead", "a deficit", "not shown")


def fake_arm(strategy: str, tok_s: float, ttft: float = 1.0, preemptions: int = 0,
             ready: float | None = None) -> dict[str, Any]:
    return {"strategy": strategy, "output_tokens_per_s": tok_s, "mean_ttft_s": ttft,
            "ttft_ready_mean_s": ready, "preemptions": preemptions, "graph": GRAPH,
            "decode_levels": {"20": [20_000.0, 40.0]}}


def judged_calls(fixed: list[tuple[float, float]],
                 adaptive: tuple[float, float] | list[tuple[float, float]], runs: int,
                 trials: int, seed: int, *, first_all: bool = False, round_sd: float = 0.0,
                 drift_sd: float = 0.0,
                 shared: Callable[[np.random.Generator, tuple[int, int]], np.ndarray] | None = None,
                 ) -> Counter[str]:
    """Judge ``trials`` simulated benches of adaptive arms against fixed arms, each given as
    (true mean, sd) of tok/s over ``runs`` runs, interleaved as ``bench schedulers --repeat``
    runs them (round 1 of every arm, fixed arms first, then round 2 ...). Count the verdicts'
    calls ("a lead", "a deficit", "not shown", "unresolved"): with one adaptive arm (a
    tuple) its call; with a list, each arm's as "adaptive-J: call", and "any apart" for the
    benches where at least one arm was called a lead or a deficit. ``first_all`` names the
    first fixed arm fixed-all.

    Noise shared by arms: ``round_sd``, one normal draw a round added to every arm's run of
    that round (a loaded host slows the whole round); ``drift_sd``, a random walk over the
    bench's runs in the order they ran, each step of that sd (the host drifting); ``shared``,
    any other: given the generator and the (runs, arms) shape, an array added to the runs,
    rows the rounds and columns the arms in the order they ran (a trend, a busy spell)."""
    rng = np.random.default_rng(seed)
    several = isinstance(adaptive, list)
    mine = adaptive if isinstance(adaptive, list) else [adaptive]
    names = [("fixed-all" if first_all and j == 0 else f"fixed-{10 + j}", arm)
             for j, arm in enumerate(fixed)]
    twins = ["adaptive", "adaptive:tail=off", *(f"adaptive:kv_high=0.{80 + j}" for j in
                                                range(2, len(mine)))]
    names += list(zip(twins, mine, strict=False))
    counted: Counter[str] = Counter()
    for _ in range(trials):
        # Each arm's own noise first, arm by arm (the stream the one-arm tests were seeded on).
        drawn = np.array([rng.normal(mean, sd, runs) for _, (mean, sd) in names]).T
        if round_sd:
            drawn += rng.normal(0.0, round_sd, (runs, 1))
        if drift_sd:  # in the order they ran: round by round, the arms in ``names``' order
            drawn += np.cumsum(rng.normal(0.0, drift_sd, drawn.size)).reshape(drawn.shape)
        if shared is not None:
            drawn += shared(rng, drawn.shape)
        arms = [{"strategy": name, "output_tokens_per_s": float(drawn[r, j]), "preemptions": 0}
                for j, (name, _) in enumerate(names) for r in range(runs)]
        result = BenchResult("w", 24, 408, arms=arms)
        _judge(result)
        found = [_call(verdict) for verdict in result.verdicts]
        if not several:
            counted[found[0]] += 1
            continue
        for j, call in enumerate(found):
            counted[f"adaptive-{j}: {call}"] += 1
        counted["any apart"] += any(c in ("a lead", "a deficit") for c in found)
    return counted


def _call(verdict: str) -> str:
    if "unresolved" in verdict.rpartition(": ")[2]:
        return "unresolved"
    call = verdict.rpartition(": ")[2]  # the call ends the line
    return next(c for c in CALLS if call.startswith(c))
