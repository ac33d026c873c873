"""Summarize what the server itself reported during a batch, from its ``server_samples``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic.dataclasses import dataclass
from sqlalchemy import Engine, select

from app.db.batchsettings import BatchSettings
from app.db.models import Batch, LLMCall, ServerSample
from app.errors import InputError
from app.traffic.budget import TokenBudget
from app.traffic.strategy import Strategy
from serving.facts import command_flag

KV_HIGH: float = TokenBudget.kv_high
"""KV usage from which a reading counts as cache-bound: the token budget's default."""
BOUND_NAMES = {
    "kv": "the KV cache",
    "server": "the server's own slots (requests waited there)",
    "client": "the client's request cap",
    "graph": "too few ready calls",
    "client_or_graph": "the client's cap or too few ready calls (the cap was not recorded)",
}


def counter_delta(values: Sequence[float | None]) -> float | None:
    """Return a counter's increase over the readings, surviving a reset to zero.

    A reading below the previous one means the server restarted; what it counted since
    the restart is its new value.
    """
    seen = [v for v in values if v is not None]
    if len(seen) < 2:
        return None
    total = 0.0
    for before, after in itertools.pairwise(seen):
        total += after - before if after >= before else after
    return total


@dataclass
class ServerView:
    samples: int
    running_mean: float | None = None
    running_p50: float | None = None
    running_max: float | None = None
    waiting_mean: float | None = None
    waiting_max: float | None = None
    kv_usage_max: float | None = None
    preemptions: float | None = None
    prompt_tokens: float | None = None  # the server's own count of prompt tokens over the batch
    generation_tokens: float | None = None
    prefix_cache_hit_rate: float | None = None
    prefill_tokens_computed: float | None = None  # prompt tokens not served from the cache
    # The server's prefix-cache lookups per prompt token. vLLM looks a waiting request up
    # again at every scheduler step while the cache is too full to admit it, so past
    # LOOKUPS_SLACK the hit counters count repeats: the two figures above are then None.
    prefix_lookups_per_prompt_token: float | None = None
    spec_acceptance: float | None = None  # accepted ÷ drafted speculative tokens, when present
    # Request-seconds, summed over requests that finished in the batch: overlapping requests
    # add up, so these exceed the wall time; only their ratio is a split of the time.
    prefill_time_s: float | None = None
    decode_time_s: float | None = None
    decode_time_share: float | None = None  # decode ÷ (prefill + decode)
    mean_ttft_s: float | None = None  # from our own rows: first token − request sent
    # First token − the moment the graph issued the call (answered calls only): waits at
    # our own gate count as the server's queue does, so strategies compare fairly.
    ttft_ready_mean_s: float | None = None
    ttft_ready_p90_s: float | None = None
    # What held the batch back, reading by reading (see ``bounds``); the cap it was held to.
    bound: str | None = None
    bound_shares: dict[str, float] | None = None
    request_cap: int | None = None
    # How late the client's own event loop ran between readings (None: not measured): at
    # worst, and how many readings saw it over a second (their gauges were that stale).
    client_lag_max_s: float | None = None
    client_lag_readings_over_1s: int | None = None
    # The server's --stream-interval, from the command line the batch recorded (vLLM's 1
    # when it has none); None: no command line recorded (a server elsewhere, a router).
    stream_interval: int | None = None


# Lookups a batch may make per prompt token before its hit counters are repeats: a little
# over one, for prompts the server tokenizes a few tokens longer than it counts them.
LOOKUPS_SLACK = 1.05

UNRECORDED = -1
"""``request_cap`` for a capped client whose cap the batch did not record."""


def request_cap(settings: BatchSettings) -> int | None:
    """Return the most requests the batch's client let be in flight per endpoint.

    ``adaptive`` grows to its ``maximum`` knob, else ``max_concurrency`` (recorded with the
    batch's settings since 2026-12-01; UNRECORDED for older batches, and for knobs this
    version no longer reads, such as ``budget=off``); ``sequential`` holds one. None: no cap
    on requests — ``fixed-N`` and ``fixed-all`` cap tickers, not requests, and a bench's
    ``flood`` sends every call at once.
    """
    name = settings.strategy or "adaptive"
    try:
        strategy = Strategy.parse(name)
    except InputError:
        # Adaptive with a removed knob: capped, by what is unknown. Else flood, a bench arm.
        return UNRECORDED if name.startswith("adaptive:") else None
    if not strategy.adaptive:
        return strategy.request_limit
    knob = dict(strategy.policy).get("maximum")
    if knob is not None:
        return int(knob)
    return UNRECORDED if settings.max_concurrency is None else settings.max_concurrency


def near(cap: int) -> int:
    """Return the running count that counts as "at the cap": within 5% of it, one at least.

    Under a cap a finished call's successor is often still on its way (a reading at 62 or 63
    under 64 is the cap holding, not the graph); a cap under 4 must be met exactly.
    """
    return cap if cap < 4 else cap - max(1, round(0.05 * cap))


def bounds(rows: Sequence[Any], cap: int | None) -> dict[str, float]:
    """Share of the busy readings held by each bound, checked in this order.

    ``kv``: the cache at ``KV_HIGH`` or more, or a preemption since the last reading;
    ``server``: requests waiting at the server (its ``--max-num-seqs`` or its scheduler);
    ``client``: running at the client's cap (within 5%, see ``near``) with room left at the
    server; ``graph``: none of those — fewer calls were ready than the server could have
    taken (``client_or_graph`` when the cap is UNRECORDED). Readings with nothing running
    or waiting are left out; an empty dict when no reading was busy.
    """
    counts = dict.fromkeys(("kv", "server", "client", "graph")
                           if cap != UNRECORDED else ("kv", "server", "client_or_graph"), 0)
    busy = 0
    previous: float | None = None
    for r in rows:
        preempted = previous is not None and r.preemptions_total > previous
        previous = r.preemptions_total
        if r.running + r.waiting <= 0:
            continue
        busy += 1
        if r.kv_cache_usage >= KV_HIGH or preempted:
            counts["kv"] += 1
        elif r.waiting > 0:
            counts["server"] += 1
        elif cap == UNRECORDED:
            counts["client_or_graph"] += 1
        elif cap is not None and r.running >= near(cap):
            counts["client"] += 1
        else:
            counts["graph"] += 1
    return {k: v / busy for k, v in counts.items()} if busy else {}


def per_endpoint(rows: Sequence[Any]) -> dict[str | None, list[Any]]:
    """Split ``server_samples`` rows into each endpoint's series, in the order they came.

    Each endpoint's readings are one series (its own counters and resets); rows older than
    the endpoint column are one series (key None), as they always were.
    """
    series: dict[str | None, list[Any]] = {}
    for r in rows:
        series.setdefault(r.endpoint, []).append(r)
    return series


def _ttfts(timed: Sequence[Any]) -> tuple[float | None, float | None, float | None]:
    """Return the calls' mean time to first token from sending, and from the graph's issue
    (answered calls only): its mean and 90th percentile."""
    sent = [(r.first_token_at - r.started_at).total_seconds() for r in timed]
    ready = [(r.first_token_at - r.ready_at).total_seconds() for r in timed
             if r.ready_at is not None and r.status == "ok"]
    return (float(np.mean(sent)) if sent else None, float(np.mean(ready)) if ready else None,
            float(np.percentile(ready, 90)) if ready else None)


def server_view(engine: Engine, batch_id: int, endpoint: str | None = None) -> ServerView:
    """Compute realized concurrency, queueing, KV, preemptions and cache figures of a batch.

    With ``endpoint``, of that endpoint's samples and calls only. A batch served by several
    endpoints adds theirs up: counters are each endpoint's increase, summed; running and
    waiting are the sums of each endpoint's mean and of each one's peak (peaks at different
    moments, so an upper bound of the joint peak; no joint median); KV is the highest.
    """
    samples = select(ServerSample).where(ServerSample.batch_id == batch_id)
    calls = select(LLMCall.started_at, LLMCall.first_token_at, LLMCall.ready_at,
                   LLMCall.status).where(
        LLMCall.batch_id == batch_id, LLMCall.first_token_at.is_not(None))
    if endpoint is not None:
        samples = samples.where(ServerSample.endpoint == endpoint)
        calls = calls.where(LLMCall.endpoint == endpoint)
    with engine.connect() as conn:
        settings, facts = conn.execute(select(Batch.settings, Batch.server_facts)
                                       .where(Batch.id == batch_id)).one_or_none() or (None, None)
        rows = conn.execute(samples.order_by(ServerSample.sampled_at)).all()
        timed = conn.execute(calls).all()
    mean_ttft, ready_mean, ready_p90 = _ttfts(timed)
    command = (facts or {}).get("command")
    flag = command_flag(command, "stream-interval") or "1"
    interval = int(flag) if command and flag.isdigit() else None
    if not rows:
        return ServerView(0, mean_ttft_s=mean_ttft, ttft_ready_mean_s=ready_mean,
                          ttft_ready_p90_s=ready_p90)
    series = per_endpoint(rows)
    several = len(series) > 1
    running = np.array([r.running for r in rows])
    waiting = np.array([r.waiting for r in rows])
    cap = request_cap(BatchSettings.read(settings))
    # The cap is per endpoint: judge each endpoint's readings alone, then pool the shares.
    shares: dict[str, float] = {}
    for one in series.values():
        for name, share in bounds(one, cap).items():
            shares[name] = shares.get(name, 0.0) + share * len(one) / len(rows)

    def delta(name: str) -> float | None:
        parts = [counter_delta([getattr(r, name) for r in one]) for one in series.values()]
        seen = [p for p in parts if p is not None]
        return sum(seen) if seen else None

    def gauge(name: str, stat: Any) -> float:
        if several:
            return float(sum(stat(np.array([getattr(r, name) for r in one]))
                             for one in series.values()))
        return float(stat(running if name == "running" else waiting))

    queries, hits = delta("prefix_cache_queries_total"), delta("prefix_cache_hits_total")
    prompt = delta("prompt_tokens_total")
    lookups = queries / prompt if queries is not None and prompt else None
    if lookups is not None and lookups > LOOKUPS_SLACK:
        hits = None  # counted again for every step a request waited: not a share of prompts
    drafted, accepted = delta("spec_draft_tokens_total"), delta("spec_accepted_tokens_total")
    prefill_s, decode_s = delta("prefill_time_s_total"), delta("decode_time_s_total")
    request_s = prefill_s + decode_s if prefill_s is not None and decode_s is not None else None
    lags = [r.client_lag_s for r in rows if r.client_lag_s is not None]
    return ServerView(
        samples=len(rows),
        running_mean=gauge("running", np.mean),
        running_p50=None if several else float(np.percentile(running, 50)),
        running_max=gauge("running", np.max),
        waiting_mean=gauge("waiting", np.mean),
        waiting_max=gauge("waiting", np.max),
        kv_usage_max=float(max(r.kv_cache_usage for r in rows)),
        preemptions=delta("preemptions_total"),
        prompt_tokens=prompt,
        generation_tokens=delta("generation_tokens_total"),
        prefix_cache_hit_rate=(hits / queries) if queries and hits is not None else None,
        prefill_tokens_computed=(prompt - hits) if prompt is not None and hits is not None
        else None,
        prefix_lookups_per_prompt_token=lookups,
        spec_acceptance=(accepted / drafted) if drafted and accepted is not None else None,
        prefill_time_s=prefill_s,
        decode_time_s=decode_s,
        decode_time_share=(decode_s / request_s) if request_s and decode_s is not None
        else None,
        mean_ttft_s=mean_ttft,
        ttft_ready_mean_s=ready_mean,
        ttft_ready_p90_s=ready_p90,
        bound=max(shares, key=lambda k: shares[k]) if shares else None,
        bound_shares=shares or None,
        client_lag_max_s=max(lags) if lags else None,
        client_lag_readings_over_1s=sum(lag > 1.0 for lag in lags) if lags else None,
        request_cap=cap,
        stream_interval=interval,
    )
