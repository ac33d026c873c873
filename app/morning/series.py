"""A batch's server gauges over time, as the batch page plots them: per endpoint and summed.

Each endpoint's ``/metrics`` readings are a series of their own: its counters are its own,
so output tokens/s comes from the difference of two readings *of the same endpoint*. A batch
served by several endpoints (``NIGHTDESK_LLM_BASE_URL`` with a list) has their readings
interleaved in ``server_samples``; taken as one series they would subtract one server's
counter from another's. The batch's lines are built from the endpoints' own: running and
waiting requests and output tokens/s summed, KV usage the fullest endpoint's, each endpoint
holding its last reading until its next (as the plots draw a gauge). Rows older than the
endpoint column form one series, as they always did.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Engine, select

from app.db.models import ServerSample
from app.morning.serverview import counter_delta, per_endpoint


class Gauges(BaseModel):
    """Gauges over time, seconds from the batch's first reading: running and waiting
    requests and KV usage at each reading ``t``; output tokens/s ``tok_s`` from each time
    in ``tok_s_t`` to the endpoint's next reading."""

    t: list[float] = []
    running: list[float] = []
    waiting: list[float] = []
    kv: list[float] = []
    tok_s_t: list[float] = []
    tok_s: list[float] = []


class _Endpoint(BaseModel):
    endpoint: str | None  # its URL (None: rows from before the endpoint column)


# pydantic orders the fields of bases in reverse MRO: the endpoint first, then Gauges'.
class EndpointGauges(Gauges, _Endpoint):
    """One endpoint's own gauges (``Gauges``), after its URL."""


class SeriesView(Gauges):
    """The batch's gauges (summed over endpoints; KV the fullest) and each endpoint's, in
    the order they first reported (one entry when one endpoint served the batch)."""

    endpoints: list[EndpointGauges] = []


def _one(rows: Sequence[Any], t0: Any) -> Gauges:
    """Return one endpoint's gauges, seconds from ``t0``, and its tok/s between readings."""
    t = [(r.sampled_at - t0).total_seconds() for r in rows]
    rates, at = [], []
    for (ta, a), (tb, b) in itertools.pairwise(zip(t, rows, strict=True)):
        produced = counter_delta([a.generation_tokens_total, b.generation_tokens_total])
        if tb > ta and produced is not None:
            rates.append(produced / (tb - ta))
            at.append(ta)
    return Gauges(t=t, running=[r.running for r in rows], waiting=[r.waiting for r in rows],
                  kv=[r.kv_cache_usage for r in rows], tok_s_t=at, tok_s=rates)


def _last(t: list[float], at: float) -> int:
    """Return the index of the last reading at or before ``at`` (-1 before the first)."""
    return bisect.bisect_right(t, at) - 1


def _total(parts: list[Gauges]) -> Gauges:
    """Sum the endpoints' gauges on the union of their reading times (KV: the fullest)."""
    grid = sorted({x for p in parts for x in p.t})
    running, waiting, kv = [], [], []
    for at in grid:
        held = [(p, i) for p in parts if (i := _last(p.t, at)) >= 0]
        running.append(sum(p.running[i] for p, i in held))
        waiting.append(sum(p.waiting[i] for p, i in held))
        kv.append(max(p.kv[i] for p, i in held))
    # A rate holds from its reading to its endpoint's next one; after an endpoint's last
    # reading it adds nothing.
    ends = [[p.t[_last(p.t, a) + 1] for a in p.tok_s_t] for p in parts]
    edges = sorted({x for p, end in zip(parts, ends, strict=True)
                    for x in (*p.tok_s_t, *end)})
    tok_s_t = edges[:-1]
    tok_s = []
    for at in tok_s_t:
        rate = 0.0
        for p, end in zip(parts, ends, strict=True):
            i = _last(p.tok_s_t, at)
            if i >= 0 and at < end[i]:
                rate += p.tok_s[i]
        tok_s.append(rate)
    return Gauges(t=grid, running=running, waiting=waiting, kv=kv, tok_s_t=tok_s_t,
                  tok_s=tok_s)


def series_view(engine: Engine, batch_id: int) -> SeriesView:
    """Return the batch's gauges over time (summed over endpoints) and each endpoint's."""
    with engine.connect() as conn:
        rows = conn.execute(select(ServerSample).where(ServerSample.batch_id == batch_id)
                            .order_by(ServerSample.sampled_at, ServerSample.id)).all()
    if not rows:
        return SeriesView()
    t0 = rows[0].sampled_at
    parts = {e: _one(rs, t0) for e, rs in per_endpoint(rows).items()}
    total = next(iter(parts.values())) if len(parts) == 1 else _total(list(parts.values()))
    return SeriesView(**dict(total), endpoints=[EndpointGauges(endpoint=e, **dict(p))
                                                 for e, p in parts.items()])
