"""The time a running batch has left, read from its rows, and the readings that keep it.

The estimate is the larger of two bounds, each from what the batch shows now (never from the
elapsed time, which counts a ramp, a pause or a resume's earlier run):

- work: output tokens left ÷ the server's current output rate. Tokens left are, node by
  node, the calls not yet answered × what that node's answered calls cost in output so far,
  every attempt and re-ask included: a retry or a portfolio manager's re-ask makes a call
  dearer, never the night shorter. Progress counts calls (a node of a sample of a ticker
  answered), not attempts. The rate is the servers' generation counter over the last
  ``WINDOW_S`` (``/metrics`` readings), else the output of the calls that ended in it;
  when nothing came out in it, the batch's output over the time its calls ran.
- chain: the longest chain of calls left (a sample's nodes run one after another, its
  analysts side by side) × the recent per-call latency, issue to answer: however fast the
  server, a ticker's last nodes wait for each other. This bound keeps the ETA above 0 while
  any call is left.

The interval: the work bound at the highest and the lowest rate of the window's
``SLICES`` slices, the chain bound at the recent latencies' quartiles; each end is the larger
of its two bounds.
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
from app.activity import active_time
from app.db.models import Batch, LLMCall, ProgressReading, ServerSample, TickerRun

WINDOW_S = 120.0  # the recent past the rate and the latency are read over
SLICES = 4  # the window's parts whose rates bound the interval
MIN_LATENCIES = 3  # fewer calls in the window: the latest this many answered instead
FINISHED = ("succeeded", "failed")  # a ticker in these runs no more calls


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
    chain_left: int
    latency_s: float | None
    latency_low_s: float | None
    latency_high_s: float | None
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
                "latency_s": self.latency_s, "latency_low_s": self.latency_low_s,
                "latency_high_s": self.latency_high_s, "eta_s": self.eta_s,
                "eta_low_s": self.eta_low_s, "eta_high_s": self.eta_high_s}


def bound(tokens_left: float, rate: float | None, chain_left: int,
          latency: float | None) -> float | None:
    """Return the larger of tokens left ÷ rate and chain left × latency (None: neither known).

    0 only when nothing is left; a rate of 0 with tokens left gives no work bound (the
    server produced nothing in the window: the chain bound stands alone).
    """
    work = tokens_left / rate if rate and rate > 0 else None
    chain = chain_left * latency if latency is not None else None
    known = [b for b in (work, chain) if b is not None]
    if not known:
        return None
    if tokens_left <= 0 and chain_left <= 0:
        return 0.0
    return max(known)


def estimate(tokens_left: float, chain_left: int, rate: float | None, rate_low: float | None,
             rate_high: float | None, latency: float | None, latency_low: float | None,
             latency_high: float | None) -> tuple[float | None, float | None, float | None]:
    """Return (eta, low, high) in seconds: ``bound`` at the central, the optimistic (highest
    rate, lowest latency) and the pessimistic inputs."""
    return (bound(tokens_left, rate, chain_left, latency),
            bound(tokens_left, rate_high, chain_left, latency_low),
            bound(tokens_left, rate_low, chain_left, latency_high))


def pipeline_nodes(settings: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Return (analysts, the sequential nodes after them) for a batch's stored settings."""
    return list(ANALYSTS), sequential_nodes(int(settings.get("debate_rounds", 2)),
                                            int(settings.get("risk_rounds", 2)))


def _latencies(calls: Sequence[Any], since: datetime) -> list[float]:
    answered = sorted((c for c in calls if c.status == "ok"), key=lambda c: c.ended_at)
    recent = [c for c in answered if c.ended_at >= since] or answered[-MIN_LATENCIES:]
    if len(recent) < MIN_LATENCIES:
        recent = answered[-MIN_LATENCIES:]
    return [(c.ended_at - (c.ready_at or c.started_at)).total_seconds() for c in recent]


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
        batch = conn.execute(select(Batch.settings, Batch.tickers_total)
                             .where(Batch.id == batch_id)).one()
        calls = conn.execute(select(LLMCall.ticker, LLMCall.node, LLMCall.sample,
                                    LLMCall.status, LLMCall.completion_tokens,
                                    LLMCall.ready_at, LLMCall.started_at, LLMCall.ended_at)
                             .where(LLMCall.batch_id == batch_id,
                                    LLMCall.ended_at <= now)).all()
        samples = conn.execute(select(ServerSample.endpoint, ServerSample.sampled_at,
                                      ServerSample.generation_tokens_total)
                               .where(ServerSample.batch_id == batch_id,
                                      ServerSample.sampled_at <= now,
                                      ServerSample.sampled_at
                                      >= now - timedelta(seconds=2 * WINDOW_S))).all()
        tickers: dict[str, str] = {r.ticker: r.status for r in conn.execute(
            select(TickerRun.ticker, TickerRun.status).where(TickerRun.batch_id == batch_id))}
    settings = batch.settings or {}
    samples_per_ticker = int(settings.get("samples") or 1)
    analysts, chain = pipeline_nodes(settings)
    nodes = [*analysts, *chain]
    answered: set[tuple[str, str, int]] = set()
    cost: dict[str, float] = defaultdict(float)  # every attempt's output, by node
    for c in calls:
        cost[c.node] += c.completion_tokens or 0
        if c.status == "ok":
            answered.add((c.ticker, c.node, c.sample))
    done_by_node: dict[str, int] = defaultdict(int)
    for _, node, _ in answered:
        done_by_node[node] += 1
    overall = sum(cost.values()) / len(answered) if answered else 0.0
    per_call = {n: cost[n] / done_by_node[n] if done_by_node[n] else overall for n in nodes}
    # A ticker's status may lag its calls (stored after the last answer): finished means
    # no more calls whatever was answered.
    open_tickers = [t for t, status in tickers.items() if status not in FINISHED]
    tokens_left = 0.0
    calls_left = longest = 0
    for t in open_tickers:
        for s in range(samples_per_ticker):
            left = [n for n in nodes if (t, n, s) not in answered]
            calls_left += len(left)
            tokens_left += sum(per_call[n] for n in left)
            steps = any(n in left for n in analysts) + sum(n in left for n in chain)
            longest = max(longest, steps)
    first = min((c.started_at for c in calls), default=now)
    since = max(first, now - timedelta(seconds=WINDOW_S))
    rates: list[float] = []
    source = None
    if (now - since).total_seconds() > 0:
        rates, source = _server_rates(samples, since, now), "server"
        if not rates:
            rates, source = _call_rates(calls, since, now), "calls"
    if calls and not any(rates):
        # Nothing came out in the window (a stall, a resume's first minutes): the output
        # so far over the time calls ran, rather than no work bound at all.
        ran = active_time([(c.started_at, c.ended_at) for c in calls]).active_s
        output = sum(c.completion_tokens or 0 for c in calls)
        rates, source = ([output / ran] if ran > 0 else []), "batch"
    rate = statistics.fmean(rates) if rates else None
    lat = _latencies(calls, now - timedelta(seconds=WINDOW_S))
    latency = statistics.median(lat) if lat else None
    quart = statistics.quantiles(lat, n=4) if len(lat) >= 2 else [latency, latency, latency]
    eta, low, high = estimate(tokens_left, longest, rate, min(rates, default=None),
                              max(rates, default=None), latency, quart[0], quart[2])
    expected = len(nodes) * samples_per_ticker * int(batch.tickers_total)
    return Reading(now, expected, len(answered), len(calls),
                   int(sum(c.completion_tokens or 0 for c in calls)), tokens_left, rate,
                   min(rates, default=None), max(rates, default=None), source, longest,
                   latency, quart[0], quart[2], eta, low, high)


def record(engine: Engine, batch_id: int, found: Reading) -> None:
    """Store one reading in ``progress_readings``."""
    with engine.begin() as conn:
        conn.execute(insert(ProgressReading), [found.row(batch_id)])
