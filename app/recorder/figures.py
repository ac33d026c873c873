"""Say how a batch's admission went, from the control objects' plain state: the one place
the summaries in the bench's JSON and the `batch finished` log line are built.

Each summary is a pydantic model, its JSON's keys in field order. ``Figures``' serializer
leaves out an optional field never given and writes a ``SPREAD`` field's keys in its place,
so an adaptive server's figures stay flat keys of its endpoint's summary.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer

from app.db.batchsettings import FallbackRecord
from app.traffic.budget import TokenBudget
from app.traffic.holdback import COLUMNS, HoldBack
from app.traffic.sampler import MetricsSampler
from app.traffic.server import Server, ServerSet
from app.traffic.strategy import Strategy

# The mark of a ``Figures`` field whose model's keys stand in its place in the JSON.
SPREAD = object()


class Figures(BaseModel, frozen=True):
    """A summary whose JSON has the keys it was given: an optional field left out is absent,
    and a ``SPREAD`` field's keys stand where the field is (none when it is None)."""

    @model_serializer(mode="wrap")
    def _given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        spread = {k for k, field in type(self).model_fields.items() if SPREAD in field.metadata}
        given: dict[str, Any] = {}
        for key, value in handler(self).items():
            if key in self.model_fields_set:
                given.update((value or {}) if key in spread else {key: value})
        return given


class BudgetSummary(BaseModel, frozen=True):
    """What a token budget knew and did (``budget``), its JSON's keys in order."""

    kv_capacity_tokens: int | None
    fill: float
    limit_tokens: int | None
    factor: float
    correction: float
    tokens_per_byte: float
    reason: str
    factor_start: float
    factor_ceiling: float
    factor_peak: float
    rises: int
    cuts: int
    kv_high: float
    readings: int
    footprint_per_reserved_token: float | None
    trajectory: list[list[Any]]  # [reading, factor, correction, reason] at each change
    mean_request_tokens: int
    requests: int
    expected_output: dict[str, int]  # tokens reserved for a node's answer


class HoldBackSummary(BaseModel, frozen=True):
    """The readings counted and each reason's share of them, the commonest first."""

    readings: int
    share: dict[str, float]


class Chains(Figures, frozen=True):
    """The chains that fit, the tokens per active ticker, and ``prefetch`` when prefetching."""

    slots: int | None
    tokens_per_ticker: int | None
    prefetch: bool = False


class AdaptiveSummary(BaseModel, frozen=True):
    """How an adaptive server's limits ended and what held new tickers back there
    (``adaptive``); its holders' JSON has its keys in its place (``Adaptive``)."""

    request_limit_reason: str
    token_budget: BudgetSummary | None
    chains: Chains
    new_tickers_held_back: HoldBackSummary


# A summary's adaptive figures: absent from its JSON unless adaptive, and then spread there.
Adaptive = Annotated[AdaptiveSummary | None, SPREAD]


class EndpointSummary(Figures, frozen=True):
    """How one endpoint's admission ended and what routing gave it (``endpoint``)."""

    request_limit: int
    tickers_started: int
    tickers_moved_in: int
    tickers_moved_out: int
    outages: int
    up: bool
    adaptive: Adaptive = None


class Fleet(Figures, frozen=True):
    """The servers behind a router endpoint (``fleet``): how many it lists, how many the
    last reading could read (0: admission by request count), their KV tokens summed."""

    servers: int
    read: int | None
    kv_tokens: int | None


class Admission(Figures, frozen=True):
    """How a batch's admission ended (``admission``): ``adaptive`` the first endpoint's, as
    in ``EndpointSummary``; ``endpoints`` only with several."""

    strategy: str
    request_limit: int
    adaptive: Adaptive = None
    endpoints: dict[str, EndpointSummary] | None = None
    behind_router: Fleet | None = None  # only when the (first) endpoint is a router


class HoldBackTimeline(BaseModel, frozen=True):
    """Each endpoint's rows of what held new tickers back, by ``columns``."""

    columns: list[str]
    endpoints: dict[str, list[list[Any]]]


def budget(b: TokenBudget) -> BudgetSummary:
    """Return what the budget knew and did, for the batch's log and the bench's JSON."""
    return BudgetSummary(
        kv_capacity_tokens=b.capacity, fill=b.fill, limit_tokens=b.limit,
        factor=round(b.factor, 4), correction=round(b.correction, 4),
        tokens_per_byte=round(b.ratio(), 4), reason=b.reason,
        factor_start=b.overbook, factor_ceiling=b.overbook_max,
        factor_peak=round(b.peak_factor, 4), rises=b.rises, cuts=b.cuts,
        kv_high=b.kv_high, readings=b.readings,
        footprint_per_reserved_token=(None if b.footprint_share is None
                                      else round(b.footprint_share, 4)),
        trajectory=list(b.trajectory), mean_request_tokens=b.typical_cost,
        requests=b.requests_admitted,
        expected_output={node: b.expected_output(node, max(seen))
                         for node, seen in sorted(b.outputs.items())})


def held_back(record: HoldBack) -> HoldBackSummary:
    """Return the readings counted and each reason's share of them."""
    readings = sum(record.counts.values())
    return HoldBackSummary(readings=readings, share={
        reason: round(n / readings, 3) for reason, n in record.counts.most_common()}
        if readings else {})


def adaptive(server: Server) -> AdaptiveSummary | None:
    """Return how a server's limits ended — the request limit's reason, the budget, the
    chains that fit and the tokens per active ticker — and what held new tickers back
    there (None: not adaptive)."""
    if not server.strategy.adaptive:
        return None
    limits = server.limits
    per_ticker = limits.footprint.tokens()
    prefetch: dict[str, Any] = {"prefetch": True} if limits.strategy.prefetch else {}
    chains = Chains(slots=limits.chain_slots(),
                    tokens_per_ticker=None if per_ticker is None else round(per_ticker),
                    **prefetch)
    return AdaptiveSummary(
        request_limit_reason=limits.policy.reason,
        token_budget=budget(limits.budget) if limits.budget else None,
        chains=chains, new_tickers_held_back=held_back(server.holdback))


def endpoint(server: Server) -> EndpointSummary:
    """Return how one endpoint's admission ended and what routing gave it."""
    return EndpointSummary(
        request_limit=server.gate.limit, tickers_started=server.started,
        tickers_moved_in=server.moved_in, tickers_moved_out=server.moved_out,
        outages=server.outages, up=server.up, adaptive=adaptive(server))


def fleet(server: Server) -> Fleet | None:
    """Return the servers seen behind an endpoint (None: it is a server, or unknown)."""
    reader = server.gauges
    if not isinstance(reader, MetricsSampler) or not reader.fleet:
        return None
    return Fleet(servers=len(reader.fleet), read=reader.fleet_read, kv_tokens=reader.kv_capacity)


def admission(servers: ServerSet, strategy: Strategy) -> Admission:
    """Return how admission ended: the endpoints' request limits summed, the first
    endpoint's limits, and with several endpoints each one's under ``endpoints``."""
    several: dict[str, Any] = (
        {"endpoints": {s.name: endpoint(s) for s in servers}} if servers.several else {})
    behind = fleet(servers.first)
    if behind is not None:
        several["behind_router"] = behind
    return Admission(strategy=strategy.name,
                     request_limit=sum(s.gate.limit for s in servers),
                     adaptive=adaptive(servers.first), **several)


def holdback_timeline(servers: ServerSet) -> HoldBackTimeline:
    """Return each endpoint's rows of what held new tickers back (holdback.COLUMNS)."""
    return HoldBackTimeline(columns=list(COLUMNS),
                            endpoints={s.name: s.holdback.timeline for s in servers})


def fallback(servers: ServerSet) -> FallbackRecord | None:
    """Return what the batch stores of its time without /metrics (None: it had none)."""
    now = servers.clock()
    missed = sum(s.limits.missed for s in servers)
    if not missed or not servers.first.strategy.adaptive:
        return None
    seconds = sum(s.limits.blind_s + (0.0 if s.limits.blind_since is None
                                      else now - s.limits.blind_since) for s in servers)
    return FallbackRecord(readings_missed=missed, seconds=round(seconds, 1),
                          limit=servers.first.limits.policy.fallback_limit)
