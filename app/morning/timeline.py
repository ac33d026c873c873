"""Split a batch's makespan into intervals: output, tickers in flight and server load over time.

A batch's totals say how fast it was; the intervals say when it was slow (a ramp, a tail).
They come from the batch's own rows, first call to last answer:

- output tok/s: each answered call's tokens spread evenly over its decode time (first token
  to end; start to end when no first token was recorded), summed per interval;
- tickers in flight: the mean number of tickers between their first call's start and
  their last call's end (time-weighted over the interval);
- calls started in the interval;
- from ``/metrics`` readings taken in the interval: mean running requests (each endpoint's
  mean, summed), the highest KV usage, and the preemptions (each endpoint's counter
  increase; a counter that went back, a restarted server, counts from zero).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from pydantic import computed_field
from pydantic.dataclasses import dataclass
from sqlalchemy import Engine, select

from app.db.models import LLMCall, ServerSample

# Interval widths to choose from: about ``INTERVALS`` of them over the makespan.
WIDTHS_S = (10, 15, 20, 30, 60, 120, 300, 600, 900, 1800, 3600)
INTERVALS = 12


@dataclass
class Interval:
    """One stretch of a batch's makespan (seconds from its first call)."""

    start_s: float
    end_s: float
    output_tokens_per_s: float
    tickers_in_flight: float
    attempts_started: int  # HTTP requests begun in the interval
    running_mean: float | None  # None: no reading in the interval
    kv_usage_max: float | None
    preemptions: float | None

    @computed_field  # type: ignore[prop-decorator]  # in the API's JSON, which the page reads
    @property
    def label(self) -> str:
        """Return the interval in whole seconds, "10–20"; one number when both ends round
        to it (a last interval cut short at the makespan: never "10–10")."""
        start, end = f"{self.start_s:.0f}", f"{self.end_s:.0f}"
        return start if start == end else f"{start}–{end}"


def width_for(makespan_s: float) -> float:
    """Return the interval width: the smallest listed one giving at most ``INTERVALS``."""
    for width in WIDTHS_S:
        if makespan_s / width <= INTERVALS:
            return float(width)
    return float(WIDTHS_S[-1])


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def batch_timeline(engine: Engine, batch_id: int, width_s: float | None = None
                   ) -> list[Interval]:
    """Return the batch's intervals, oldest first (none for a batch without calls)."""
    with engine.connect() as conn:
        calls = conn.execute(
            select(LLMCall.ticker, LLMCall.status, LLMCall.completion_tokens,
                   LLMCall.started_at, LLMCall.first_token_at, LLMCall.ended_at)
            .where(LLMCall.batch_id == batch_id)).all()
        samples = conn.execute(
            select(ServerSample.endpoint, ServerSample.sampled_at, ServerSample.running,
                   ServerSample.kv_cache_usage, ServerSample.preemptions_total)
            .where(ServerSample.batch_id == batch_id)
            .order_by(ServerSample.sampled_at)).all()
    if not calls:
        return []
    t0 = min(c.started_at for c in calls)
    end = max((c.ended_at - t0).total_seconds() for c in calls)

    def at(moment: datetime) -> float:
        return (moment - t0).total_seconds()

    width = width_s or width_for(end)
    count = max(1, int(-(-end // width)))  # ceil: the last interval ends at the makespan
    bounds = [(i * width, min(end, (i + 1) * width)) for i in range(count)]
    tokens = [0.0] * count
    started = [0] * count
    spans: dict[str, list[float]] = {}
    for c in calls:
        s, e = at(c.started_at), at(c.ended_at)
        started[min(count - 1, int(s // width))] += 1
        span = spans.setdefault(c.ticker, [s, e])
        span[0], span[1] = min(span[0], s), max(span[1], e)
        if c.status != "ok" or not c.completion_tokens:
            continue
        d0 = at(c.first_token_at) if c.first_token_at is not None else s
        decode = e - d0
        if decode <= 0:  # no measurable decode time: all its tokens at its end
            tokens[min(count - 1, int(e // width))] += c.completion_tokens
            continue
        for i, (lo, hi) in enumerate(bounds):
            tokens[i] += c.completion_tokens * _overlap(d0, e, lo, hi) / decode
    readings = _readings(samples, at, bounds, width)
    out = []
    for i, (lo, hi) in enumerate(bounds):
        length = hi - lo
        in_flight = sum(_overlap(a, b, lo, hi) for a, b in spans.values())
        running, kv, preempted = readings[i]
        out.append(Interval(
            start_s=round(lo, 1), end_s=round(hi, 1),
            output_tokens_per_s=tokens[i] / length if length > 0 else 0.0,
            tickers_in_flight=in_flight / length if length > 0 else 0.0,
            attempts_started=started[i], running_mean=running, kv_usage_max=kv,
            preemptions=preempted))
    return out


def _readings(samples: Sequence[Any], at: Callable[[datetime], float],
              bounds: list[tuple[float, float]], width: float,
              ) -> list[tuple[float | None, float | None, float | None]]:
    """Return per interval: summed per-endpoint mean running, highest KV, preemptions."""
    count = len(bounds)
    running: list[dict[str | None, list[float]]] = [defaultdict(list) for _ in range(count)]
    kv: list[float | None] = [None] * count
    preempted: list[float | None] = [None] * count
    last: dict[str | None, float] = {}
    for r in samples:
        t = at(r.sampled_at)
        before = last.get(r.endpoint)
        last[r.endpoint] = r.preemptions_total
        if t < 0 or t > bounds[-1][1]:
            continue  # the sampler reads before the first call and after the last answer
        i = min(count - 1, int(t // width))
        running[i][r.endpoint].append(r.running)
        kv[i] = max(r.kv_cache_usage, kv[i] if kv[i] is not None else 0.0)
        if before is not None:
            grew = r.preemptions_total - before if r.preemptions_total >= before \
                else r.preemptions_total  # reset: the server restarted and counts from 0
            preempted[i] = (preempted[i] or 0.0) + grew
        elif preempted[i] is None:
            preempted[i] = 0.0
    return [(sum(sum(v) / len(v) for v in running[i].values()) if running[i] else None,
             kv[i], preempted[i]) for i in range(count)]
