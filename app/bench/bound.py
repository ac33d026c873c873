"""The most output tok/s a schedule that respects the graph could get from the server.

A model, from the run's own readings. Each step of the server decodes one token of every
running request and takes ``a + b × running`` seconds (fitted to the run's ``/metrics``
readings, prefill interleaved as it was). A request of ``p`` prompt tokens that decodes
``o`` holds ``p + g`` KV tokens at its ``g``-th step, so the workload needs ``Σ (p·o +
o²/2)`` KV-token-steps; a graph-respecting schedule cannot share them, since no two calls
of one chain run at once (flood can: that is how it beats this bound). No schedule can then
finish in fewer steps than the largest of (output ÷ max_num_seqs), (KV-token-steps ÷ KV
capacity) and the graph's critical path (a ticker's longest chain of output tokens), per
endpoint; its time is at least ``a × steps + b × output ÷ endpoints``. The bound is the
output over that time. Prefill's own work is in the fitted step time, not added on top,
and preemption's recomputation is not counted: the bound is optimistic on both.

``fit_bound`` adds what the cache's fit costs on a server that admits a request only when
its whole answer (prompt and output) fits, as the simulated endpoints do (tests/fakevllm/
load.py): a stage of the chain whose calls on one endpoint cannot all be admitted at once
runs in rounds, and the night with it (``Stage``). Both figures assume nightdesk's routing,
each ticker's calls on one endpoint (docs/architecture.md, "Several endpoints").
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
from scipy import stats
from sqlalchemy import Engine, select

from app.db.models import LLMCall, ServerSample
from app.runs.replay import Workload

# Levels: running requests (rounded) -> [generated tokens, seconds] over reading intervals.
Levels = dict[int, list[float]]
# Fewer levels than this: no interval. At ``expanded_level`` the interval held the true
# step's bound on 92.9-97.3% of draws from 5 levels, at 10% and 30% noise, levels anywhere
# from 1 to 64 running or every one from 1 to 5, and on 86.0% at 4
# (docs/lab/2026-12-07-verdicts-outside-4.md); the plain percentiles had held 80% at 3
# levels and under 90% up to 12 (-2.md, -3.md).
MIN_INTERVAL_LEVELS = 5


@dataclass(frozen=True)
class GraphFacts:
    """What the workload asks of the server, from the answered calls of one arm."""

    output_tokens: int
    kv_token_steps: float  # Σ (p·o + o²/2) over the calls
    critical_path_tokens: int  # the longest chain of output tokens of one ticker and sample
    calls: int


@dataclass(frozen=True)
class StepCost:
    """Seconds per server step at ``running`` requests: ``a + b × running``."""

    a: float
    b: float
    levels: int = 0  # running levels the fit saw

    def at(self, running: float) -> float:
        return self.a + self.b * running


@dataclass(frozen=True)
class Bound:
    """The graph-respecting bound and which of its terms set it."""

    tok_s: float
    seconds: float
    steps: float
    binding: str  # max_num_seqs | kv_cache | critical_path | stage_fit (fit_bound's)
    kv_tokens: int
    max_num_seqs: int
    endpoints: int
    step: StepCost
    graph: GraphFacts
    kind: str = "graph"  # graph: graph_bound's; graph+fit: fit_bound's
    fit: str | None = None  # fit_bound's: the stage that needs the most rounds, and why


@dataclass(frozen=True)
class Stage:
    """Calls every ticker makes at one place of its graph (one earliest start, one least
    tail), at their least over the tickers: ``calls`` a ticker (the fewest), each at least
    ``output_tokens`` long and reserving at least ``footprint_tokens`` (prompt and output)
    to be admitted, with at least ``outside_tokens`` of its chain's output before and after
    it. Rounds: on one endpoint at most ``concurrent`` of them run at once."""

    nodes: tuple[str, ...]
    calls: int
    output_tokens: int
    footprint_tokens: int
    outside_tokens: int

    def concurrent(self, kv_tokens: int, max_num_seqs: int) -> int:
        # One answer larger than the whole cache still runs, alone (tests/fakevllm/load.py).
        return max(1, min(max_num_seqs, kv_tokens // self.footprint_tokens))

    def rounds(self, tickers: int, kv_tokens: int, max_num_seqs: int) -> int:
        return -(-tickers * self.calls // self.concurrent(kv_tokens, max_num_seqs))

    def steps(self, tickers: int, kv_tokens: int, max_num_seqs: int) -> int:
        """Return the least steps an endpoint holding ``tickers`` of the tickers runs.

        Each call runs ``output_tokens`` steps in a row, inside ``T - outside_tokens`` steps
        of a night of ``T``. Points ``output_tokens`` apart meet every such call once, at
        most ``concurrent`` calls at each, and ``floor((T - outside) / output)`` of them fit
        the window: so ``T >= outside + rounds × output``.
        """
        return self.outside_tokens + self.rounds(tickers, kv_tokens, max_num_seqs) * (
            self.output_tokens)


@dataclass(frozen=True)
class FitFacts:
    """What ``fit_bound`` needs beyond ``GraphFacts``: the tickers, the least output of one,
    and the graph's stages (``fit_facts``)."""

    tickers: int
    ticker_output_min: int
    stages: tuple[Stage, ...]


def graph_facts(calls: list[tuple[str, int, str, int, int]], workload: Workload) -> GraphFacts:
    """Sum the workload's demand from answered calls ``(ticker, sample, node, prompt, output)``.

    The critical path follows the workload's dependencies, weighted by each call's output. A
    node asked more than once (a decision asked again) has one item per request: each item
    takes the node's next call in order, the last item any calls left over.
    """
    outputs: dict[tuple[str, int, str], list[int]] = defaultdict(list)
    for ticker, sample, node, _, output in calls:
        outputs[(ticker, sample, node)].append(output)
    longest = 0
    for ticker, items in workload.items():
        asked = Counter((item.sample, item.node) for item in items)
        taken: Counter[tuple[int, str]] = Counter()
        ends: dict[tuple[int, str], int] = {}
        for item in items:  # a workload lists a ticker's requests in an order deps allow
            before = max((ends.get((item.sample, d), 0) for d in item.deps), default=0)
            mine = outputs.get((ticker, item.sample, item.node), [])
            i = taken[(item.sample, item.node)]
            taken[(item.sample, item.node)] += 1
            last = taken[(item.sample, item.node)] == asked[(item.sample, item.node)]
            ends[(item.sample, item.name)] = before + sum(mine[i:] if last else mine[i:i + 1])
        longest = max(longest, *ends.values(), 0)
    return GraphFacts(
        output_tokens=sum(o for *_, o in calls),
        kv_token_steps=float(sum(p * o + o * o / 2 for *_, p, o in calls)),
        critical_path_tokens=longest, calls=len(outputs))


def fit_facts(calls: list[tuple[str, int, str, int, int]], workload: Workload) -> FitFacts:
    """Return the stages of answered calls ``(ticker, sample, node, prompt, output)``.

    Calls are matched to items as ``graph_facts`` does; an item of other than one call
    (not answered, or a re-ask's leftovers) counts in its chain's length but in no stage.
    A node's calls join the stage of their least start and tail (the analysts side by
    side make one stage); a ticker without it makes the stage count none.
    """
    answered: dict[tuple[str, int, str], list[tuple[int, int]]] = defaultdict(list)
    for ticker, sample, node, prompt, output in calls:
        answered[(ticker, sample, node)].append((prompt, output))
    # name -> (output, prompt + output, chain output before, after) of each call alone
    seen: dict[str, list[tuple[int, int, int, int]]] = defaultdict(list)
    counts: dict[str, Counter[str]] = defaultdict(Counter)  # name -> ticker -> its calls
    least: int | None = None
    for ticker, items in workload.items():
        asked = Counter((item.sample, item.node) for item in items)
        taken: Counter[tuple[int, str]] = Counter()
        own: dict[tuple[int, str], list[tuple[int, int]]] = {}
        starts: dict[tuple[int, str], int] = {}
        for item in items:  # a workload lists a ticker's requests in an order deps allow
            key, here = (item.sample, item.node), (item.sample, item.name)
            mine, i = answered.get((ticker, *key), []), taken[key]
            taken[key] += 1
            own[here] = mine[i:] if taken[key] == asked[key] else mine[i:i + 1]
            starts[here] = max((starts.get((item.sample, d), 0) + _out(own, item.sample, d)
                                for d in item.deps), default=0)
        tails: dict[tuple[int, str], int] = {}
        for item in reversed(items):  # so every dependant's tail is known first
            here = (item.sample, item.name)
            for d in item.deps:
                tails[(item.sample, d)] = max(tails.get((item.sample, d), 0),
                                              tails.get(here, 0) + _out(own, *here))
        for item in items:
            here = (item.sample, item.name)
            if len(own[here]) == 1:
                prompt, output = own[here][0]
                seen[item.name].append((output, prompt + output, starts[here],
                                        tails.get(here, 0)))
                counts[item.name][ticker] += 1
        total = sum(o for mine in own.values() for _, o in mine)
        least = total if least is None else min(least, total)
    stages: dict[tuple[int, int], list[tuple[str, int, int, int]]] = defaultdict(list)
    for name, found in seen.items():
        per_ticker = min(counts[name][t] for t in workload)
        if per_ticker:  # the window of them all: the least start and the least tail
            place = (min(f[2] for f in found), min(f[3] for f in found))
            stages[place].append((name, per_ticker, min(f[0] for f in found),
                                  min(f[1] for f in found)))
    return FitFacts(len(workload), least or 0, tuple(
        Stage(tuple(g[0] for g in group), sum(g[1] for g in group), min(g[2] for g in group),
              min(g[3] for g in group), before + after)
        for (before, after), group in sorted(stages.items())))


def _out(own: dict[tuple[int, str], list[tuple[int, int]]], sample: int, name: str) -> int:
    return sum(o for _, o in own.get((sample, name), []))


def arm_graph_facts(engine: Engine, batch_id: int, workload: Workload) -> GraphFacts:
    """Return the graph facts of one arm's answered calls of the workload's tickers."""
    return graph_facts(_answered(engine, batch_id, workload), workload)


def arm_fit_facts(engine: Engine, batch_id: int, workload: Workload) -> FitFacts:
    """Return the stages (``fit_facts``) of one arm's answered calls of the workload's."""
    return fit_facts(_answered(engine, batch_id, workload), workload)


def _answered(engine: Engine, batch_id: int, workload: Workload
              ) -> list[tuple[str, int, str, int, int]]:
    with engine.connect() as conn:
        rows = conn.execute(select(LLMCall.ticker, LLMCall.sample, LLMCall.node,
                                   LLMCall.prompt_tokens, LLMCall.completion_tokens)
                            .where(LLMCall.batch_id == batch_id, LLMCall.status == "ok")).all()
    return [(r.ticker, r.sample, r.node, r.prompt_tokens or 0, r.completion_tokens or 0)
            for r in rows if r.ticker in workload]


def decode_levels(engine: Engine, batch_id: int) -> Levels:
    """Return the batch's reading intervals by running requests: tokens made and seconds."""
    with engine.connect() as conn:
        rows = conn.execute(select(ServerSample.endpoint, ServerSample.sampled_at,
                                   ServerSample.running, ServerSample.generation_tokens_total)
                            .where(ServerSample.batch_id == batch_id)
                            .order_by(ServerSample.sampled_at)).all()
    series: dict[str | None, list[Any]] = defaultdict(list)
    for r in rows:
        series[r.endpoint].append(r)
    levels: Levels = {}
    for one in series.values():
        for before, after in itertools.pairwise(one):
            tokens = after.generation_tokens_total - before.generation_tokens_total
            seconds = (after.sampled_at - before.sampled_at).total_seconds()
            running = round((before.running + after.running) / 2)
            if tokens > 0 and seconds > 0 and running >= 1:  # a restart or an idle interval
                level = levels.setdefault(running, [0.0, 0.0])
                level[0] += tokens
                level[1] += seconds
    return levels


def pool(parts: list[Levels]) -> Levels:
    """Add several arms' levels up (JSON keys come back as strings)."""
    pooled: Levels = {}
    for part in parts:
        for running, (tokens, seconds) in part.items():
            level = pooled.setdefault(int(running), [0.0, 0.0])
            level[0] += tokens
            level[1] += seconds
    return pooled


def fit_step(levels: Levels) -> StepCost | None:
    """Fit ``seconds per token = a ÷ running + b`` to the levels, weighted by tokens.

    A step of ``r`` requests makes ``r`` tokens in ``a + b·r`` seconds. With one level only,
    or a fit that comes out negative, the growth with ``running`` is left out (``b = 0``).
    """
    return _fit([(r, t, s) for r, (t, s) in levels.items() if t > 0 and s > 0])


def _fit(usable: list[tuple[int, float, float]]) -> StepCost | None:
    """``fit_step`` over (running, tokens, seconds) triples, repeats allowed."""
    if not usable:
        return None
    x = np.array([1.0 / r for r, _, _ in usable])
    y = np.array([s / t for _, t, s in usable])
    w = np.array([t for _, t, _ in usable])
    if len({r for r, _, _ in usable}) >= 2:  # a resample may repeat one level only
        b, a = np.polyfit(x, y, 1, w=np.sqrt(w))[::-1]  # y = a·x + b
        if a > 0 and b >= 0:
            return StepCost(float(a), float(b), len(usable))
    # One level, or a fit with a negative term: seconds per step at the mean level only.
    steps = sum(t / r for r, t, _ in usable)
    return StepCost(sum(s for _, _, s in usable) / steps, 0.0, len(usable))


def graph_bound(graph: GraphFacts, kv_tokens: int, max_num_seqs: int, step: StepCost,
                endpoints: int = 1) -> Bound | None:
    """Return the bound (the module's model); None when the workload made no output."""
    if graph.output_tokens <= 0 or kv_tokens <= 0 or max_num_seqs <= 0 or endpoints <= 0:
        return None
    terms = {"max_num_seqs": graph.output_tokens / (max_num_seqs * endpoints),
             "kv_cache": graph.kv_token_steps / (kv_tokens * endpoints),
             "critical_path": float(graph.critical_path_tokens)}
    binding = max(terms, key=lambda k: terms[k])
    steps = terms[binding]
    seconds = step.a * steps + step.b * graph.output_tokens / endpoints
    return Bound(graph.output_tokens / seconds if seconds > 0 else 0.0, seconds, steps,
                 binding, kv_tokens, max_num_seqs, endpoints, step, graph)


def fit_bound(graph: GraphFacts, fit: FitFacts, kv_tokens: int, max_num_seqs: int,
              step: StepCost, endpoints: int = 1) -> Bound | None:
    """Return the bound that respects the graph and the cache's fit: ``graph_bound``, or
    the busiest endpoint's stage rounds (``Stage.steps``) where they take longer. That
    endpoint holds ``ceil(tickers / endpoints)`` whole tickers, so at least as many times
    the least ticker's output; a server that admits a call only when its whole answer fits
    runs no more at once. Equal to ``graph_bound`` where every stage fits (one round)."""
    chain = graph_bound(graph, kv_tokens, max_num_seqs, step, endpoints)
    if chain is None or not fit.stages or fit.tickers <= 0:
        return None if chain is None else replace(chain, kind="graph+fit")
    held = -(-fit.tickers // endpoints)
    stage = max(fit.stages, key=lambda s: (s.steps(held, kv_tokens, max_num_seqs),
                                           s.rounds(held, kv_tokens, max_num_seqs)))
    steps = stage.steps(held, kv_tokens, max_num_seqs)
    seconds = step.a * steps + step.b * held * fit.ticker_output_min
    rounds = stage.rounds(held, kv_tokens, max_num_seqs)
    why = (f"{', '.join(stage.nodes)}: {held * stage.calls} calls on the busiest endpoint, "
           f"{stage.concurrent(kv_tokens, max_num_seqs)} fit at once, {rounds} round"
           f"{'s' if rounds > 1 else ''}")
    if seconds <= chain.seconds:
        return replace(chain, kind="graph+fit", fit=why)
    return replace(chain, tok_s=graph.output_tokens / seconds, seconds=seconds, steps=steps,
                   binding="stage_fit", kind="graph+fit", fit=why)


def bound_interval(graph: GraphFacts, kv_tokens: int, max_num_seqs: int, levels: Levels,
                   endpoints: int = 1, confidence: float = 0.9) -> tuple[float, float] | None:
    """Return the bound's ``confidence`` interval in tok/s: the step refitted (``_fit``'s
    rule) to the reading levels resampled with replacement, scipy's percentile bootstrap
    at the expanded level (``expanded_level``), a fixed seed, so one run's figures always
    give one interval; None with fewer than ``MIN_INTERVAL_LEVELS`` levels, where it would
    hold less than it says."""
    usable = [(r, t, s) for r, (t, s) in levels.items() if t > 0 and s > 0]
    point = graph_bound(graph, kv_tokens, max_num_seqs, StepCost(1.0, 0.0), endpoints)
    if len(usable) < MIN_INTERVAL_LEVELS or point is None:
        return None
    columns = tuple(np.array(c, dtype=float) for c in zip(*usable, strict=True))
    found = stats.bootstrap(columns, partial(_resampled_tok_s, graph, point.steps, endpoints),
                            paired=True, vectorized=True, n_resamples=999,
                            confidence_level=expanded_level(confidence, len(usable)),
                            method="percentile", rng=np.random.default_rng(0))
    low, high = found.confidence_interval
    return float(low), float(high)


def expanded_level(confidence: float, levels: int) -> float:
    """Return the level of the percentiles that give a ``confidence`` interval of a fit of two
    terms to ``levels`` points: resampled, such a fit's variance is about (n - 2) / n of the
    truth's, and the plain percentiles held 87.8-90.5% for 90% at 12-30 levels. This is
    Hesterberg's expanded percentile interval (the normal quantile times sqrt(n / (n - 2))
    and taken from Student's t on n - 2 df) (docs/lab/2026-12-07-verdicts-outside-3.md)."""
    z = math.sqrt(levels / (levels - 2)) * float(stats.t.ppf((1 + confidence) / 2, levels - 2))
    return float(2 * stats.norm.cdf(z) - 1)


def _resampled_tok_s(graph: GraphFacts, steps: float, endpoints: int, running: np.ndarray,
                     tokens: np.ndarray, seconds: np.ndarray, axis: int = -1) -> np.ndarray:
    """The bound of ``_fit``'s step for each resample along ``axis`` at once: seconds per
    token on 1 / running by least squares weighted by tokens, or, with one level or a
    negative term, seconds per step at the mean level (b = 0)."""
    x, y, w = 1.0 / running, seconds / tokens, tokens
    total = w.sum(axis, keepdims=True)
    mx, my = (w * x).sum(axis, keepdims=True) / total, (w * y).sum(axis, keepdims=True) / total
    sxx = (w * (x - mx) ** 2).sum(axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = (w * (x - mx) * (y - my)).sum(axis) / sxx
    b = my.squeeze(axis) - a * mx.squeeze(axis)
    fitted = (running.max(axis) > running.min(axis)) & (a > 0) & (b >= 0)
    flat = seconds.sum(axis) / (tokens / running).sum(axis)
    time = np.where(fitted, a, flat) * steps + np.where(fitted, b, 0.0) * (
        graph.output_tokens / endpoints)
    with np.errstate(divide="ignore"):
        return np.where(time > 0, graph.output_tokens / time, 0.0)


def summed_capacity(graph: GraphFacts, kv_tokens: int, max_num_seqs: int, step: StepCost,
                    endpoints: int = 1) -> tuple[float, int]:
    """Return the endpoints' summed output tok/s at a full cache, and the sequences each runs.

    An endpoint runs as many of the workload's mean request (its KV-token-steps per output
    token) as its cache holds, at most ``max_num_seqs``; no dependency holds any back. A
    graph-respecting night may offer fewer: the bound's share of this says how many.
    """
    mean_hold = graph.kv_token_steps / graph.output_tokens if graph.output_tokens else 0.0
    # Unrounded, as the bound's KV term is: a bound the cache sets is then all of capacity.
    seqs = min(float(max_num_seqs), kv_tokens / mean_hold) if mean_hold else 0.0
    return (endpoints * seqs / step.at(seqs) if seqs else 0.0), int(seqs)
