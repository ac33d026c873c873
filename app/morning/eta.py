"""The time a running batch has left, read from its rows, and the readings that keep it.

The estimate is the larger of two bounds, each from what the batch shows now (never from the
elapsed time): *work*, the servers' busy time the calls left will take (each call's share of
the busy time it was ready for; a node's share per answered call from the newest earlier
finished batch of the same kind and model times this night's pace, else this night's own),
and *chain*, the longest chain of calls left, one after another, at each node's latency now
(the step under way at what the node's newest calls had left at its age; once past the
node's median, never more than what the oldest open step has waited, less its own age,
plus its node's issue-to-answer latency now). On a gated night
(more chains open than the servers run: many steps held at the gate) the work is at least
the work left at the rate the chain's answers came in over the last minute; on a first night
(no night before to price the calls from) at least the output left at the rate the servers
made output over the last minute (since the analysts' stage ended) while calls were ready,
and until three chain calls have answered a chain call stands in at the analysts' latency.
A night before on another server (a stage's pace ``FAR`` times the night before's or a
``FAR``th, in latency and in busy share both, as load moves the one and not the other;
before any answer, a call under way ``FAR`` times its node's longest then, in both) prices
each stage's calls left at the stage's own pace, in the first night's interval widened by
its nodes' paces (and ``FAR`` either way while a node left has no answer), and the ETA is
*estimating* while a stage left has none yet. Below that,
while a stage left has no answer tonight, the interval spans a pace ``FAR`` times either way
(uncalibrated); before any answer, a call under way past its node's longest call the night
before lifts every node's pace to as many times.
The interval is the estimate times ``RATIO`` (``RATIO_FIRST`` on a first night), measured
on recorded nights' replays; ``LEVEL`` is the share of readings each held on nights left
out, and the level it claims. While the chain has answered under ``EARLY`` of its calls it
spans ``RATIO_EARLY`` (``RATIO_FIRST_EARLY``) too, measured on the readings in that state;
under ``LAST_S`` (one reading interval) it spans the estimate give or take ``LAST_S``.
docs/operations.md ("One truth, two faces") states every rule;
docs/lab/2026-12-05-eta-busy-shares.md, docs/lab/2026-12-05-eta-pace.md and
docs/lab/2026-12-05-h100-eta-gated-night.md, docs/lab/2026-12-05-eta-gated-fair-test.md,
docs/lab/2026-12-06-eta-chain-jump.md, docs/lab/2026-12-06-h100-eta-held-out.md,
docs/lab/2026-12-06-eta-first-night.md, docs/lab/2026-12-06-eta-prior-mismatch.md,
docs/lab/2026-12-07-eta-below-far.md, docs/lab/2026-12-07-eta-early-100.md and
docs/lab/2026-12-07-eta-early-lead.md measure it.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any, NamedTuple

from sqlalchemy import Engine, insert, select

from agents.graph import sequential_nodes
from agents.nodes import ANALYSTS
from app.db.batchsettings import BatchSettings
from app.db.models import Batch, LLMCall, ProgressReading, ServerSample, TickerRun

NEWEST = 0.25  # of a node's answered calls, the newest, whose latency is the latency now
NEWEST_MIN = 3  # ... but never fewer calls than this
FINISHED = ("succeeded", "failed")  # a ticker in these runs no more calls
FINISHED_BATCH = ("succeeded", "partial")  # a batch whose rows are final
OVERDUE_SHARE = 0.5  # of its latency (its share), the least a call under way has still to go
HELD_AGE = 3.0  # an open step ready this many times its node's median latency is held
HELD_SHARE = 0.25  # ... and with this share of the open steps held (NEWEST_MIN at least), the
#                    night is gated: more chains open than the servers run
WINDOW_S = 60.0  # a gated night's work goes at the rate of the chain's answers over this long
WINDOW_MIN_S = 20.0  # ... once they have come in for this long
# True time left ÷ the estimate, 5th and 95th percentile over the replayed readings; the test
# that replays them fails when they move by more than 0.01 (recalibrate: docs/lab).
RATIO = (0.76, 1.33)
# A first night (no night before): wider, its replays' own percentiles, which held 89% of
# them each night left out; RATIO held 70% there (docs/lab/2026-12-06-eta-first-night.md).
RATIO_FIRST = (0.67, 1.80)
LEVEL = 0.75  # the share of readings it held, each night left out in turn (88%)
# While the chain (the nodes after the analysts) has answered less than this share of its
# calls, the pace is mostly the analysts' and stands for the chain: RATIO was measured from a
# tenth of the night on, where it mostly is not. Then the interval spans RATIO and these, the
# same percentiles over every replayed reading in that state (with a night before; a first
# night's), which held 82% and 86% of them each night left out
# (docs/lab/2026-12-07-eta-early-lead.md).
EARLY = 0.10
RATIO_EARLY = (0.85, 1.85)
RATIO_FIRST_EARLY = (0.33, 2.43)
# An estimate under one reading interval (the progress is read every 15 s) is the last few
# calls', which one answer's length decides: the ratios held 9 of 16 such readings. There the
# interval is the estimate give or take this many seconds, which held all of them.
LAST_S = 15.0
# A stage's calls (the analysts, the chain) this many times slower than the night before's,
# or quicker: another server. On the recorded nights the stages' paces stayed within
# 0.33-3.06 and the first answer came within 1.03 times the longest any analyst node's calls
# took from ready the night before (docs/lab/2026-12-06-eta-prior-mismatch.md).
FAR = 4.0

Spread = tuple[float, float, float]  # (low, middle, high)
# What every face of the progress shows before the ETA has a basis: never a made-up number.
ESTIMATING = ("estimating… (no call answered yet, and no earlier finished night of this "
              "model to price the calls by)")
UNLIKE = (f"estimating… (tonight's calls run over {FAR:g} times slower or quicker than the "
          "night before's, as on another server, and a stage left (the analysts, the chain "
          "after them) has no answer tonight yet to price it by)")


@dataclass(frozen=True)
class Reading:
    """What the ETA is computed from at one moment, and the ETA (seconds; None: no basis)."""

    taken_at: datetime
    calls_expected: int
    calls_done: int
    attempts: int
    output_tokens: int
    tokens_left: float
    rate_tok_s: float | None  # tokens left ÷ the work bound: the rate the work left comes at
    rate_low_tok_s: float | None  # ... at the slowest pace
    rate_high_tok_s: float | None  # ... at the fastest
    rate_source: str | None  # "before": the night before's shares × pace; "night": this one's
    chain_left: int  # calls one after another on the longest chain left
    chain_s: float | None  # that chain at its nodes' median latencies (None: no chain left)
    chain_low_s: float | None  # ... at their first quartiles
    chain_high_s: float | None  # ... at their third quartiles
    eta_s: float | None
    eta_low_s: float | None  # eta_s × RATIO (and the rules above): held LEVEL of the replays
    eta_high_s: float | None
    why: str = ESTIMATING  # why there is no ETA while eta_s is None (not stored)
    # The share of replayed readings the interval held (LEVEL); None: a rule no recorded
    # night tested set it (another server, or a stage left unanswered tonight), so the faces
    # call it uncalibrated (not stored).
    level: float | None = LEVEL
    early: bool = False  # the chain has answered under EARLY of its calls (not stored)

    @property
    def estimating(self) -> str | None:
        """Why there is no ETA yet, as every face says it (None: there is one). Without a
        night before of this kind and model that prices tonight's calls, the first answered
        call is the first basis."""
        return None if self.eta_s is not None else self.why

    def whole(self, seconds: float | None) -> int | None:
        """Return ``seconds`` whole, never 0 while a call is left (a call under way may end
        in less than half a second; 0 would read as done)."""
        if seconds is None:
            return None
        left = self.calls_done < self.calls_expected or self.chain_left > 0
        return max(1, round(seconds)) if left else round(seconds)


def bound(work_s: float | None, chain_s: float | None) -> float | None:
    """Return the larger of the work's and the chain's seconds (None: neither known)."""
    known = [b for b in (work_s, chain_s) if b is not None]
    return max(known) if known else None


def pipeline_nodes(settings: BatchSettings) -> tuple[list[str], list[str]]:
    """Return (analysts, the sequential nodes after them) for a batch's stored settings."""
    debate, risk = settings.debate_rounds, settings.risk_rounds
    return list(ANALYSTS), sequential_nodes(2 if debate is None else debate,
                                            2 if risk is None else risk)


def graph_order(settings: BatchSettings) -> list[str]:
    """Return a batch's node names in dependency order, from the rounds it ran with."""
    return [node for part in pipeline_nodes(settings) for node in part]


class Shares:
    """The busy time a ready call has had: ``at(t)`` is the integral of 1 ÷ (the calls ready
    then) up to ``t``, over spans (ready, end, how many calls); a moment with none adds 0."""

    def __init__(self, spans: Sequence[tuple[datetime, datetime, int]]) -> None:
        events = sorted((t, d) for a, b, n in spans if b > a for t, d in ((a, n), (b, -n)))
        self._at: list[datetime] = []
        self._sum: list[float] = []
        self._ready: list[int] = []
        ready, total = 0, 0.0
        for i, (t, d) in enumerate(events):
            if i and ready > 0:
                total += (t - events[i - 1][0]).total_seconds() / ready
            ready += d
            self._at.append(t)
            self._sum.append(total)
            self._ready.append(ready)

    def at(self, t: datetime) -> float:
        i = bisect.bisect_right(self._at, t) - 1
        if i < 0:
            return 0.0
        after = (t - self._at[i]).total_seconds() / self._ready[i] if self._ready[i] > 0 else 0
        return self._sum[i] + after

    def of(self, start: datetime, end: datetime) -> float:
        """Return the share a call ready from ``start`` to ``end`` had."""
        return self.at(end) - self.at(start)

    def busy(self, start: datetime, end: datetime) -> float:
        """Return the seconds from ``start`` to ``end`` in which some call was ready."""
        edges = [start, *(t for t in self._at if start < t < end), end]
        return sum((b - a).total_seconds() for a, b in pairwise(edges)
                   if (i := bisect.bisect_right(self._at, a) - 1) >= 0 and self._ready[i] > 0)


def newest(values: Sequence[float]) -> int:
    """Return how many of a node's answered calls, the newest, give its latency now."""
    return max(NEWEST_MIN, round(NEWEST * len(values)))


def _ready(c: Any) -> datetime:
    return c.ready_at or c.started_at


def _spread(values: list[float], middle: float | None = None) -> Spread:
    """Return (first quartile, ``middle`` or the median, third quartile) of ``values``."""
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else values * 3
    return q[0], statistics.median(values) if middle is None else middle, q[2]


def _per_call(calls: Sequence[Any], value: dict[int, float]) -> dict[str, list[float]]:
    """Return, node by node, each answered call's ``value`` summed over its attempts (an
    attempt that answered nothing adds to the call it was for: the next, or the last)."""
    out: dict[str, dict[tuple[str, int], float]] = defaultdict(lambda: defaultdict(float))
    for i, c in enumerate(calls):
        out[c.node][(c.ticker, c.sample)] += value[i]
    answered = {(c.node, c.ticker, c.sample) for c in calls if c.status == "ok"}
    return {node: [v for (t, s), v in by.items() if (node, t, s) in answered]
            for node, by in out.items()
            if any((node, t, s) in answered for t, s in by)}


def _tokens(calls: Sequence[Any]) -> dict[str, float]:
    """Return each node's output per answered call, every attempt's output counted."""
    got = _per_call(calls, {i: float(c.completion_tokens or 0) for i, c in enumerate(calls)})
    return {n: statistics.fmean(v) for n, v in got.items()}


def _shares(calls: Sequence[Any], shares: Shares) -> dict[str, list[float]]:
    """Return each node's answered calls' shares, every attempt's counted."""
    return _per_call(calls, {i: shares.of(_ready(c), c.ended_at) for i, c in enumerate(calls)})


def _latencies(calls: Sequence[Any], ready: bool = False) -> dict[str, list[float]]:
    """Return each node's answered calls' latency, issue (``ready``: ready) to answer, in the
    order they were given."""
    seen: dict[str, list[float]] = defaultdict(list)
    for c in calls:
        if c.status == "ok":
            seen[c.node].append((c.ended_at - (_ready(c) if ready else c.started_at))
                                .total_seconds())
    return seen


@dataclass(frozen=True)
class Prior:
    """The newest earlier finished batch of the same kind and model, node by node."""

    tokens: dict[str, float]  # output per answered call
    shares: dict[str, list[float]]  # answered calls' shares, in the order they ended
    took: dict[str, list[float]]  # answered calls' latencies, issue to answer
    aged: dict[str, list[float]]  # ... ready to answer


class Call(NamedTuple):
    """One attempt's row as the ETA reads it (a plain tuple: a reading walks every call of
    two nights several times, and a database row's attributes are slow to read)."""

    ticker: str
    node: str
    sample: int
    status: str
    completion_tokens: int | None
    ready_at: datetime | None
    started_at: datetime
    ended_at: datetime


CALL = (LLMCall.ticker, LLMCall.node, LLMCall.sample, LLMCall.status,
        LLMCall.completion_tokens, LLMCall.ready_at, LLMCall.started_at, LLMCall.ended_at)


def _prior(engine: Engine, batch_id: int) -> Prior:
    # By batch id, not the one order of nights (``newest_first``), on purpose: the prior
    # prices calls, which depend on the model, server and prompts as they were when a batch
    # ran, not on the date it analyzed; the batch created last before this one (ids are
    # creation order) ran nearest in time, and no batch created after it can have priced
    # it when it ran (a replay of its readings sees what it saw). See
    # docs/lab/2026-12-06-left-alone-2.md.
    with engine.connect() as conn:
        this = conn.execute(select(Batch.kind, Batch.settings)
                            .where(Batch.id == batch_id)).one()
        model = BatchSettings.read(this.settings).model
        earlier = conn.execute(select(Batch.id, Batch.settings)
                               .where(Batch.id < batch_id, Batch.kind == this.kind,
                                      Batch.status.in_(FINISHED_BATCH))
                               .order_by(Batch.id.desc()).limit(20)).all()
        same = next((b.id for b in earlier
                     if BatchSettings.read(b.settings).model == model), None)
        if same is None:
            return Prior({}, {}, {}, {})
        calls = [Call(*c) for c in conn.execute(select(*CALL).where(LLMCall.batch_id == same)
                                                .order_by(LLMCall.ended_at))]
    shares = Shares([(_ready(c), c.ended_at, 1) for c in calls])
    return Prior(_tokens(calls), _shares(calls, shares), _latencies(calls),
                 _latencies(calls, ready=True))


def _pace(own: dict[str, list[float]], before: dict[str, list[float]]) -> Spread | None:
    """Return this night's ``own`` values over the night before's, each node's answered calls
    against as many of the night before's first answered ones of the node (a node's first
    answers are its quick ones, or those that had the servers to themselves, on both
    nights): (the lowest node's ratio, all nodes pooled, the highest node's); None: no
    node answered on both."""
    ratios, mine, theirs = [], 0.0, 0.0
    for n, values in own.items():
        then = before.get(n, [])[:len(values)]
        if then and sum(then) > 0:
            usual = statistics.fmean(then) * len(values)
            ratios.append(sum(values) / usual)
            mine += sum(values)
            theirs += usual
    return (min(ratios), mine / theirs, max(ratios)) if ratios else None


def _paces(own: dict[str, list[float]], before: dict[str, list[float]],
           stages: list[list[str]]) -> dict[str, Spread | None]:
    """Return each node's pace: ``_pace`` of its stage's nodes (None: none answered on both
    nights yet)."""
    return {n: _pace({m: v for m, v in own.items() if m in stage}, before)
            for stage in stages for n in stage}


def _outlasted(prior: Prior, steps: Sequence[Step], shares: Shares, now: datetime) -> float:
    """Return the most times a call under way has been ready as long as any call of its node
    took from ready the night before, and has had as much of the servers' busy time as any
    of them had (the lesser of the two; 0: no node under way that the night before had): a
    pace tonight's calls have at least, while none has answered. A night larger than the
    night before on the same server waits longer per call, beside more calls, but has no
    larger a share of the servers' time per call."""
    under = [(s, n) for s in steps if s.since is not None for n in s.under_way
             if prior.aged.get(n) and prior.shares.get(n)]
    ready = max(((now - s.since).total_seconds() / max(prior.aged[n])  # type: ignore[operator]
                 for s, n in under), default=0.0)
    busy = max((shares.of(s.since, now) / max(prior.shares[n])  # type: ignore[arg-type]
                for s, n in under if max(prior.shares[n]) > 0), default=0.0)
    return min(ready, busy)


def _unlike(prior: Prior, staged: dict[str, Spread | None], busy: dict[str, Spread | None],
            steps: Sequence[Step], shares: Shares, now: datetime) -> bool:
    """Return whether tonight runs on another server than the night before, by its calls:
    a stage's issue-to-answer latencies (``staged``: its nodes' pace) ``FAR`` times the
    night before's or a ``FAR``th, and its calls' shares of the servers' busy time
    (``busy``) as far apart; before any answer of a node the night before had, a call under
    way ``FAR`` times longer ready, with as many times the share, than any of its node then.
    Latencies alone grow with the load (a night ten times the night before's on the same
    server waits several times longer per call); a share is a call's latency over the calls
    ready beside it, which another server moves and the load does not
    (docs/lab/2026-12-07-eta-early-100.md)."""
    if paces := [(p[1], busy[n]) for n, p in staged.items() if p is not None]:
        return any(not 1 / FAR < p < FAR and b is not None and not 1 / FAR < b[1] < FAR
                   for p, b in paces)
    return _outlasted(prior, steps, shares, now) > FAR


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


@dataclass(frozen=True)
class Step:
    """One open sample: its nodes left, and since when its step under way has been ready
    (None: its ticker has not started)."""

    left: list[str]
    since: datetime | None
    under_way: list[str]  # the step's calls: its analysts left, else its next node


def _left_of(ran: float, ages: list[list[float]], took: list[float],
             lately: list[float], oldest: float | None) -> Spread:
    """Return what a call ready ``ran`` seconds ago has left: what the calls of the first of
    ``ages`` (lists of ready-to-answer latencies) with one longer had left at that age;
    past every one of them ``OVERDUE_SHARE`` of its latency ``took``. Never more than the
    median of what the node's newest calls (``lately``, ready to answer) that took longer
    had left: the last calls decode beside few others, faster than the node's earlier.
    Once ``ran`` is past the median of the first of ``ages`` that has any, never more than
    what is left of ``oldest`` (the longest any open step has been ready, None: none open)
    past ``ran`` plus the median of ``took`` (issue to answer): calls that took longer than
    that waited at the gate longer than any step is waiting now, and describe a gate that
    no longer holds calls that long."""
    spread: Spread | None = None
    for values in ages:
        if rest := [v - ran for v in values if v > ran]:
            spread = _spread(rest)
            break
    if spread is None:
        low, mid, high = _spread(took)
        spread = OVERDUE_SHARE * low, OVERDUE_SHARE * mid, OVERDUE_SHARE * high
    if recent := [v - ran for v in lately if v > ran]:
        spread = _capped(spread, statistics.median(recent))
    if oldest is not None and ran >= statistics.median(next((v for v in ages if v), took)):
        # Past its node's usual time from ready it is priced from the calls that took
        # longer: on a gated night, those held at the gate. Held until it has waited as long
        # as the oldest open step has, then run.
        spread = _capped(spread, max(0.0, oldest - ran) + statistics.median(took))
    return spread


def _capped(spread: Spread, cap: float) -> Spread:
    """Return ``spread`` with each of its three figures at most ``cap``."""
    return min(spread[0], cap), min(spread[1], cap), min(spread[2], cap)


def _chain_seconds(step: Step, analysts: list[str], took: dict[str, list[float]],
                   ages: dict[str, list[list[float]]], lately: dict[str, list[float]],
                   now: datetime, oldest: float | None) -> Spread | None:
    """Return the time the sample's calls left take one after another (quartiles and
    median): its analysts side by side as one step, each later node at its latencies
    ``took``; None when no step has a latency. The step under way has been ready since
    ``step.since``: what is left of it by ``_left_of`` its node's ``ages``, no open step
    having been ready longer than ``oldest`` seconds."""
    steps = ([[n for n in step.left if n in analysts and n in took]]
             if any(n in analysts for n in step.left) else [])
    steps += [[n] if n in took else [] for n in step.left if n not in analysts]
    if not any(steps):
        return None
    ran = 0.0 if step.since is None else (now - step.since).total_seconds()
    total = [0.0, 0.0, 0.0]
    for i, nodes in enumerate(steps):
        times = [_spread(took[n]) if i or step.since is None
                 else _left_of(ran, ages.get(n, []), took[n], lately.get(n, []), oldest)
                 for n in nodes]
        for k in range(3):
            total[k] += max((t[k] for t in times), default=0.0)
    return total[0], total[1], total[2]


def _gated_work(steps: Sequence[Step], calls: Sequence[Any], chain: list[str],
                cost: dict[str, float], took: dict[str, list[float]],
                now: datetime) -> float | None:
    """Return the work left at the rate the chain's answers came in over the last
    ``WINDOW_S``, each call weighed by its node's ``cost``, when the night is gated (see
    ``HELD_AGE``, ``HELD_SHARE``); None when it is not, or the answers span too little. On a
    gated night the answered calls are those that got the servers first: their shares leave
    out the waits of the calls held meanwhile, and a pace read from them is too quick."""
    open_steps = [s for s in steps if s.since is not None]
    held = [s for s in open_steps if s.since is not None and (now - s.since).total_seconds()
            > HELD_AGE * max((statistics.median(took[n]) for n in s.under_way if n in took),
                             default=float("inf"))]
    answered = [c for c in calls if c.status == "ok" and c.node in chain]
    if len(held) < max(NEWEST_MIN, HELD_SHARE * len(open_steps)) or not answered:
        return None
    span = min(WINDOW_S, (now - answered[0].ended_at).total_seconds())
    recent = sum(cost.get(c.node, 0.0) for c in answered
                 if (now - c.ended_at).total_seconds() <= WINDOW_S)
    if span < WINDOW_MIN_S or recent <= 0:
        return None
    return sum(cost.get(n, 0.0) for s in steps for n in s.left) * span / recent


def _raised(work: Spread, at_least: float) -> Spread:
    """Return ``work`` with its middle at least ``at_least``, its ends scaled as much."""
    if at_least <= work[1]:
        return work
    scale = at_least / work[1] if work[1] > 0 else 1.0
    return work[0] * scale, at_least, max(work[2] * scale, at_least)


def _output_work(samples: Sequence[Any], tokens_left: float, shares: Shares,
                 now: datetime, since: datetime | None) -> float | None:
    """Return ``tokens_left`` at the rate the servers' counters rose over the last
    ``WINDOW_S``, from ``since`` on (the analysts' stage's end: their burst, many at once,
    runs faster than the chains after it), while some call was ready (None: their samples
    span less than ``WINDOW_MIN_S``, or nothing was made). Read on a night with no night
    before: its answered calls' shares are those of the first calls through, taken while
    many shared the servers, and price the calls left at about half of what those had
    (docs/lab/2026-12-06-eta-first-night.md)."""
    made, first, last = 0.0, now, now - timedelta(seconds=WINDOW_S)
    by_endpoint: dict[str | None, list[Any]] = defaultdict(list)
    for s in samples:
        if (now - s.sampled_at).total_seconds() <= WINDOW_S and (
                since is None or s.sampled_at >= since):
            by_endpoint[s.endpoint].append(s)
    for rows in by_endpoint.values():
        rows.sort(key=lambda s: s.sampled_at)
        if len(rows) >= 2:
            made += max(0.0, rows[-1].generation_tokens_total - rows[0].generation_tokens_total)
            first, last = min(first, rows[0].sampled_at), max(last, rows[-1].sampled_at)
    if made <= 0 or (last - first).total_seconds() < WINDOW_MIN_S:
        return None
    return tokens_left * shares.busy(first, last) / made


def _steps(tickers: Sequence[Any], calls: Sequence[Any], nodes: list[str],
           analysts: list[str], samples: int, now: datetime) -> list[Step]:
    """Return every open sample's step (a ticker finished after ``now`` was open then)."""
    answered = {(c.ticker, c.node, c.sample) for c in calls if c.status == "ok"}
    last: dict[tuple[str, int], datetime] = {}
    for c in calls:  # in the order they ended
        if c.status == "ok":
            last[(c.ticker, c.sample)] = c.ended_at
    out = []
    for run in tickers:
        if run.status in FINISHED and (run.finished_at or now) <= now:
            continue
        started = run.started_at if run.started_at and run.started_at <= now else None
        for s in range(samples):
            left = [n for n in nodes if (run.ticker, n, s) not in answered]
            if not left and started is not None:
                left = nodes[-1:]  # open with every node answered: its last asked again
            waiting = [n for n in left if n in analysts] or left[:1]
            # The analysts were all issued at the ticker's start; a later node at the
            # sample's last answer.
            since = started
            if started is not None and not any(n in analysts for n in left):
                since = last.get((run.ticker, s), started)
            out.append(Step(left, since, waiting))
    return out


def reading(engine: Engine, batch_id: int, now: datetime) -> Reading:
    """Return the batch's reading at ``now`` from the rows stored by then (a past ``now``
    replays the night as it stood)."""
    with engine.connect() as conn:
        batch = conn.execute(select(Batch.settings, Batch.tickers_total)
                             .where(Batch.id == batch_id)).one()
        calls = [Call(*c) for c in conn.execute(select(*CALL).where(
            LLMCall.batch_id == batch_id, LLMCall.ended_at <= now).order_by(LLMCall.ended_at))]
        samples = conn.execute(select(ServerSample.endpoint, ServerSample.sampled_at,
                                      ServerSample.generation_tokens_total)
                               .where(ServerSample.batch_id == batch_id,
                                      ServerSample.sampled_at <= now)).all()
        tickers = conn.execute(select(TickerRun.ticker, TickerRun.status,
                                      TickerRun.started_at, TickerRun.finished_at)
                               .where(TickerRun.batch_id == batch_id)).all()
    settings = BatchSettings.read(batch.settings)
    per_ticker = settings.samples or 1
    analysts, chain = pipeline_nodes(settings)
    nodes = [*analysts, *chain]
    answered = {(c.ticker, c.node, c.sample) for c in calls if c.status == "ok"}
    prior = _prior(engine, batch_id)
    steps = _steps(tickers, calls, nodes, analysts, per_ticker, now)
    took_all = _latencies(calls)
    # The calls held or under way are ready since their step began: they have no rows yet.
    shares = Shares([(_ready(c), c.ended_at, 1) for c in calls]
                    + [(step.since, now, len(step.under_way)) for step in steps
                       if step.since is not None])
    own_shares = _shares(calls, shares)
    # A night before on another server: its nodes do not keep their proportions there (fixed
    # costs, prefill against decode), so each stage's nodes left go at the stage's own pace,
    # and a stage with none yet leaves the ETA unknown (UNLIKE).
    staged = _paces(took_all, prior.took, [analysts, chain])
    unlike = _unlike(prior, staged, _paces(own_shares, prior.shares, [analysts, chain]),
                     steps, shares, now)
    stages = [analysts, chain] if unlike else [nodes]
    pace = _paces(own_shares, prior.shares, stages)
    # Before any answer, a call under way past its node's longest call the night before (in
    # time ready and in busy share both) says tonight is at least that much slower: every
    # node at that pace, as the analysts' first answers will price them all (one pace for
    # every node, until a stage is FAR apart).
    lifted = 0.0 if unlike or any(staged.values()) else _outlasted(prior, steps, shares, now)
    if lifted > 1:
        pace = dict.fromkeys(nodes, (lifted, lifted, lifted))
    share: dict[str, Spread] = {}
    for n in nodes:
        if n in prior.shares:
            usual = statistics.fmean(prior.shares[n])
            share[n] = tuple(usual * p for p in pace[n] or (1.0, 1.0, 1.0))  # type: ignore[assignment]
        elif n in own_shares:
            share[n] = _spread(own_shares[n], statistics.fmean(own_shares[n]))
    mean_share = [v for values in own_shares.values() for v in values]
    work: Spread | None = None
    if share or mean_share:
        fallback = statistics.fmean(mean_share) if mean_share else 0.0
        total = [0.0, 0.0, 0.0]
        for step in steps:
            had = 0.0 if step.since is None else shares.of(step.since, now)
            for n in step.left:
                cost = share.get(n, (fallback, fallback, fallback))
                for i in range(3):
                    total[i] += cost[i] - (min(had, (1 - OVERDUE_SHARE) * cost[i])
                                           if n in step.under_way else 0.0)
        work = (total[0], total[1], total[2])
    # The chain: a node's latency now, else the night's, else the night before's × pace.
    recent = {n: v[-newest(v):] for n, v in took_all.items()}
    latency_pace = _paces(took_all, prior.took, stages)
    if lifted > 1:
        latency_pace = dict.fromkeys(nodes, (lifted, lifted, lifted))
    unknown = unlike and any(latency_pace[n] is None for s in steps for n in s.left
                             if n in prior.took)
    paced = {n: (p or (1.0, 1.0, 1.0))[1] for n, p in latency_pace.items()}
    took: dict[str, list[float]] = {}
    for n in nodes:
        if n in recent or n in took_all:
            took[n] = recent.get(n) or took_all[n]
        elif n in prior.took:
            took[n] = [v * paced[n] for v in prior.took[n]]
    chained = [(c.ended_at - c.started_at).total_seconds() for c in calls
               if c.status == "ok" and c.node in chain]
    chained = chained[-newest(chained):]
    # Until NEWEST_MIN chain calls have answered (with no night before to price them), the
    # analysts' latencies are the only ones known: a chain call stands in at theirs.
    seen = [v for n in analysts for v in recent.get(n, [])]
    stand_in = chained if len(chained) >= NEWEST_MIN or not seen else seen
    if stand_in:
        for n in chain:
            took.setdefault(n, stand_in)
    # The step under way: the ready-to-answer latencies of the night's calls of its node and
    # the night before's (a call held at the gate: the gate's waits are in them).
    aged = _latencies(calls, ready=True)
    ages = {n: [aged.get(n, []) + [v * paced[n] for v in prior.aged.get(n, [])]
                or took.get(n, [])] for n in nodes}
    lately = {n: v[-newest(v):] for n, v in aged.items()}
    # The longest any open step has been ready: the longest the gate is holding one now.
    oldest = max(((now - s.since).total_seconds() for s in steps if s.since is not None),
                 default=None)
    slowest: Spread | None = None
    for step in steps:
        this = _chain_seconds(step, analysts, took, ages, lately, now, oldest)
        if this is not None and (slowest is None or this[1] > slowest[1]):
            slowest = this
    longest = max((any(n in analysts for n in s.left) + sum(n in chain for n in s.left)
                   for s in steps), default=0)
    # Calls under way have made part of their output: the servers' counter says how much.
    tokens = _tokens(calls)
    overall = (sum(c.completion_tokens or 0 for c in calls) / len(answered)
               if answered else 0.0)
    tokens_left = sum(tokens.get(n, prior.tokens.get(n, overall))
                      for step in steps for n in step.left)
    tokens_left = max(0.0, tokens_left - _in_flight(samples, calls))
    # A gated night: the work left at the rate the chain's answers came in lately.
    weights = {n: v[1] for n, v in share.items()}
    if work is not None and (gated := _gated_work(
            steps, calls, chain, weights, took, now)) is not None:
        work = _raised(work, gated)
    # A first night: the output left at the rate the servers made it lately, since the
    # analysts' stage ended if it has.
    stage_end = (None if any(n in analysts for s in steps for n in s.left)
                 else max((c.ended_at for c in calls if c.node in analysts), default=None))
    if work is not None and not prior.shares and (made := _output_work(
            samples, tokens_left, shares, now, stage_end)) is not None:
        work = _raised(work, made)
    low_s, chain_s, high_s = slowest or (None, None, None)
    low_w, work_s, high_w = work or (None, None, None)
    rates = [tokens_left / w if w else None for w in (work_s, high_w, low_w)]
    expected = len(nodes) * per_ticker * int(batch.tickers_total)
    eta_s = None if unknown else bound(work_s, chain_s)
    ratio = RATIO if prior.shares and not unlike else RATIO_FIRST
    if unlike:  # on another server the nodes left go at a pace known only within their
        #         stage's answered nodes' (their slowest and quickest against the pooled)
        left = [p for s in steps for n in s.left if (p := latency_pace[n]) and p[1] > 0]
        ratio = (ratio[0] * min((p[0] / p[1] for p in left), default=1.0),
                 ratio[1] * max((p[2] / p[1] for p in left), default=1.0))
    # A stage left that has no answer tonight goes at a pace the night before only guesses:
    # on one server the recorded nights' stages kept within 0.33-3.06 of their night
    # before's, and a stage may move up to FAR times apart before it counts as another
    # server. The range spans that, and no recorded night calibrated it.
    unpriced = bool(prior.shares) and not unlike and any(
        staged[n] is None for s in steps for n in s.left if n in prior.took)
    # On another server the nodes do not keep their proportions: a node left that has no
    # answer tonight goes at its stage's answered nodes' pace, which their spread bounds only
    # once they are several (one node answered: no spread at all). The range spans FAR
    # either way of it until every node left has answered.
    unpriced = unpriced or (unlike and any(n not in took_all for s in steps for n in s.left
                                           if n in prior.took))
    if unpriced:
        ratio = ratio[0] / FAR, ratio[1] * FAR
    # The chain's first answers are few, and its calls left go at a pace mostly the
    # analysts': the interval spans the ratios measured in that state too.
    early = (sum(n in chain for _, n, _ in answered)
             < EARLY * per_ticker * int(batch.tickers_total) * len(chain))
    if early and not (unlike or unpriced):
        wide = RATIO_EARLY if prior.shares else RATIO_FIRST_EARLY
        ratio = min(ratio[0], wide[0]), max(ratio[1], wide[1])
    low = high = None
    if eta_s is not None:
        low, high = eta_s * ratio[0], eta_s * ratio[1]
        if eta_s < LAST_S:  # the last calls: an answer's length decides, give or take LAST_S
            low, high = min(low, max(0.0, eta_s - LAST_S)), max(high, eta_s + LAST_S)
    return Reading(now, expected, len(answered), len(calls),
                   int(sum(c.completion_tokens or 0 for c in calls)), tokens_left,
                   rates[0], rates[1], rates[2],
                   None if work is None else "before" if prior.shares else "night",
                   longest, chain_s, low_s, high_s, eta_s, low, high,
                   UNLIKE if unlike else ESTIMATING, None if unlike or unpriced else LEVEL,
                   early)


def record(engine: Engine, batch_id: int, found: Reading) -> None:
    """Store one reading in ``progress_readings``."""
    with engine.begin() as conn:
        row = {k: v for k, v in asdict(found).items() if k not in ("why", "level", "early")}
        conn.execute(insert(ProgressReading), [{**row, "batch_id": batch_id}])
