"""A scheduler bench's arms as its JSON holds them, with one graph and server to judge them by."""

from __future__ import annotations

from collections import Counter
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


def fake_arm(strategy: str, tok_s: float, ttft: float = 1.0, preemptions: int = 0,
             ready: float | None = None) -> dict[str, Any]:
    return {"strategy": strategy, "output_tokens_per_s": tok_s, "mean_ttft_s": ttft,
            "ttft_ready_mean_s": ready, "preemptions": preemptions, "graph": GRAPH,
            "decode_levels": {"20": [20_000.0, 40.0]}}


def judged_calls(fixed: list[tuple[float, float]], adaptive: tuple[float, float], runs: int,
                 trials: int, seed: int, *, first_all: bool = False) -> Counter[str]:
    """Judge ``trials`` simulated benches of adaptive against fixed arms, each given as (true
    mean, sd) of tok/s over ``runs`` runs; count the verdict's calls ("a lead", "a deficit",
    "not shown", "unresolved"). ``first_all`` names the first fixed arm fixed-all."""
    rng = np.random.default_rng(seed)
    counted: Counter[str] = Counter()
    for _ in range(trials):
        arms = [{"strategy": "fixed-all" if first_all and j == 0 else f"fixed-{10 + j}",
                 "output_tokens_per_s": float(v), "preemptions": 0}
                for j, (mean, sd) in enumerate(fixed) for v in rng.normal(mean, sd, runs)]
        arms += [{"strategy": "adaptive", "output_tokens_per_s": float(v), "preemptions": 0}
                 for v in rng.normal(*adaptive, runs)]
        result = BenchResult("w", 24, 408, arms=arms)
        _judge(result)
        (verdict,) = result.verdicts
        call = verdict.rpartition(": ")[2]  # the call ends the line
        counted["unresolved" if "unresolved" in verdict else next(
            c for c in ("a lead", "a deficit", "not shown") if call.startswith(c))] += 1
    return counted
