"""The time a running batch has left, read from its rows, and the readings that keep it.

The estimate is the larger of two bounds, each from what the batch shows now (never from the
elapsed time, which counts a ramp, a pause or a resume's earlier run):

- work: output tokens left ÷ the servers' current output rate. Tokens left are, node by
  node, the calls not yet answered × what that node's answered calls cost in output so far,
  every attempt and re-ask included (a retry or a portfolio manager's re-ask makes a call
  dearer, never the night shorter), less what the calls under way have already made (the
  servers' generation counter beyond the stored calls' output). Progress counts calls (a
  node of a sample of a ticker answered), not attempts. The rate is the servers' counter
  over the last ``WINDOW_S``, else the output of the calls that ended in it; when nothing
  came out in it, the batch's output over the time its calls ran. Before the batch's
  first answer there is no work bound: a warming server's rate says little.
- chain: the longest chain of calls left, one after another (a sample's analysts side by
  side as one step), each at its node's median latency so far, issue to answer: however
  fast the server, a ticker's last nodes wait for each other. A node not answered yet in
  this batch takes its latency in the newest earlier finished batch of the same kind and
  model, else the recent latency of the chain's calls, else adds nothing. The step under
  way has run since the sample's last answer (its ticker's start): what is left of it
  counts, never less than ``OVERDUE_SHARE`` of it, so the ETA stays above 0 while a call
  whose node has a latency is left.

The interval: the work bound at the fastest and the slowest of the window's ``SLICES``
slices, the chain bound at its nodes' latency quartiles; each end the larger of its two.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

from sqlalchemy import Engine, insert, select

from agents.graph import sequential_nodes
from agents.nodes import ANALYSTS
from app.db.models import Batch, LLMCall, ProgressReading, ServerSample, TickerRun
from app.morning.activity import active_time

WINDOW_S = 120.0  # the recent past the rate is read over
SLICES = 4  # the window's parts whose rates bound the interval
FINISHED = ("succeeded", "failed")  # a ticker in these runs no more calls
FINISHED_BATCH = ("succeeded", "partial")  # a batch whose rows are final
OVERDUE_SHARE = 0.5  # of its latency, the least a call under way is given still to go


@dataclass(frozen=True)
class Reading:
    """What the ETA is computed from at one moment, and the ETA (seconds; None: no basis)."""

    taken_at: datetime
    calls_expected: int
    calls_done: int
    attempts: int
    output_tokens: int
    tokens_left: float
    rate_tok_s: float | None
    rate_low_tok_s: float | None
    rate_high_tok_s: float | None
    rate_source: str | None  # "server": /metrics; "calls": answered calls; "batch": so far
    chain_left: int  # calls one after another on the longest chain left
    chain_s: float | None  # that chain at its nodes' median latencies (None: no chain left)
    chain_low_s: float | None  # ... at their first quartiles
    chain_high_s: float | None  # ... at their third quartiles
    eta_s: float | None
    eta_low_s: float | None
    eta_high_s: float | None

    def row(self, batch_id: int) -> dict[str, Any]:
        """Return the reading as a ``progress_readings`` row."""
        return {"batch_id": batch_id, "taken_at": self.taken_at,
                "calls_expected": self.calls_expected, "calls_done": self.calls_done,
                "attempts": self.attempts, "output_tokens": self.output_tokens,
                "tokens_left": self.tokens_left, "rate_tok_s": self.rate_tok_s,
                "rate_low_tok_s": self.rate_low_tok_s, "rate_high_tok_s": self.rate_high_tok_s,
                "rate_source": self.rate_source, "chain_left": self.chain_left,
                "chain_s": self.chain_s, "chain_low_s": self.chain_low_s,
                "chain_high_s": self.chain_high_s, "eta_s": self.eta_s,
                "eta_low_s": self.eta_low_s, "eta_high_s": self.eta_high_s}


def bound(tokens_left: float, rate: float | None, chain_s: float | None) -> float | None:
    """Return the larger of tokens left ÷ rate and the chain's seconds (None: neither known).

    A rate of 0 or None gives no work bound; 0 only when no tokens and no chain are left.
    """
    work = tokens_left / rate if rate and rate > 0 else None
    known = [b for b in (work, chain_s) if b is not None]
    return max(known) if known else None


def pipeline_nodes(settings: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Return (analysts, the sequential nodes after them) for a batch's stored settings."""
    return list(ANALYSTS), sequential_nodes(int(settings.get("debate_rounds", 2)),
                                            int(settings.get("risk_rounds", 2)))


def _costs(calls: Sequence[Any]) -> dict[str, float]:
    """Return each node's output per answered call, every attempt's output counted."""
    cost: dict[str, float] = defaultdict(float)
    answered: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for c in calls:
        cost[c.node] += c.completion_tokens or 0
        if c.status == "ok":
            answered[c.node].add((c.ticker, c.sample))
    return {n: cost[n] / len(answered[n]) for n in answered}


def _prior(engine: Engine, batch_id: int) -> tuple[dict[str, float],
                                                   dict[str, tuple[float, float, float]]]:
    """Return the newest earlier finished batch of the same kind and model: its nodes' output
    per call and latency quartiles, for the nodes this batch has not answered yet."""
    with engine.connect() as conn:
        this = conn.execute(select(Batch.kind, Batch.settings)
                            .where(Batch.id == batch_id)).one()
        model = (this.settings or {}).get("model")
        earlier = conn.execute(select(Batch.id, Batch.settings)
                               .where(Batch.id < batch_id, Batch.kind == this.kind,
                                      Batch.status.in_(FINISHED_BATCH))
                               .order_by(Batch.id.desc()).limit(20)).all()
        same = next((b.id for b in earlier
                     if (b.settings or {}).get("model") == model), None)
        if same is None:
            return {}, {}
        calls = conn.execute(select(LLMCall.ticker, LLMCall.node, LLMCall.sample,
                                    LLMCall.status, LLMCall.completion_tokens,
                                    LLMCall.ready_at, LLMCall.started_at, LLMCall.ended_at)
                             .where(LLMCall.batch_id == same)).all()
    return _costs(calls), _node_latencies(calls)


def _node_latencies(calls: Sequence[Any]) -> dict[str, tuple[float, float, float]]:
    """Return each node's answered calls' latency, issue to answer: (q1, median, q3)."""
    seen: dict[str, list[float]] = defaultdict(list)
    for c in calls:
        if c.status == "ok":
            seen[c.node].append((c.ended_at - (c.ready_at or c.started_at)).total_seconds())
    out = {}
    for node, values in seen.items():
        q = statistics.quantiles(values, n=4) if len(values) >= 2 else values * 3
        out[node] = (q[0], statistics.median(values), q[2])
    return out


def _chain_seconds(left: list[str], analysts: list[str],
                   took: dict[str, tuple[float, float, float]],
                   recent: tuple[float, float, float] | None,
                   running_s: float) -> tuple[float, float, float] | None:
    """Return the time one sample's calls left take one after another (q1, median, q3): its
    analysts side by side as one step at their nodes' latency, each later node at its own
    or, not answered yet, at ``recent``; None when no step has a latency to go by. The
    first step has run ``running_s`` already: what is left of it, but never less than
    ``OVERDUE_SHARE`` of it (a call past its usual latency still has time to go)."""
    steps = [[took[n] for n in left if n in analysts and n in took]]
    for n in left:
        if n not in analysts:
            seen = took.get(n, recent)
            steps.append([seen] if seen is not None else [])
    known = [step for step in steps if step]
    if not known:
        return None
    out = []
    for i in range(3):
        times = [max(t[i] for t in step) for step in known]
        times[0] = max(times[0] - running_s, OVERDUE_SHARE * times[0])
        out.append(sum(times))
    return out[0], out[1], out[2]


def _recent_chain_latency(calls: Sequence[Any], analysts: list[str],
                          since: datetime) -> tuple[float, float, float] | None:
    """Return the latency quartiles of the chain's calls (not the analysts': they run four
    side by side) answered since ``since``, else of the latest answered; None: none yet."""
    chain = sorted((c for c in calls if c.status == "ok" and c.node not in analysts),
                   key=lambda c: c.ended_at)
    recent = [c for c in chain if c.ended_at >= since] or chain[-3:]
    values = [(c.ended_at - (c.ready_at or c.started_at)).total_seconds() for c in recent]
    if not values:
        return None
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else values * 3
    return (q[0], statistics.median(values), q[2])


def _in_flight(samples: Sequence[Any], calls: Sequence[Any]) -> float:
    """Return the output the servers made that no stored call accounts for yet: calls under
    way (the counters' increase since the batch's first reading, less the output of the
    calls that ended since)."""
    if not samples:
        return 0.0
    first = min(s.sampled_at for s in samples)
    made = 0.0
    by_endpoint: dict[str | None, list[Any]] = defaultdict(list)
    for s in samples:
        by_endpoint[s.endpoint].append(s)
    for rows in by_endpoint.values():
        rows.sort(key=lambda s: s.sampled_at)
        for before, after in pairwise(rows):
            step = after.generation_tokens_total - before.generation_tokens_total
            made += step if step >= 0 else after.generation_tokens_total
    return max(0.0, made - sum(c.completion_tokens or 0 for c in calls if c.ended_at >= first))


def _server_rates(samples: Sequence[Any], since: datetime, now: datetime) -> list[float]:
    """Return the servers' output rate in each slice of the window (an endpoint's counter
    that went back, a restarted server, counts from its new value)."""
    width = (now - since).total_seconds() / SLICES
    tokens = [0.0] * SLICES
    by_endpoint: dict[str | None, list[Any]] = defaultdict(list)
    for s in samples:
        by_endpoint[s.endpoint].append(s)
    seen = False
    for rows in by_endpoint.values():
        rows.sort(key=lambda s: s.sampled_at)
        for before, after in pairwise(rows):
            made = after.generation_tokens_total - before.generation_tokens_total
            if made < 0:
                made = after.generation_tokens_total
            # Spread evenly between the two readings, then split among the slices.
            a = (before.sampled_at - since).total_seconds()
            b = (after.sampled_at - since).total_seconds()
            if b <= 0 or b <= a:
                continue
            seen = True
            for i in range(SLICES):
                overlap = min(b, (i + 1) * width) - max(a, i * width)
                if overlap > 0:
                    tokens[i] += made * overlap / (b - a)
    return [t / width for t in tokens] if seen else []


def _call_rates(calls: Sequence[Any], since: datetime, now: datetime) -> list[float]:
    """Return the output of the attempts that ended in each slice of the window, per second."""
    width = (now - since).total_seconds() / SLICES
    tokens = [0.0] * SLICES
    for c in calls:
        if c.ended_at >= since:
            at = (c.ended_at - since).total_seconds()
            tokens[min(SLICES - 1, int(at // width))] += c.completion_tokens or 0
    return [t / width for t in tokens]


def reading(engine: Engine, batch_id: int, now: datetime) -> Reading:
    """Return the batch's reading at ``now`` from the rows stored by then (a past ``now``
    replays the night as it stood)."""
    with engine.connect() as conn:
        batch = conn.execute(select(Batch.settings, Batch.tickers_total, Batch.started_at)
                             .where(Batch.id == batch_id)).one()
        calls = conn.execute(select(LLMCall.ticker, LLMCall.node, LLMCall.sample,
                                    LLMCall.status, LLMCall.completion_tokens,
                                    LLMCall.ready_at, LLMCall.started_at, LLMCall.ended_at)
                             .where(LLMCall.batch_id == batch_id,
                                    LLMCall.ended_at <= now)).all()
        samples = conn.execute(select(ServerSample.endpoint, ServerSample.sampled_at,
                                      ServerSample.generation_tokens_total)
                               .where(ServerSample.batch_id == batch_id,
                                      ServerSample.sampled_at <= now)).all()
        tickers = conn.execute(select(TickerRun.ticker, TickerRun.status,
                                      TickerRun.started_at, TickerRun.finished_at)
                               .where(TickerRun.batch_id == batch_id)).all()
    settings = batch.settings or {}
    samples_per_ticker = int(settings.get("samples") or 1)
    analysts, chain = pipeline_nodes(settings)
    nodes = [*analysts, *chain]
    answered = {(c.ticker, c.node, c.sample) for c in calls if c.status == "ok"}
    prior_cost, prior_took = _prior(engine, batch_id)
    own = _costs(calls)
    overall = sum(c.completion_tokens or 0 for c in calls) / len(answered) if answered else 0.0
    per_call = {n: own.get(n, prior_cost.get(n, overall)) for n in nodes}
    # A finished ticker runs no more calls, whatever it answered; one finished after
    # ``now`` was still open then.
    open_tickers = [t for t in tickers
                    if t.status not in FINISHED or (t.finished_at or now) > now]
    own_took = _node_latencies(calls)
    took = {**prior_took, **own_took}
    # When each sample's step under way began: its last answer, else its ticker's start.
    began: dict[tuple[str, int], datetime] = {}
    for c in calls:
        if c.status == "ok" and c.ended_at > began.get((c.ticker, c.sample), c.ended_at
                                                          - timedelta(seconds=1)):
            began[(c.ticker, c.sample)] = c.ended_at
    recent = _recent_chain_latency(calls, analysts, now - timedelta(seconds=WINDOW_S))
    tokens_left = 0.0
    calls_left = longest = 0
    slowest: tuple[float, float, float] | None = None  # the longest chain's seconds
    for run in open_tickers:
        t = run.ticker
        started = run.started_at if run.started_at and run.started_at <= now else None
        for s in range(samples_per_ticker):
            left = [n for n in nodes if (t, n, s) not in answered]
            calls_left += len(left)
            tokens_left += sum(per_call[n] for n in left)
            steps = any(n in left for n in analysts) + sum(n in left for n in chain)
            longest = max(longest, steps)
            since_step = began.get((t, s), started)
            this = _chain_seconds(left, analysts, took, recent,
                                  0.0 if since_step is None else (now - since_step).total_seconds())
            if this is not None and (slowest is None or this[1] > slowest[1]):
                slowest = this
    # Calls under way have made part of their output: the servers' counter says how much.
    tokens_left = max(0.0, tokens_left - _in_flight(samples, calls))
    # From the batch's start at the earliest: calls under way are in no row yet.
    first = min((c.started_at for c in calls), default=batch.started_at or now)
    since = max(min(first, batch.started_at or first), now - timedelta(seconds=WINDOW_S))
    rates: list[float] = []
    source = None
    # Before the first answer the rate says little (a server warming up, a queue filling):
    # the chain, at the night before's latencies, stands alone.
    if answered and (now - since).total_seconds() > 0:
        rates, source = _server_rates(samples, since, now), "server"
        if not rates:
            rates, source = _call_rates(calls, since, now), "calls"
    if answered and not any(rates):
        # Nothing came out in the window (a stall, a resume's first minutes): the output
        # so far over the time calls ran, rather than no work bound at all.
        ran = active_time([(c.started_at, c.ended_at) for c in calls]).active_s
        output = sum(c.completion_tokens or 0 for c in calls)
        rates, source = ([output / ran] if ran > 0 else []), "batch"
    rate = statistics.fmean(rates) if rates else None
    low_s, chain_s, high_s = slowest or (None, None, None)
    eta, low, high = (bound(tokens_left, rate, chain_s),
                      bound(tokens_left, max(rates, default=None), low_s),
                      bound(tokens_left, min(rates, default=None), high_s))
    expected = len(nodes) * samples_per_ticker * int(batch.tickers_total)
    return Reading(now, expected, len(answered), len(calls),
                   int(sum(c.completion_tokens or 0 for c in calls)), tokens_left, rate,
                   min(rates, default=None), max(rates, default=None), source, longest,
                   chain_s, low_s, high_s, eta, low, high)


def record(engine: Engine, batch_id: int, found: Reading) -> None:
    """Store one reading in ``progress_readings``."""
    with engine.begin() as conn:
        conn.execute(insert(ProgressReading), [found.row(batch_id)])
