"""Gather what each web page shows from the database, as models the HTML and the JSON API
share: the read side's, so app/web only renders (it reads no row itself).

``/api/…`` serves a model as its JSON; a page renders that same JSON. Every number comes
from the modules the CLI uses (``app.morning.ranking``, ``accounting``, ``serverview``), so
the pages, the API and ``nightdesk ranking``/``report`` agree.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Engine, select

from app.config import Settings
from app.db.batchsettings import BatchSettings
from app.db.models import (
    FINISHED_STATUSES,
    Batch,
    Decision,
    LLMCall,
    NodeText,
    TickerRun,
    batch_row,
    newest_first,
    night_of_each_date,
    nights_newest_first,
)
from app.errors import InputError
from app.morning import nightstatus
from app.morning.accounting import Arm, BatchReport, batch_report, compare_arm
from app.morning.advice import Advice, next_steps
from app.morning.changes import NightChanges, RankedRow, compare_nights, ranked_row
from app.morning.eta import graph_order
from app.morning.nightstatus import NightStatus, Progress
from app.morning.ranking import RATING_ORDER, RankRow, from_reruns, ranking
from app.morning.series import SeriesView, series_view
from app.morning.serverview import ServerView, server_view
from app.morning.summary import (
    BatchSummary,
    FailedTicker,
    IsoDate,
    IsoDatetime,
    Seen,
    failed_tickers,
    list_batches,
    summarize,
    ticker_state,
)
from app.morning.timeline import Interval, batch_timeline
from app.quality.monitor import warnings_for

HISTORY_NIGHTS = 60
IN_FLIGHT = ("running", "queued")  # a ticker's statuses while its batch runs


class RunningBatch(BatchSummary):
    """A batch that runs (``app.morning.summary.status_of``), with its progress and its ETA."""

    tickers_done: int
    tickers_running: int
    calls: int
    expected_calls: int | None
    elapsed_s: int  # whole seconds, as ``app.morning.nightstatus.Progress``
    eta_s: int | None
    eta_low_s: int | None  # the ETA's interval (app.morning.eta)
    eta_high_s: int | None
    eta_level: float | None  # the share the interval held (None: uncalibrated)
    estimating: str | None  # while eta_s is None: "estimating… (why)"


class FailedRow(BaseModel):
    """A ticker of the ranked night without a rank, and why."""

    ticker: str
    status: str
    reason: str


class RankingView(BaseModel):
    """The morning ranking (``/`` and ``/api/ranking``); ``empty`` says why there is none."""

    batch: BatchSummary | None
    rows: list[RankedRow]
    failed: list[FailedRow]
    distribution: dict[str, int]
    reruns_applied: list[int]
    from_reruns: list[str]  # ``app.morning.ranking.from_reruns``: "A from rerun #5"
    running: list[RunningBatch]
    empty: str | None
    night: NightStatus
    changes: NightChanges | None
    # The rating-distribution warnings `nightdesk ranking` prints.
    warnings: list[str]


class NodeRun(BaseModel):
    """One node of one sample of a ticker's run: its text, tokens and calls."""

    position: int
    node: str
    text: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    attempts: int
    latency_s: float | None
    error: str | None  # the last failed call's, for a node without text


class SampleDecision(BaseModel):
    rating: str
    score: float
    confidence: float
    summary: str


class RunSample(BaseModel):
    """One sample of a ticker's run: every node in graph order, and its decision."""

    sample: int
    nodes: list[NodeRun]
    decision: SampleDecision | None


class _NightOf(BaseModel):
    """Which past night a history point is of."""

    as_of: IsoDate
    nightly_batch_id: int


# pydantic orders the fields of bases in reverse MRO: _NightOf's come first, then RankRow's.
class HistoryPoint(RankRow, _NightOf):
    """The ticker's ranking row on one past night (the fields after the first two are
    ``app.morning.ranking.RankRow``'s, in its order)."""


class RunOutcome(BaseModel):
    """How one run of the ticker went, in its batch."""

    state: str
    batch_id: int
    kind: str
    as_of: IsoDate | None
    batch_status: str
    error: str | None


class Tonight(RunOutcome):
    """What the ticker page headlines (see ``_tonight``): the latest outcome, and the
    night's own below it when that is a later rerun's."""

    rated: bool
    tonight: bool
    night: RunOutcome | None = None


class LatestRun(BaseModel):
    batch_id: int
    kind: str
    status: str
    batch_status: str
    as_of: IsoDate | None
    error: str | None


class ShownBatch(BatchSummary):
    """The batch whose nodes the ticker page shows, with the ticker's runs in it."""

    ticker_status: str
    runs: list[RunSample]


class RerunRow(BaseModel):
    """One rerun of the ticker. ``live``: running with a current heartbeat."""

    batch_id: int
    as_of: IsoDate | None
    status: str
    batch_status: str
    error: str | None
    started_at: IsoDatetime | None
    finished_at: IsoDatetime | None
    live: bool


class TickerView(BaseModel):
    """The ticker page's data: its latest run, the batch shown, history and reruns."""

    ticker: str
    latest: LatestRun
    tonight: Tonight
    last_good: HistoryPoint | None
    shown: ShownBatch
    history: list[HistoryPoint]
    reruns: list[RerunRow]
    rerun_running: RerunRow | None


class RunningTicker(BaseModel):
    ticker: str
    status: str
    started_at: IsoDatetime | None


class BatchView(BaseModel):
    """One batch's page (``/batches/{id}``): ``nightdesk report``'s figures and more."""

    batch: BatchSummary
    report: BatchReport
    server: ServerView
    series: SeriesView
    over_time: list[Interval]
    failed_tickers: list[FailedTicker]
    running_tickers: list[RunningTicker]
    progress: Progress | None  # while the batch runs
    # An open mapping: what the server reported about itself, as stored with the batch.
    server_facts: dict[str, Any] | None
    advice: list[Advice]  # the commands that fit it, as the digest and `report` give them


class CompareView(BaseModel):
    """Arms side by side, and each one's gauges over time (by batch id)."""

    arms: list[Arm]
    series: dict[int, SeriesView]


def running_batches(engine: Engine, stale_after_s: float, seen: Seen | None = None
                    ) -> list[RunningBatch]:
    """Return each batch that runs, with its progress and its ETA.

    One still marked running with no sign of life for ``stale_after_s`` has crashed
    (``app.morning.summary.Seen.status``) and is left out: it has no progress to show.
    """
    now = datetime.now(UTC)
    with engine.connect() as conn:
        batches = conn.execute(select(Batch).where(Batch.status == "running")
                               .order_by(Batch.id)).all()
    out, seen = [], seen or Seen(engine)
    for b in batches:
        summary = summarize(b, stale_after_s, now, seen)
        if summary.status != "running":
            continue
        prog = nightstatus.progress(engine, b.id, now, seen)  # as `nightdesk ranking` says
        # The summary's ticker counts, and the progress's figures beside them.
        added = RunningBatch.model_fields.keys() - BatchSummary.model_fields.keys()
        out.append(RunningBatch(**dict(summary), **{k: getattr(prog, k) for k in added}))
    return out


def ranking_view(engine: Engine, settings: Settings) -> RankingView:
    """Return the morning ranking: one finished nightly batch with its reruns, the latest
    night's status, each ticker's change since the night before, and progress.

    The ranking comes from one call to ``app.morning.ranking.ranking``, which reads one batch (and
    the reruns of that batch's own as-of date), so a night still running never mixes in:
    it shows as the night's status and a progress line. The status and the changes come from
    ``app.morning.nightstatus`` and ``app.morning.changes``, as ``nightdesk ranking`` and
    ``nightdesk changes``.
    """
    stale_after_s, seen = settings.batch.heartbeat_stale_s, Seen(engine)  # one per request
    try:
        batch, rows = ranking(engine)
    except InputError as error:
        running = running_batches(engine, stale_after_s, seen)
        status = nightstatus.night_status(engine, settings, None, seen=seen)
        return RankingView(batch=None, rows=[], failed=[], distribution={},
                           reruns_applied=[], from_reruns=[], running=running, empty=str(error),
                           night=status, changes=None, warnings=[])
    # Read after the ranking: a night that finishes in between is then at worst shown as
    # still running beside the night before, never the other way round.
    running = running_batches(engine, stale_after_s, seen)
    status = nightstatus.night_status(engine, settings, batch.id, seen=seen)
    compared = compare_nights(engine, batch.id)
    by_ticker = compared.by_ticker()
    ranked = [r for r in rows if r.rank is not None]
    return RankingView(
        batch=summarize(batch, stale_after_s, engine=seen),
        rows=[ranked_row(r, by_ticker.get(r.ticker)) for r in ranked],
        failed=[FailedRow(ticker=r.ticker, status=r.status, reason=r.summary)
                for r in rows if r.rank is None],
        distribution={name: sum(r.rating == name for r in ranked) for name in RATING_ORDER},
        reruns_applied=sorted({r.batch_id for r in rows if r.batch_id != batch.id}),
        from_reruns=from_reruns(batch.id, rows),
        running=running,
        empty=None,
        night=status,
        changes=compared,
        warnings=warnings_for(engine, batch.id),
    )


def _nodes_of_run(engine: Engine, batch: Batch, ticker: str) -> list[RunSample]:
    """Return, per sample, every node of the run in graph order with its text and its calls."""
    with engine.connect() as conn:
        texts = conn.execute(select(NodeText).where(NodeText.batch_id == batch.id,
                                                    NodeText.ticker == ticker)).all()
        calls = conn.execute(select(LLMCall).where(LLMCall.batch_id == batch.id,
                                                   LLMCall.ticker == ticker)
                             .order_by(LLMCall.started_at, LLMCall.id)).all()
        decisions = {d.sample: d for d in conn.execute(
            select(Decision).where(Decision.batch_id == batch.id, Decision.ticker == ticker))}
    by_key = {(t.sample, t.node): t for t in texts}
    attempts: dict[tuple[int, str], list[Any]] = defaultdict(list)
    for c in calls:
        attempts[(c.sample, c.node)].append(c)
    order = graph_order(BatchSettings.read(batch.settings))
    order += sorted({n for _, n in by_key} - set(order))  # a node this code no longer knows
    samples = sorted({s for s, _ in by_key} | {s for s, _ in attempts} | set(decisions))
    out = []
    for sample in samples:
        nodes = []
        for position, node in enumerate(order, 1):
            text = by_key.get((sample, node))
            tries = attempts.get((sample, node), [])
            tokens = text or (tries[-1] if tries else None)  # without text: the last attempt's
            nodes.append(NodeRun(
                position=position, node=node, text=text.text if text else None,
                prompt_tokens=tokens.prompt_tokens if tokens else None,
                completion_tokens=tokens.completion_tokens if tokens else None,
                finish_reason=text.finish_reason if text else None,
                attempts=len(tries),
                latency_s=round(sum(c.latency_s for c in tries), 2) if tries else None,
                error=next((c.error for c in reversed(tries) if c.status != "ok"), None)
                if not text else None,
            ))
        d = decisions.get(sample)
        out.append(RunSample(sample=sample, nodes=nodes,
                             decision=None if d is None else SampleDecision(
                                 rating=d.rating, score=d.score, confidence=d.confidence,
                                 summary=d.summary)))
    return out


def history_view(engine: Engine, ticker: str, nights: int = HISTORY_NIGHTS
                 ) -> list[HistoryPoint]:
    """Return the ticker's ranked result on each past night, reruns applied as the ranking does."""
    # As-of order, each date's night as the ranking takes it (a date analyzed again last is
    # shown at its date).
    shown = night_of_each_date(engine, Batch.status.in_(FINISHED_STATUSES))[:nights]
    ids = [n.id for n in reversed(shown)]
    with engine.connect() as conn:
        present = set(conn.execute(select(TickerRun.batch_id).where(
            TickerRun.ticker == ticker, TickerRun.batch_id.in_(ids))).scalars())
    points = []
    for batch_id in ids:
        if batch_id not in present:
            continue
        nightly, rows = ranking(engine, batch_id)
        row = next(r for r in rows if r.ticker == ticker)
        points.append(HistoryPoint(as_of=nightly.as_of, nightly_batch_id=batch_id,
                                   **row.model_dump()))
    return points


def _tonight(runs: list[Any], last_good: HistoryPoint | None,
             newest_night: int | None, batch_status: dict[int, str]) -> Tonight:
    """Return what the ticker page headlines: the ticker's newest night, rated or not.

    ``rated``: the ranking of that night has a rating for the ticker (its own, or a rerun's
    applied), which is then ``last_good``; otherwise the latest outcome for that night: a
    later rerun of the same as-of date's (the night's own then in ``night``), else the
    night's, with its state and reason, and the page shows the last good rating below it,
    dated. ``tonight``: that night is the newest nightly batch of all (else the ticker was
    not in it). Without a nightly run, the newest rerun stands in.
    """
    run = next((r for r in runs if r.kind == "nightly"), runs[0])
    rated = last_good is not None and last_good.nightly_batch_id == run.batch_id
    tonight = run.kind == "nightly" and run.batch_id == newest_night
    night = _outcome(run, batch_status)
    # ``runs`` is newest first: the first rerun of the night's date after it is the latest.
    rerun = None if rated else next(
        (r for r in runs if r.kind == "rerun" and r.batch_id > run.batch_id
         and r.as_of == run.as_of), None)
    if rerun is None:
        headline = night.model_copy(update={"state": "rated"}) if rated else night
        return Tonight(**dict(headline), rated=rated, tonight=tonight)
    return Tonight(**dict(_outcome(rerun, batch_status)), rated=False, tonight=tonight,
                   night=night)


def _outcome(run: Any, batch_status: dict[int, str]) -> RunOutcome:
    """Return how ``run`` went, a ticker its batch left running or queued read by the batch."""
    of_batch = batch_status[run.batch_id]
    state, error = ticker_state(run.status, run.error, of_batch)
    if state in IN_FLIGHT:  # still to come in a running batch, else left so
        state = "running" if of_batch == "running" else of_batch  # by one that ended
    return RunOutcome(state=state, batch_id=run.batch_id, kind=run.kind, as_of=run.as_of,
                      batch_status=of_batch, error=error)


def ticker_view(engine: Engine, ticker: str, stale_after_s: float) -> TickerView:
    """Return the ticker's latest run, its nodes, history and reruns; InputError (a 404 on
    the pages and the API) when it has never been run.

    Each batch's status is ``app.morning.summary.Seen.status``'s: a rerun still marked running
    is live while its last sign of life is younger than ``stale_after_s`` (``heartbeat_stale_s``).
    """
    with engine.connect() as conn:
        runs = conn.execute(
            select(TickerRun.status, TickerRun.error, TickerRun.finished_at,
                   TickerRun.started_at, Batch.id.label("batch_id"), Batch.kind, Batch.as_of,
                   Batch.status.label("batch_status"), Batch.heartbeat_at,
                   Batch.started_at.label("batch_started_at"), Batch.settings)
            .join(Batch, Batch.id == TickerRun.batch_id)
            .where(TickerRun.ticker == ticker, Batch.kind.in_(("nightly", "rerun")))
            .order_by(*newest_first())).all()  # newest first as the nights go
        newest_night = conn.execute(nights_newest_first().with_only_columns(Batch.id)
                                    .limit(1)).scalar()
    if not runs:
        raise InputError(f"{ticker} has never been run")
    latest = runs[0]
    # The newest result of a finished batch, as on the ranking page; a newer run (a night
    # still running, or a failed run) is named on the page, not mixed in.
    shown = next((r for r in runs
                  if r.status == "succeeded" and r.batch_status in FINISHED_STATUSES), latest)
    batch = batch_row(engine, shown.batch_id)
    now, seen = datetime.now(UTC), Seen(engine)
    batch_status = {r.batch_id: seen.status(
        r.batch_id, r.batch_status, r.kind, r.settings, r.heartbeat_at, r.batch_started_at,
        stale_after_s, now)[0] for r in runs}
    # A rerun whose process died stays `running` in its row: only a live one blocks another.
    # A ticker a dead batch left running reads interrupted, its row marked or not.
    states = {id(r): ticker_state(r.status, r.error, batch_status[r.batch_id]) for r in runs}
    reruns = [RerunRow(batch_id=r.batch_id, as_of=r.as_of, status=states[id(r)][0],
                       batch_status=batch_status[r.batch_id], error=states[id(r)][1],
                       started_at=r.started_at, finished_at=r.finished_at,
                       live=batch_status[r.batch_id] == "running")
              for r in runs if r.kind == "rerun"]
    history = history_view(engine, ticker)
    last_good = next((p for p in reversed(history) if p.score is not None), None)
    return TickerView(
        ticker=ticker,
        latest=LatestRun(batch_id=latest.batch_id, kind=latest.kind,
                         status=states[id(latest)][0],
                         batch_status=batch_status[latest.batch_id], as_of=latest.as_of,
                         error=states[id(latest)][1]),
        tonight=_tonight(list(runs), last_good, newest_night, batch_status),
        last_good=last_good,
        shown=ShownBatch(**dict(summarize(batch, stale_after_s, now, seen)),
                         ticker_status=states[id(shown)][0],
                         runs=_nodes_of_run(engine, batch, ticker)),
        history=history,
        reruns=reruns[:20],
        rerun_running=next((r for r in reruns if r.live), None),
    )


def batches_view(engine: Engine, stale_after_s: float, limit: int = 200,
                 seen: Seen | None = None) -> list[BatchSummary]:
    """Return the newest batches, newest first, as ``nightdesk batches`` lists them."""
    return list_batches(engine, stale_after_s, limit, seen=seen)


def batch_view(engine: Engine, batch_id: int, stale_after_s: float) -> BatchView:
    """Return one batch's report: throughput, the server's view, series, latency, failures."""
    report = batch_report(engine, batch_id)  # raises InputError for an unknown id
    batch, seen = batch_row(engine, batch_id), Seen(engine)
    summary = summarize(batch, stale_after_s, engine=seen)
    # While the batch runs, its running and queued tickers are under way, not failures. Once
    # it is dead (a crash leaves them marked running), they are interrupted, as `report` says.
    live = summary.status == "running"
    with engine.connect() as conn:
        in_flight = conn.execute(select(TickerRun.ticker, TickerRun.status,
                                        TickerRun.started_at)
                                 .where(TickerRun.batch_id == batch_id,
                                        TickerRun.status.in_(IN_FLIGHT))).all() if live else []
    order = graph_order(BatchSettings.read(batch.settings))
    rank = {name: i for i, name in enumerate(order)}
    report.nodes.sort(key=lambda n: (rank.get(n.node, len(order)), n.node))
    return BatchView(
        batch=summary,
        report=report,
        server=server_view(engine, batch_id),
        series=series_view(engine, batch_id),
        over_time=batch_timeline(engine, batch_id),
        failed_tickers=failed_tickers(engine, batch_id, dead=summary.status == "crashed"),
        running_tickers=[RunningTicker(ticker=t.ticker, status=t.status,
                                       started_at=t.started_at)
                         for t in sorted(in_flight,
                                         key=lambda t: (t.status != "running", t.ticker))],
        progress=nightstatus.progress(engine, batch_id, seen=seen) if live else None,
        server_facts=batch.server_facts,
        advice=next_steps(engine, summary, stale_after_s, seen),
    )


def compare_view(engine: Engine, ids: list[int]) -> CompareView:
    """Return arms side by side (as ``nightdesk report --compare``) with their gauges over time."""
    return CompareView(arms=[compare_arm(engine, i) for i in ids],
                       series={i: series_view(engine, i) for i in ids})
