"""Account for a batch from its own rows: calls, tokens, batch-level throughput, node latencies."""

from __future__ import annotations

from dataclasses import asdict, field
from typing import Any

import numpy as np
from pydantic import BaseModel, computed_field
from pydantic.dataclasses import dataclass
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from app.db.batchsettings import BatchSettings, FallbackRecord
from app.db.models import Batch, LLMCall, TickerRun, batch_row, newest_first, nights_newest_first
from app.errors import NoNightYet
from app.morning.activity import active_time
from app.morning.numbers import counted
from app.morning.serverview import server_view
from app.morning.summary import IsoDatetime


@dataclass
class NodeLatency:
    node: str
    attempts: int  # the latencies are of its attempts, each HTTP request one
    mean_s: float
    p50_s: float
    p99_s: float


# Calls that ran under this long in all give no rate: it would divide by almost nothing.
RATE_MIN_S = 1.0


@dataclass
class BatchReport:
    """A batch's accounting. ``calls``: answered calls (a node of a sample of a ticker, as
    the ETA counts them); ``attempts``: HTTP requests (each a usage row: retries, and a
    node run again on resume, count again), ``failed_attempts`` those not answered."""

    batch_id: int
    calls: int
    attempts: int
    failed_attempts: int
    prompt_tokens: int
    completion_tokens: int
    first_call_start: IsoDatetime | None
    last_call_end: IsoDatetime | None
    wall_seconds: float  # the makespan: first call start to last call end
    output_tokens_per_s: float  # over the active time (``active_seconds``)
    nodes: list[NodeLatency] = field(default_factory=list)
    # Output of the tickers that succeeded, over the same active time: what the night
    # delivered (the figure above also counts the tokens of tickers that failed in the end).
    succeeded_completion_tokens: int = 0
    succeeded_output_tokens_per_s: float = 0.0
    # Adaptive admission's time without /metrics, as stored with the batch's settings.
    metrics_fallback: FallbackRecord | None = None
    active_seconds: float = 0.0  # the makespan less its pauses (``active_time``)
    paused_seconds: float = 0.0
    pauses: int = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def brief(self) -> bool:
        """Whether its calls ran under ``RATE_MIN_S`` in all: every face then gives its
        tokens and time, and no rate."""
        return self.active_seconds < RATE_MIN_S


def calls_said(report: BatchReport) -> str:
    """Say a batch's calls as the digest and the batch page do: ``17 calls (19 attempts,
    2 failed)``."""
    return (f"{counted(report.calls, 'call')} ({counted(report.attempts, 'attempt')}, "
            f"{report.failed_attempts} failed)")


def per_second(completion_tokens: int, active_seconds: float) -> float:
    """Batch-level: all output over the active time, never an average of per-call speeds."""
    return completion_tokens / active_seconds if active_seconds > 0 else 0.0


def throughput(engine: Engine, batch_id: int) -> BatchReport:
    """Return the batch's output tok/s over its active time (its makespan less the pauses),
    with those times: ``batch_report``'s figures, for the digest and /metrics."""
    return batch_report(engine, batch_id)


def latest_batch_id(engine: Engine) -> int:
    """Return the batch ``nightdesk report`` reads by default: this morning's night, in the
    one order of nights (``nights_newest_first``); with no night, the newest batch of any
    kind in that order (``newest_first``). NoNightYet when there is no batch at all."""
    with Session(engine) as session:
        found = session.scalars(nights_newest_first().with_only_columns(Batch.id)
                                .limit(1)).first()
        if found is None:
            found = session.scalars(select(Batch.id).order_by(*newest_first())
                                    .limit(1)).first()
    if found is None:
        raise NoNightYet("no batches recorded yet")
    return int(found)


def answered(rows: Any) -> int:
    """Return how many calls the usage rows answered: each (ticker, node, sample) once,
    however many attempts it took (``app.morning.eta`` counts them so)."""
    return len({(r.ticker, r.node, r.sample) for r in rows if r.status == "ok"})


def batch_report(engine: Engine, batch_id: int) -> BatchReport:
    """Build the report of one batch from its ``llm_calls`` rows."""
    settings = BatchSettings.read(batch_row(engine, batch_id).settings)
    fallback = settings.metrics_fallback
    with engine.connect() as conn:
        rows = conn.execute(
            select(LLMCall.node, LLMCall.ticker, LLMCall.sample, LLMCall.status,
                   LLMCall.prompt_tokens,
                   LLMCall.completion_tokens, LLMCall.started_at, LLMCall.ended_at,
                   LLMCall.latency_s).where(LLMCall.batch_id == batch_id)
        ).all()
        succeeded = set(conn.execute(select(TickerRun.ticker).where(
            TickerRun.batch_id == batch_id, TickerRun.status == "succeeded")).scalars())
    if not rows:
        return BatchReport(batch_id, 0, 0, 0, 0, 0, None, None, 0.0, 0.0,
                           metrics_fallback=fallback)
    first = min(r.started_at for r in rows)
    last = max(r.ended_at for r in rows)
    active = active_time([(r.started_at, r.ended_at) for r in rows],
                         settings.resumes)
    wall = active.makespan_s
    completion = sum(r.completion_tokens or 0 for r in rows)
    delivered = sum(r.completion_tokens or 0 for r in rows if r.ticker in succeeded)
    by_node: dict[str, list[float]] = {}
    for r in rows:
        by_node.setdefault(r.node, []).append(r.latency_s)
    nodes = [
        NodeLatency(node, len(lat), float(np.mean(lat)), float(np.percentile(lat, 50)),
                    float(np.percentile(lat, 99)))
        for node, lat in sorted(by_node.items())
    ]
    return BatchReport(
        batch_id=batch_id,
        calls=answered(rows),
        attempts=len(rows),
        failed_attempts=sum(1 for r in rows if r.status != "ok"),
        prompt_tokens=sum(r.prompt_tokens or 0 for r in rows),
        completion_tokens=completion,
        first_call_start=first,
        last_call_end=last,
        wall_seconds=wall,
        output_tokens_per_s=per_second(completion, active.active_s),
        nodes=nodes,
        metrics_fallback=fallback,
        succeeded_completion_tokens=delivered,
        succeeded_output_tokens_per_s=per_second(delivered, active.active_s),
        active_seconds=active.active_s,
        paused_seconds=active.paused_s,
        pauses=active.pauses,
    )


@dataclass
class EndpointShare:
    """One endpoint's part of a batch: its calls, its output, and what its server reported."""

    endpoint: str | None  # None: rows from before usage rows named their endpoint
    calls: int  # answered here (``BatchReport``'s words)
    attempts: int
    failed_attempts: int
    completion_tokens: int
    # Its output over the batch's active time, so the endpoints' figures add up to the batch's.
    output_tokens_per_s: float
    tickers: int  # tickers with an answered call here (a moved ticker counts at both)
    kv_usage_max: float | None
    preemptions: float | None
    running_mean: float | None
    samples: int


def endpoint_shares(engine: Engine, batch_id: int) -> list[EndpointShare]:
    """Split a batch by the endpoint each call went to, in the order they first served."""
    report = batch_report(engine, batch_id)
    with engine.connect() as conn:
        rows = conn.execute(
            select(LLMCall.endpoint, LLMCall.status, LLMCall.completion_tokens, LLMCall.ticker,
                   LLMCall.node, LLMCall.sample, LLMCall.started_at)
            .where(LLMCall.batch_id == batch_id)
            .order_by(LLMCall.started_at)).all()
    order: dict[str | None, list[Any]] = {}
    for r in rows:
        order.setdefault(r.endpoint, []).append(r)
    shares = []
    for endpoint, calls in order.items():
        view = server_view(engine, batch_id, endpoint) if endpoint is not None else None
        completion = sum(r.completion_tokens or 0 for r in calls)
        shares.append(EndpointShare(
            endpoint=endpoint, calls=answered(calls), attempts=len(calls),
            failed_attempts=sum(1 for r in calls if r.status != "ok"),
            completion_tokens=completion,
            output_tokens_per_s=per_second(completion, report.active_seconds),
            tickers=len({r.ticker for r in calls if r.status == "ok"}),
            kv_usage_max=view.kv_usage_max if view else None,
            preemptions=view.preemptions if view else None,
            running_mean=view.running_mean if view else None,
            samples=view.samples if view else 0))
    return shares


# The columns of arms side by side (`nightdesk report --compare`, the bench, the compare page):
# (header, field of ``Arm``, format spec; "s" and "d" print as they are).
COMPARE_COLUMNS = (
    ("batch", "batch_id", "d"), ("label", "label", "s"), ("span s", "makespan_s", ".1f"),
    ("output tok/s", "output_tokens_per_s", ".1f"),
    # Output of the tickers that succeeded (the figure before counts failed tickers' too).
    ("ok tok/s", "succeeded_output_tokens_per_s", ".1f"),
    ("prefill tok/s", "prefill_tokens_per_s", ".0f"),
    ("decode tok/s", "decode_tokens_per_s", ".1f"),
    ("prefix hit", "prefix_cache_hit_rate", ".1%"),
    ("prefill done", "prefill_tokens_computed", ".0f"),
    ("run mean", "running_mean", ".1f"), ("run max", "running_max", ".0f"),
    ("wait max", "waiting_max", ".0f"), ("KV max", "kv_usage_max", ".0%"),
    # Time to first token from sending (the server's queue and prefill), and from the
    # graph's issue of the call (our own gate's wait too): only the second is fair.
    ("preempt", "preemptions", ".0f"), ("TTFT s", "mean_ttft_s", ".2f"),
    ("TTFT rdy s", "ttft_ready_mean_s", ".2f"),
    ("decode share", "decode_time_share", ".0%"),
)


class Arm(BaseModel):
    """One arm of a comparison (``nightdesk report --compare``, ``/api/batches/compare``)."""

    batch_id: int
    kind: str
    label: str | None
    demo: bool  # ran on the seeded synthetic snapshot (every face of such a night says so)
    calls: int  # answered; attempts: HTTP requests (``BatchReport``'s words)
    attempts: int
    failed_attempts: int
    makespan_s: float
    output_tokens_per_s: float
    succeeded_output_tokens_per_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    prompt_tokens: int
    completion_tokens: int
    prefill_tokens_computed: float | None
    prefix_cache_hit_rate: float | None
    # Above 1.05 the two figures above are None: the server's lookups repeat (ServerView).
    prefix_lookups_per_prompt_token: float | None
    running_mean: float | None
    running_max: float | None
    waiting_max: float | None
    kv_usage_max: float | None
    preemptions: float | None
    mean_ttft_s: float | None
    ttft_ready_mean_s: float | None
    ttft_ready_p90_s: float | None
    decode_time_share: float | None
    # Each endpoint's part, when several served the arm (else its one endpoint is it).
    endpoints: list[EndpointShare]


def compare_arm(engine: Engine, batch_id: int) -> Arm:
    """Return one arm of a comparison: throughput split, concurrency, KV, makespan."""
    calls = batch_report(engine, batch_id)
    view = server_view(engine, batch_id)
    with engine.connect() as conn:
        kind, label, settings = conn.execute(select(Batch.kind, Batch.label, Batch.settings)
                                             .where(Batch.id == batch_id)).one()
    span = calls.wall_seconds
    prefill = view.prefill_tokens_computed if view.prefill_tokens_computed is not None \
        else calls.prompt_tokens
    # The server's figures and the report's, by name; where both have one (prompt_tokens),
    # the report's: our own rows.
    named = {**asdict(view), **asdict(calls)}
    return Arm.model_validate({
        **{key: named[key] for key in Arm.model_fields if key in named},
        "kind": kind, "label": label, "demo": BatchSettings.read(settings).demo_data,
        "makespan_s": span,
        "prefill_tokens_per_s": prefill / span if span else 0.0,
        "decode_tokens_per_s": calls.completion_tokens / span if span else 0.0,
        "endpoints": endpoint_shares(engine, batch_id)})
