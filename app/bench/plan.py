"""How many GPUs a night needs: the graph bound (app/bench/bound.py) per endpoint count,
and what nightdesk's adaptive admission adds to it.

A night's shape is what its tickers ask of the server (a ``GraphFacts`` per ticker: output,
KV-token-steps, the longest chain); a server model is one endpoint's KV cache, sequence cap
and step cost. For each fleet of 1..16 such endpoints ``bound_s`` is the least time any
graph-respecting schedule needs, and ``makespan_s`` the bound of the busiest endpoint (its
whole tickers) on the cache admission lets be filled (``kv_high`` of it) plus the start
ramp of its request limit (``ramp_s``). Prefill's own work and the client's per-call
overheads are in neither; the fleet simulation measures what is left
(docs/lab/2026-12-05-plan-model.md).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, time, timedelta
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Engine, func, select

from app.bench.bound import (
    Bound,
    GraphFacts,
    StepCost,
    arm_graph_facts,
    bound_interval,
    decode_levels,
    fit_step,
    graph_bound,
    graph_facts,
    summed_capacity,
)
from app.bench.workloads import seed_graph
from app.db.batchsettings import BatchSettings
from app.db.models import LLMCall, ServerSample, TickerRun, batch_row
from app.errors import InputError
from app.runs.replay import WorkItem, recorded_workload
from app.traffic.admission import AdmissionPolicy
from app.traffic.budget import TokenBudget

ENDPOINTS = range(1, 17)
# `plan --format json|csv`'s schema (app/cli/common.py ``echo_json``): raised when a field is
# renamed, removed or changes meaning. Output without it is older (docs/operations.md).
SCHEMA = "plan/1"
NEAR_BEST = 0.05  # a fleet within this share of the best makespan is "as good"


class ServerModel(BaseModel, frozen=True):
    """One endpoint as the bound sees it: KV cache, sequence cap and ``a + b × running``."""

    name: str
    kv_tokens: int
    max_num_seqs: int
    step_a_s: float
    step_b_s: float
    source: str
    max_model_len: int | None = None  # None: not recorded
    model: str | None = None  # the model name it served (None: not recorded)

    @property
    def step(self) -> StepCost:
        return StepCost(self.step_a_s, self.step_b_s)


# The H200 of the 100-ticker MoE night (docs/performance.md): its KV cache and --max-num-seqs
# as vLLM reported them, and a step fitted to that night's readings. The simulated fleet's
# endpoints (tests/fakevllm/stepped.py) are this model.
H200_MOE = ServerModel(
    name="h200-moe", kv_tokens=1_488_240, max_num_seqs=256, step_a_s=0.020, step_b_s=0.0002,
    max_model_len=34_816,  # serving/profiles/qwen-moe-35b-a3b-h200.toml
    model="qwen-moe-35b-a3b",  # its served_model_name
    source="one H200 serving the MoE profile: 1,488,240 KV tokens, 256 sequences, a step of "
           "20 ms + 0.2 ms per running request (the 100-ticker MoE night's readings)")
PROFILES = {H200_MOE.name: H200_MOE}


class NightShape(BaseModel, frozen=True):
    """What one ticker of a night asks of the server, on average, and its longest chain."""

    name: str
    tickers_seen: int  # tickers the figures are the mean of (1: the synthetic shape)
    output_tokens: float
    kv_token_steps: float
    critical_path_tokens: int  # the longest of any ticker seen
    calls: float
    longest_request_tokens: int = 0  # prompt + output of its largest call (0: not known)
    # The model name its night asked for, whose tokenizer counted its tokens (None: not
    # recorded, or the synthetic shape, of no one model).
    model: str | None = None

    def for_tickers(self, tickers: int) -> GraphFacts:
        """Return the graph facts of a night of ``tickers`` tickers of this shape."""
        return GraphFacts(output_tokens=round(self.output_tokens * tickers),
                          kv_token_steps=self.kv_token_steps * tickers,
                          critical_path_tokens=self.critical_path_tokens,
                          calls=round(self.calls * tickers))


def mean_shape(name: str, graph: GraphFacts, tickers: int, longest: int = 0,
               model: str | None = None) -> NightShape:
    """Return the mean ticker of ``tickers`` whose demand together is ``graph``, its largest
    call ``longest`` tokens (prompt + output; 0: not known), counted by ``model``."""
    return NightShape(name=name, tickers_seen=tickers,
                      output_tokens=graph.output_tokens / tickers,
                      kv_token_steps=graph.kv_token_steps / tickers,
                      critical_path_tokens=graph.critical_path_tokens,
                      calls=graph.calls / tickers, longest_request_tokens=longest, model=model)


def synthetic_shape(output_scale: float = 1.0) -> NightShape:
    """Return the production shape (app/bench/workloads.py: the seeds' 17 nodes), prompts as
    counted at scale 1 and outputs at ``output_scale``, as the fleet simulation counts them."""
    graph = seed_graph()
    items = [WorkItem("SYN", 0, shape.node, {}, deps) for shape, deps in graph]
    calls = [("SYN", 0, shape.node, shape.prompt, max(1, round(shape.output * output_scale)))
             for shape, _ in graph]
    name = "synthetic" if output_scale == 1.0 else f"synthetic (outputs x{output_scale:g})"
    return mean_shape(name, graph_facts(calls, {"SYN": items}), 1,
                      max(prompt + output for *_, prompt, output in calls))


def recorded_shape(engine: Engine, batch_id: int) -> NightShape:
    """Return the mean ticker of a recorded night that ended: its succeeded tickers' answered
    calls (its requests' order gives the chains, so the night must have recorded its
    requests). A ticker that failed made only part of its graph: counted, it would shrink
    the mean ticker. InputError for a night still running or with no ticker succeeded."""
    batch, workload = recorded_workload(engine, batch_id)
    if batch.status in ("queued", "running"):
        raise InputError(f"batch {batch_id} is still running: its tickers' shape is known "
                         "once it ends; plan from a night that ended")
    with engine.connect() as conn:
        runs = dict(conn.execute(select(TickerRun.ticker, TickerRun.status)
                                 .where(TickerRun.batch_id == batch_id)).tuples().all())
    name = f"batch {batch_id}"
    if not batch.tickers_succeeded:
        raise InputError(f"batch {batch_id} ({batch.status}): no ticker succeeded, so no "
                         "whole ticker to take a shape from")
    if runs:  # without ticker runs (rows written by hand) every ticker counts, as it stands
        whole = {t: items for t, items in workload.items() if runs.get(t) == "succeeded"}
        if not whole:
            raise InputError(f"batch {batch_id} ({batch.status}): no ticker run succeeded, "
                             "so no whole ticker to take a shape from")
        if len(whole) < len(workload):
            name += f" (its {len(whole)} succeeded ticker{'s' if len(whole) > 1 else ''})"
        workload = whole
    graph = arm_graph_facts(engine, batch_id, workload)
    if graph.output_tokens <= 0:
        raise InputError(f"batch {batch_id} has no answered calls to take a shape from")
    with engine.connect() as conn:  # per ticker, so no list of tickers goes to the database
        largest = conn.execute(
            select(LLMCall.ticker, func.max(func.coalesce(LLMCall.prompt_tokens, 0)
                                            + func.coalesce(LLMCall.completion_tokens, 0)))
            .where(LLMCall.batch_id == batch_id, LLMCall.status == "ok")
            .group_by(LLMCall.ticker)).tuples().all()
    longest = max((int(tokens or 0) for ticker, tokens in largest if ticker in workload),
                  default=0)
    return mean_shape(name, graph, len(workload), longest,
                      BatchSettings.read(batch.settings).model)


def night_server(engine: Engine, batch_id: int) -> ServerModel:
    """Return the server model of a recorded night: its KV cache and sequence cap as its
    server facts recorded them, and a step fitted to its own ``/metrics`` readings."""
    batch = batch_row(engine, batch_id)
    recorded = batch.server_facts or {}
    behind = recorded.get("servers_behind_router")
    if isinstance(behind, int) and behind > 1:
        # Its readings are the servers' summed: a step fitted to them is no one server's.
        raise InputError(f"batch {batch_id} ran behind a router of {behind} servers, whose "
                         "readings are summed: no one server's step to fit")
    with engine.connect() as conn:
        most = conn.execute(select(ServerSample.running)
                            .where(ServerSample.batch_id == batch_id)
                            .order_by(ServerSample.running.desc()).limit(1)).scalar()
    kv, seqs, length = (_count(recorded, key, batch_id)
                        for key in ("kv_cache_tokens", "max_num_seqs", "max_model_len"))
    if not kv:
        raise InputError(f"batch {batch_id} recorded no KV cache size (its server facts have "
                         "none)")
    step = fit_step(decode_levels(engine, batch_id))
    if step is None:
        raise InputError(f"batch {batch_id} has no /metrics readings of decoding to fit a step "
                         "to")
    where = ("--max-num-seqs from its server facts" if seqs
             else "the most requests it ran at once")
    cap = seqs or most
    if not cap:
        raise InputError(f"batch {batch_id} recorded no --max-num-seqs and ran no request")
    return ServerModel(name=f"batch {batch_id}", kv_tokens=kv, max_num_seqs=int(cap),
                       step_a_s=step.a, step_b_s=step.b, max_model_len=length,
                       model=BatchSettings.read(batch.settings).model,
                       source=f"batch {batch_id}'s server: KV tokens from its server facts, "
                              f"{where}, step fitted to {step.levels} levels of its readings")


def _count(recorded: dict[str, Any], key: str, batch_id: int) -> int | None:
    """Return a server fact that is a count (None: not recorded); InputError for one that is
    no positive whole number (text, 0, -5), which would fail or mislead the model."""
    value = recorded.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # a startup log's "49152.0 tokens" is a count
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"batch {batch_id}'s server facts record {key} as {value!r}, not a "
                         "positive whole number")
    return value


class Admission(BaseModel, frozen=True):
    """What adaptive admission lets an endpoint use: the KV usage it stops admitting at (the
    token budget's ``kv_high``), and its request limit's start (``initial``, doubled at each
    reading after the first, every ``reading_s``)."""

    kv_share: float = TokenBudget.kv_high
    initial_requests: int = AdmissionPolicy.initial
    reading_s: float

    def ramp_s(self, running: float) -> float:
        """Return the seconds of ``running`` requests lost while the limit climbs to it."""
        lost, limit = 0.0, float(self.initial_requests)
        while 0 < limit < running:
            lost += self.reading_s * (1 - limit / running)
            limit *= 2
        return lost


class PlanRow(BaseModel, frozen=True):
    """One fleet size: the planned makespan, the graph bound under it and what set each, and
    how much of the fleet the bound uses."""

    endpoints: int
    # The tickers the busiest endpoint holds, ceil(tickers / endpoints): routing sends a
    # ticker's whole chain to one endpoint and spreads them evenly; makespan_s is its night.
    busiest_tickers: int
    makespan_s: float  # the bound at the admitted cache share, plus the start ramp
    bound_s: float  # the graph bound: no schedule that respects the graph beats it
    ramp_s: float
    bound_output_tok_s: float  # the output rate of bound_s (the bound's), not of makespan_s
    binding: str  # of makespan_s: max_num_seqs | kv_cache | critical_path
    summed_capacity_tok_s: float
    share_of_summed_capacity: float
    within_5pct_of_best: bool
    by_deadline: bool | None = None  # planned to finish by --deadline (None: none given)


class DeadlineAnswer(BaseModel, frozen=True):
    """How many endpoints finish between the night's start and a deadline (None: none do),
    and whether the deadline lies past the start after it (a night running to it would
    overlap the next one)."""

    start: datetime
    deadline: datetime
    seconds: float
    endpoints: int | None
    next_start: datetime | None = None  # the schedule's start after ``start`` (None: none)
    overlaps_next_night: bool = False


class FleetPlan(BaseModel, frozen=True):
    """``nightdesk plan``: per endpoint count, the least time a night of this shape needs."""

    tickers: int
    shape: NightShape
    profile: ServerModel
    admission: Admission
    rows: list[PlanRow]
    best_makespan_s: float
    smallest_within_5pct: int  # of the best of 1..16
    # A ticker an endpoint: no fleet finishes sooner; and the fewest endpoints within 5% of it
    # (more than 16 where the table's best is still more than 5% over it).
    floor_s: float
    smallest_within_5pct_of_floor: int
    deadline: DeadlineAnswer | None = None
    # Set where the shape's night asked another model than the endpoint serves: its token
    # counts are another tokenizer's and its outputs another model's (``model_mismatch``).
    model_mismatch: str | None = None

    def json_facts(self) -> dict[str, Any]:
        """Return the JSON, with no deadline as one of empty fields: the CSV of a plan with
        and without one has the same columns (``app.cli.common.csv_of``)."""
        data = {"schema": SCHEMA, **self.model_dump(mode="json")}
        if self.deadline is None:
            data["deadline"] = dict.fromkeys(DeadlineAnswer.model_fields)
        return data


def plan_fleet(tickers: int, shape: NightShape, server: ServerModel,
               admission: Admission) -> FleetPlan:
    """Work out the planned makespan, the bound and its capacity share for 1..16 endpoints."""
    if tickers < 1:
        raise InputError(f"--tickers takes a whole number of at least 1 (got {tickers})")
    # The bound counts tokens, not whether a call fits: a shape whose largest call no
    # endpoint can hold would be planned a makespan for a night that cannot run there.
    for limit, what in ((server.max_model_len, "--max-model-len"),
                        (server.kv_tokens, "KV cache")):
        if limit and shape.longest_request_tokens > limit:
            raise InputError(
                f"{shape.name}'s largest call ({shape.longest_request_tokens:,} tokens, prompt "
                f"and output) does not fit {server.name}'s {what} ({limit:,} tokens): no "
                "night of this shape runs there")
    graph = shape.for_tickers(tickers)
    admitted_kv = int(server.kv_tokens * admission.kv_share)

    def busiest(held: int) -> tuple[Bound, float]:
        """The bound of an endpoint holding ``held`` whole tickers at the admitted cache, and
        the ramp to the requests it keeps running on average."""
        one = graph_bound(shape.for_tickers(held), admitted_kv, server.max_num_seqs,
                          server.step)
        if one is None:
            raise InputError(f"{shape.name} asks for no output: nothing to plan")
        return one, admission.ramp_s(one.graph.output_tokens / one.steps)

    rows = []
    for endpoints in ENDPOINTS:
        bound = graph_bound(graph, server.kv_tokens, server.max_num_seqs, server.step, endpoints)
        # A ticker's whole chain goes to one endpoint (docs/architecture.md, "Several
        # endpoints"): the busiest holds ceil(tickers / endpoints), and the night ends with it.
        on_busiest = -(-tickers // endpoints)
        admitted, ramp = busiest(on_busiest)
        if bound is None:
            raise InputError(f"{shape.name} asks for no output: nothing to plan")
        summed, _ = summed_capacity(graph, server.kv_tokens, server.max_num_seqs, server.step,
                                    endpoints)
        rows.append(PlanRow(endpoints=endpoints, busiest_tickers=on_busiest,
                            makespan_s=admitted.seconds + ramp,
                            bound_s=bound.seconds, ramp_s=ramp, bound_output_tok_s=bound.tok_s,
                            binding=admitted.binding, summed_capacity_tok_s=summed,
                            share_of_summed_capacity=bound.tok_s / summed if summed else 0.0,
                            within_5pct_of_best=False))
    best = min(r.makespan_s for r in rows)
    rows = [r.model_copy(update={"within_5pct_of_best": r.makespan_s <= (1 + NEAR_BEST) * best})
            for r in rows]
    smallest = min(r.endpoints for r in rows if r.within_5pct_of_best)
    # Past the table: a ticker an endpoint is the least any fleet gets. The most tickers an
    # endpoint may hold and stay within 5% of it, found by halving (more held, longer).
    one, ramp = busiest(1)
    floor = one.seconds + ramp
    held, over = 1, tickers + 1
    while held + 1 < over:
        middle = (held + over) // 2
        one, ramp = busiest(middle)
        held, over = (middle, over) if one.seconds + ramp <= (1 + NEAR_BEST) * floor else (
            held, middle)
    return FleetPlan(tickers=tickers, shape=shape, profile=server, admission=admission,
                     rows=rows, best_makespan_s=best, smallest_within_5pct=smallest,
                     floor_s=floor, smallest_within_5pct_of_floor=-(-tickers // held),
                     model_mismatch=model_mismatch(shape, server))


def model_mismatch(shape: NightShape, server: ServerModel) -> str | None:
    """Return why a plan of this shape on this endpoint is of two models, where the shape's
    night asked for another model than the endpoint serves; None where they agree or either
    is not known. Planned all the same: a new model's fleet is first planned from the old
    one's nights, and the operator is told the figures are of both."""
    if shape.model is None or server.model is None or shape.model == server.model:
        return None
    return (f"{shape.name} ran {shape.model!r}, {server.name} serves {server.model!r}: its "
            "token counts are another tokenizer's and its output lengths another model's")


def parse_clock(text: str, what: str = "--deadline") -> time:
    """Read ``HH:MM`` (24-hour); InputError naming ``what`` for anything else."""
    try:
        # Exactly two ASCII digits each side: int() would also take "+6", " 6" or "٠٦".
        if not re.fullmatch(r"[0-9]{2}:[0-9]{2}", text.strip()):
            raise ValueError(text)
        hours, minutes = text.strip().split(":")
        return time(int(hours), int(minutes))
    except ValueError:
        raise InputError(f"{what} takes a 24-hour time HH:MM, like 06:30 (got {text!r})") \
            from None


def answer_deadline(plan: FleetPlan, start: datetime, clock: time,
                    next_start: datetime | None = None) -> DeadlineAnswer:
    """Return the fewest endpoints whose planned makespan finishes by the first ``clock``
    after ``start`` (``start``'s zone), the seconds between them as elapsed (a clock change
    in the night counts); as a bound, a night needs at least these, maybe more. A deadline
    later than ``next_start`` (the schedule's start after ``start``) overlaps that night."""
    deadline = start.replace(hour=clock.hour, minute=clock.minute, second=0, microsecond=0)
    if deadline <= start:
        deadline += timedelta(days=1)  # on the wall clock: the same time, the next day
    # Aware datetimes of one zone subtract as wall times, blind to a clock change: in UTC.
    seconds = (deadline.astimezone(UTC) - start.astimezone(UTC)).total_seconds()
    fits = [r.endpoints for r in plan.rows if r.makespan_s <= seconds]
    return DeadlineAnswer(start=start, deadline=deadline, seconds=seconds,
                          endpoints=min(fits) if fits else None, next_start=next_start,
                          overlaps_next_night=next_start is not None and deadline > next_start)


class NightBound(BaseModel, frozen=True):
    """A recorded night against its own graph bound: its makespan ÷ the least any schedule
    that respects the graph could have taken on its server (None: not computable, and why;
    ``unavailable`` set beside figures: the model's figure is no bound for this night)."""

    makespan_s: float  # the time its calls ran: pauses (a crash, then a resume) left out
    paused_s: float = 0.0
    pauses: int = 0
    bound_s: float | None = None
    makespan_over_bound: float | None = None
    # Its 90% interval: the step refitted to the night's reading levels resampled (None:
    # fewer than MIN_INTERVAL_LEVELS levels to resample).
    makespan_over_bound_90: list[float] | None = None
    binding: str | None = None
    endpoints: int | None = None
    server: str | None = None  # where the step, KV cache and sequence cap came from
    unavailable: str | None = None
    scope: str | None = None  # set when the bound is of less than the whole night's tickers


def night_bound(engine: Engine, batch_id: int, makespan_s: float, *, paused_s: float = 0.0,
                pauses: int = 0) -> NightBound:
    """Return a night's makespan over its graph bound: its answered calls' graph (its
    recorded requests give the chains) on its own server model (``night_server``).
    ``makespan_s`` is the time its calls ran (app/morning/activity.py), the ``pauses`` of
    ``paused_s`` between them left out, as every throughput figure of a batch does."""
    base = NightBound(makespan_s=makespan_s, paused_s=paused_s, pauses=pauses)
    try:
        server = night_server(engine, batch_id)
        batch, workload = recorded_workload(engine, batch_id)
        graph = arm_graph_facts(engine, batch_id, workload)
    except InputError as error:
        return base.model_copy(update={"unavailable": str(error)})
    if batch.status in ("queued", "running"):
        return base.model_copy(update={"unavailable": (
            f"batch {batch_id} is still running: its makespan so far is no night's")})
    unfinished = (batch.tickers_total or 0) - (batch.tickers_succeeded or 0)
    scope = (None if unfinished <= 0 else
             f"of its answered calls; {unfinished} of {batch.tickers_total} tickers did not "
             "succeed, and the time their other calls took is in the makespan")
    with engine.connect() as conn:
        endpoints = len(conn.execute(select(ServerSample.endpoint).distinct()
                                     .where(ServerSample.batch_id == batch_id)).all()) or 1
    bound = graph_bound(graph, server.kv_tokens, server.max_num_seqs, server.step, endpoints)
    if bound is None or makespan_s <= 0:
        return base.model_copy(update={"unavailable": "no answered output to bound"})
    # A night quicker than its "bound" shows the model wrong for it (its step is fitted to the
    # night's readings): the figures stay in the JSON, but nothing calls them a bound.
    wrong = (None if makespan_s >= bound.seconds else
             f"the model gives {bound.seconds:.0f} s, more than the night took "
             f"({makespan_s:.0f} s): its step, fitted to the night's readings, overstates "
             "the server, so it bounds nothing here")
    interval = bound_interval(graph, server.kv_tokens, server.max_num_seqs,
                              decode_levels(engine, batch_id), endpoints)
    return base.model_copy(update={
        "bound_s": bound.seconds, "makespan_over_bound": makespan_s / bound.seconds,
        "makespan_over_bound_90": None if interval is None else [
            makespan_s * tok_s / graph.output_tokens for tok_s in interval],
        "binding": bound.binding, "endpoints": endpoints, "server": server.source,
        "unavailable": wrong, "scope": scope})
