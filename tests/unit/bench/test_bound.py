"""The bound that respects the graph and the cache's fit (app/bench/bound.py ``fit_bound``):
worked by hand, never above a makespan the simulated endpoints' rule allows (a step model of
that rule, any order and stagger; every committed fleet simulation; a small one run here),
and equal to the chain's bound where every stage fits at once."""

from __future__ import annotations

import json
import math
import random
import re
from collections import deque
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from app.bench.bound import (
    FitFacts,
    GraphFacts,
    Stage,
    StepCost,
    fit_bound,
    fit_facts,
    graph_bound,
    graph_facts,
)
from app.bench.workloads import synthetic_workload
from app.config import load_settings
from app.runs.replay import WorkItem, Workload
from app.traffic.budget import prompt_bytes
from tests.unit.support.sims import bench

ROOT = Path(__file__).resolve().parents[3]
Call = tuple[str, int, str, int, int]


def _chain(tickers: int, sizes: list[tuple[int, int]]) -> tuple[Workload, list[Call]]:
    """``tickers`` tickers of one chain, a call per ``(prompt, output)`` of ``sizes``."""
    load: Workload = {}
    calls: list[Call] = []
    for t in range(tickers):
        key = f"T{t}"
        load[key] = [WorkItem(key, 0, f"n{i}", {}, [f"n{i - 1}"] if i else [])
                     for i in range(len(sizes))]
        calls += [(key, 0, f"n{i}", p, o) for i, (p, o) in enumerate(sizes)]
    return load, calls


def test_a_stage_that_cannot_all_fit_runs_in_rounds_worked_by_hand() -> None:
    # Five tickers, each a chain of two calls: 10 output tokens on a 10-token prompt, then 90
    # on 10 (100 reserved). A 300-token cache admits three last calls at once: two rounds,
    # so some ticker's last call starts 90 steps after the chain allows: 10 + 2 x 90.
    load, calls = _chain(5, [(10, 10), (10, 90)])
    facts = fit_facts(calls, load)
    assert facts.tickers == 5 and facts.ticker_output_min == 100
    assert [(s.nodes, s.calls, s.output_tokens, s.footprint_tokens, s.outside_tokens)
            for s in facts.stages] == [(("n0",), 1, 10, 20, 90), (("n1",), 1, 90, 100, 10)]
    graph = graph_facts(calls, load)
    step = StepCost(1.0, 0.0)
    chain = graph_bound(graph, 300, 100, step)  # 25,500 KV-token-steps: 85 steps, under 100
    assert chain is not None and chain.binding == "critical_path" and chain.seconds == 100
    fit = fit_bound(graph, facts, 300, 100, step)
    assert fit is not None and fit.kind == "graph+fit" and fit.binding == "stage_fit"
    assert fit.steps == 190 and fit.seconds == 190
    assert fit.fit == "n1: 5 calls on the busiest endpoint, 3 fit at once, 2 rounds"
    # The step's per-request term: the busiest's tickers times the least ticker's output.
    grown = fit_bound(graph, facts, 300, 100, StepCost(1.0, 0.5))
    assert grown is not None and grown.seconds == 190 + 0.5 * 5 * 100
    # Over two endpoints the busiest holds three tickers: they fit, one round, the chain's.
    two = fit_bound(graph, facts, 300, 100, step, endpoints=2)
    chain_two = graph_bound(graph, 300, 100, step, endpoints=2)
    assert two is not None and chain_two is not None
    assert (two.binding, two.seconds) == (chain_two.binding, chain_two.seconds)
    # The sequence cap counts as the cache does: two at once, three rounds.
    capped = fit_bound(graph, facts, 10**6, 2, step)
    assert capped is not None and capped.steps == 10 + 3 * 90


def test_side_by_side_calls_make_one_stage() -> None:
    # Four analysts side by side, then one call after them all: the analysts share a window,
    # so 2 tickers x 4 of them on a cap of 6 need two rounds of the analysts' 10 steps.
    load: Workload = {}
    calls: list[Call] = []
    for key in ("A", "B"):
        load[key] = [WorkItem(key, 0, f"a{j}", {}, []) for j in range(4)] + [
            WorkItem(key, 0, "end", {}, [f"a{j}" for j in range(4)])]
        calls += [(key, 0, f"a{j}", 50, 10) for j in range(4)] + [(key, 0, "end", 50, 5)]
    facts = fit_facts(calls, load)
    assert facts.stages[0] == Stage(("a0", "a1", "a2", "a3"), 4, 10, 60, 5)
    fit = fit_bound(graph_facts(calls, load), facts, 10**6, 6, StepCost(1.0, 0.0))
    assert fit is not None and fit.steps == 5 + 2 * 10


def test_where_every_stage_fits_the_bound_is_the_chains() -> None:
    load, calls = _chain(5, [(90, 10), (180, 20)])
    graph, facts = graph_facts(calls, load), fit_facts(calls, load)
    for kv, seqs, step in ((10**6, 100, StepCost(1.0, 0.0)), (1_000, 5, StepCost(0.02, 0.001)),
                           (2_000, 100, StepCost(0.5, 0.01))):
        chain, fit = graph_bound(graph, kv, seqs, step), fit_bound(graph, facts, kv, seqs, step)
        assert chain is not None and fit is not None
        assert (fit.seconds, fit.binding, fit.kind) == (chain.seconds, chain.binding,
                                                        "graph+fit")
    # No stages known (a shape without its calls): the chain's bound, as it was.
    empty = fit_bound(graph, FitFacts(5, 30, ()), 600, 100, StepCost(1.0, 0.0))  # rounds there
    chain = graph_bound(graph, 600, 100, StepCost(1.0, 0.0))
    assert empty is not None and chain is not None and empty.seconds == chain.seconds


def _steps_to_finish(sizes: list[tuple[int, int]], tickers: int, kv: int, seqs: int,
                     rng: random.Random, stagger: int) -> int:
    """Run tickers of one chain on a step model of the simulated endpoint (tests/fakevllm):
    a call is sent when the one before it ended, plus 0..``stagger`` steps the client
    chooses; it is admitted, oldest first, only when its whole answer fits beside the
    running calls' and a sequence is free, and gets a token from the next step on."""
    sent_at = {t: rng.randint(0, stagger) for t in range(tickers)}
    stage = dict.fromkeys(range(tickers), 0)
    waiting: deque[int] = deque()
    running: dict[int, int] = {}  # ticker -> tokens left of its call
    steps = 0
    while stage:
        arrived = [t for t, at in sent_at.items() if at <= steps]
        rng.shuffle(arrived)  # in any order
        for t in arrived:
            waiting.append(t)
            del sent_at[t]
        while waiting and len(running) < seqs and sum(
                sum(sizes[stage[r]]) for r in running) + sum(sizes[stage[waiting[0]]]) <= kv:
            t = waiting.popleft()
            running[t] = sizes[stage[t]][1]
        steps += 1
        for t in list(running):
            running[t] -= 1
            if not running[t]:
                del running[t]
                stage[t] += 1
                if stage[t] == len(sizes):
                    del stage[t]
                else:
                    sent_at[t] = steps + rng.randint(0, stagger)
    return steps


@pytest.mark.parametrize(("tickers", "kv", "seqs"), [(7, 900, 100), (9, 1_400, 4),
                                                     (12, 2_000, 100), (5, 10**6, 100)])
def test_no_order_or_stagger_beats_the_bound_on_the_endpoints_rule(tickers: int, kv: int,
                                                                   seqs: int) -> None:
    # Staggered tickers do not pipeline around it: whatever the order and the delays, the
    # rounds of a stage that cannot all fit cost the night their steps.
    sizes = [(40, 10), (90, 10), (180, 20)]
    load, calls = _chain(tickers, sizes)
    fit = fit_bound(graph_facts(calls, load), fit_facts(calls, load), kv, seqs,
                    StepCost(1.0, 0.0))
    assert fit is not None
    rng = random.Random(7)
    runs = [_steps_to_finish(sizes, tickers, kv, seqs, rng, stagger)
            for stagger in (0, 0, 3, 10, 25) for _ in range(40)]
    assert min(runs) >= fit.steps, (min(runs), fit.steps)
    if fit.binding == "stage_fit":  # and the bound is no loose one: some schedule meets it
        assert min(runs) <= fit.steps + max(o for _, o in sizes), (min(runs), fit.steps)


# --- the committed fleet simulations --------------------------------------------------------


@cache
def _synthetic_sizes(tickers: int) -> tuple[tuple[tuple[str, str, int], ...], ...]:
    """The fleet's synthetic tickers (sent x0.2): each call's node and prompt tokens as the
    simulated endpoints count them (x5: tests/fakevllm/stepped.py ``_prompt_tokens``)."""
    load = synthetic_workload(load_settings(), tickers, 0.2, 0.2)
    return tuple(tuple((t, item.node, max(1, math.ceil(prompt_bytes(item.body) / 4 * 5.0)))
                       for item in items) for t, items in load.items())


def _fleet_bound(result: dict[str, Any]) -> tuple[float, float]:
    """Return the chain's and the fit-aware bound of a committed fleet simulation."""
    tickers, endpoints, gpu = result["tickers"], result["endpoints"], result["gpu"]
    scale = float(re.search(r"out x([0-9.]+)", result["workload"]).group(1))  # type: ignore[union-attr]
    output = max(1, round(1_500 * scale))
    sizes = _synthetic_sizes(tickers if tickers < 100 else 800)[:tickers]
    deps = {item.node: item.deps
            for item in synthetic_workload(load_settings(), 1, 0.001)["SYN000"]}
    load = {ticker[0][0]: [WorkItem(t, 0, n, {}, deps[n]) for t, n, _ in ticker]
            for ticker in sizes}
    calls = [(t, 0, n, p, output) for ticker in sizes for t, n, p in ticker]
    graph = GraphFacts(**result["arm"]["graph"])
    step = StepCost(gpu["step_a_s"] / gpu["speedup"], gpu["step_b_s"] / gpu["speedup"])
    chain = graph_bound(graph, gpu["kv_tokens"], gpu["max_num_seqs"], step, endpoints)
    fit = fit_bound(graph, fit_facts(calls, load), gpu["kv_tokens"], gpu["max_num_seqs"], step,
                    endpoints)
    assert chain is not None and fit is not None
    return chain.seconds, fit.seconds


def _committed() -> list[Path]:
    """Every committed fleet simulation of simulated endpoints whose calls all answered."""
    found = []
    for path in sorted((ROOT / "docs" / "bench").glob("fleet-*.json")):
        result = json.loads(path.read_text())
        if ("arm" in result and "kv_tokens" in result.get("gpu", {})
                and (result.get("front") or {}).get("kind", "endpoint list") == "endpoint list"
                and not (result.get("servers") or {}).get("tickers_not_succeeded")
                and result["arm"]["calls"] >= 17 * result["tickers"]):
            found.append(path)
    return found


def test_the_busiest_endpoint_of_500_over_8_runs_its_last_stage_in_two_rounds() -> None:
    # docs/lab/2026-12-07-fleet-sims-targets.md, section 2: 63 tickers on the busiest, 62 of
    # their last calls fit at once, 4,500 steps: 0.020 x 4,500 + 0.0002 x 321,300 tokens =
    # 154.26 s. Its 63 tickers run alone on one endpoint here (2026-12-05, 156.2-157.5 s).
    for run in ("after-daf39f6", "before-931d168"):
        result = json.loads((ROOT / "docs" / "bench" / "fleet-sim-63-tickers-1-endpoint-"
                             f"2026-12-05-start-fits-{run}.json").read_text())
        chain, fit = _fleet_bound(result)
        assert chain == pytest.approx(148.26) and fit == pytest.approx(154.26)
        assert fit <= result["arm"]["makespan_s"]


@pytest.mark.slow
def test_no_committed_fleet_simulation_beats_the_fit_aware_bound() -> None:
    paths = _committed()
    assert len(paths) > 100
    shares = {}
    for path in paths:
        result = json.loads(path.read_text())
        chain, fit = _fleet_bound(result)
        assert chain <= fit <= result["arm"]["makespan_s"], (path.name, chain, fit)
        shares[path.name] = fit / result["arm"]["makespan_s"]
    assert max(shares.values()) < 1


@pytest.mark.slow
def test_a_small_simulated_night_whose_last_stage_runs_in_rounds(tmp_path: Path) -> None:
    # Six tickers on one endpoint of a 125,000-token cache, outputs of 30 tokens: five of the
    # last calls (23,462-23,713 tokens with the answer) fit at once, so two rounds, where the
    # cache's total (KV-token-steps) leaves the chain binding the graph bound. The night
    # measured stays above the fit-aware bound, which is above the chain's.
    result = bench("tests.bench.fleet", "--tickers", "6", "--endpoints", "1", "--speedup", "10",
                   "--output-scale", "0.02", "--kv-tokens", "125000", "--database", "sqlite",
                   tmp_path=tmp_path)
    capacity = result["capacity"]
    assert capacity["fit_bound_binding"] == "stage_fit"
    assert capacity["fit_bound_s"] > capacity["graph_bound_s"]
    assert capacity["share_of_fit_bound"] <= 1
    assert capacity["share_of_fit_bound"] == pytest.approx(
        capacity["fit_bound_s"] / result["arm"]["makespan_s"])
    assert _fleet_bound(result)[1] == pytest.approx(capacity["fit_bound_s"])
