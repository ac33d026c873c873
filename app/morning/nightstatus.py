"""The latest night's status, for the ranking page, ``nightdesk ranking`` and the digest.

One reading of what is stored (batch rows, ticker runs, call counts, refusals, the scheduler
daemon's heartbeat row) and of the schedule: the night (``app.db.models.nights_newest_first``)
whatever its outcome, ``none`` when no nightly batch was ever created (advised the first
night), or ``stale`` when the schedule's last due time passed (plus
``schedule_start_grace_s``) with no nightly batch created since, naming the refusal since
then that no night superseded (a night refused at its start leaves no batch, only that row);
whether the ranking shown is that night's, and if not why (a succeeded night is not fresh
once a night of a newer date was refused since, which the reason names); a running night's
progress and ETA (``app.morning.eta``, as the live progress computes it); when the next night
is due; and whether the daemon's heartbeat is current. Nothing here writes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic.dataclasses import dataclass
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from app.config import Batch as BatchConfig
from app.config import Settings
from app.db.batchsettings import BatchSettings
from app.db.models import Batch, NightRefusal, SchedulerBeat, TickerRun, nights_newest_first
from app.morning import eta
from app.morning.advice import Advice, first_night, missed_night, next_steps
from app.morning.summary import BatchSummary, IsoDate, IsoDatetime, Seen, summarize, when
from app.morning.timetable import due_times, nightly_trigger

# Statuses the morning can name; "stale": the schedule's due time passed without a batch;
# "none": no nightly batch was ever created here (a new install, or another database).
STATUSES = ("succeeded", "partial", "failed", "interrupted", "crashed", "running", "stale",
            "none")
# A night that stopped short, whose resume a refusal may have met since.
STOPPED = ("failed", "interrupted", "crashed", "partial")
# What the morning says of a database with no night at all.
NO_NIGHT = "no night has run yet"
# Exit code of `nightdesk ranking --require-fresh` when the ranking is older than the night.
STALE_EXIT = 6
# Heartbeats a running night may miss before the morning stops showing a time left.
QUIET_BEATS = 2
# The heartbeat interval of a batch that did not record its own (older rows).
BEAT_S = BatchConfig.model_fields["heartbeat_interval_s"].default
@dataclass(frozen=True)
class NightBatch:
    """One nightly batch as the morning names it."""

    id: int
    as_of: IsoDate
    status: str
    created_at: IsoDatetime
    started_at: IsoDatetime | None
    finished_at: IsoDatetime | None
    heartbeat_at: IsoDatetime | None
    tickers_total: int
    tickers_succeeded: int
    tickers_failed: int
    error: str | None
    duration_s: float | None  # as ``app.morning.summary.duration_s`` defines it


@dataclass(frozen=True)
class Progress:
    """A running batch's progress: tickers, calls, and the time left with its interval."""

    tickers_done: int  # succeeded or failed
    tickers_failed: int
    tickers_running: int
    tickers_total: int
    calls: int  # calls answered (a node of a sample of a ticker), not attempts
    expected_calls: int | None
    elapsed_s: int  # whole seconds
    eta_s: int | None  # app.morning.eta: never 0 while a call is left; None: no basis yet
    eta_low_s: int | None = None
    eta_high_s: int | None = None
    eta_level: float | None = eta.LEVEL  # the interval's (``eta.Reading.level``)
    # While eta_s is None: "estimating… (why)", or "unknown: no word from the night…".
    estimating: str | None = None


@dataclass(frozen=True)
class SchedulerHeartbeat:
    """The newest heartbeat of a ``nightdesk scheduler`` daemon."""

    host: str
    pid: int
    beat_at: IsoDatetime
    next_run_at: IsoDatetime | None
    schedule: str
    current: bool  # younger than heartbeat_stale_s


@dataclass(frozen=True)
class Refusal:
    """A night refused at its start (``app.runs.preflight.tell_refusal``), as its digest said."""

    refused_at: IsoDatetime
    as_of: IsoDate | None
    title: str  # "night of 2026-11-27 REFUSED at its start, no batch run"
    why: str
    advice: str  # what to do, in words
    command: str | None  # the command in the advice, where it names one


@dataclass(frozen=True)
class NightStatus:
    """The latest night, and whether the ranking shown is that night's."""

    status: str  # one of STATUSES
    headline: str  # one line naming the latest night and how it went
    latest: NightBatch | None  # the newest nightly batch, whatever its outcome
    progress: Progress | None  # while the latest night runs
    ranked: NightBatch | None  # the night the ranking shows
    fresh: bool  # the ranking shows the latest night, and no due night is missing
    reason: str | None  # when not fresh: why the ranking is older than the latest night
    advice: list[Advice]  # the commands that fit the latest night (``app.morning.advice``)
    due_at: IsoDatetime | None  # the schedule's last due time
    next_due_at: IsoDatetime | None
    schedule: str
    scheduler: SchedulerHeartbeat | None  # None: no daemon has ever beaten (timer path)
    checked_at: IsoDatetime
    # The newest refusal since the due time and the latest night's start (a night that
    # starts later supersedes it): why a stale morning is stale. None: none stands.
    refused: Refusal | None = None


def _night(summary: BatchSummary) -> NightBatch:
    """Return the batch as ``app.morning.summary.summarize`` names it (status, error, duration)."""
    return NightBatch(**summary.model_dump(include=set(NightBatch.__dataclass_fields__)))


def silence(batch: Any, now: datetime, alive_at: datetime | None = None) -> str | None:
    """Return "no word from the night for N s" when a running batch has given no sign of
    life (its heartbeat, else its start; ``alive_at``: ``Seen.alive_at``'s) for
    ``QUIET_BEATS`` heartbeats (at the interval it recorded), else None: work may be going
    on, but no one can say, so no time left is shown as if it were."""
    beat = max((moment for moment in (batch.heartbeat_at or batch.started_at, alive_at)
                if moment is not None), default=None)
    every = BatchSettings.read(batch.settings).heartbeat_interval_s or BEAT_S
    quiet = 0.0 if beat is None else (now - beat).total_seconds()
    return (f"unknown: no word from the night for {span(quiet)}"
            if quiet > QUIET_BEATS * every else None)


def progress(engine: Engine, batch_id: int, now: datetime | None = None,
             seen: Seen | None = None) -> Progress:
    """Return a batch's progress from its rows; the ETA as ``BatchProgress`` reads it, none
    while the night is silent (``silence``, its signs of life read of ``seen``, the
    request's where it has one)."""
    now = now or datetime.now(UTC)
    with engine.connect() as conn:
        batch = conn.execute(select(Batch).where(Batch.id == batch_id)).one()
        running = conn.execute(select(func.count()).select_from(TickerRun)
                               .where(TickerRun.batch_id == batch_id,
                                      TickerRun.status == "running")).scalar_one()
    done = batch.tickers_succeeded + batch.tickers_failed
    elapsed = (now - batch.started_at).total_seconds() if batch.started_at else 0.0
    found = eta.reading(engine, batch_id, now)
    calls = (batch.tickers_total, found.calls_done, found.calls_expected, round(elapsed))
    silent = silence(batch, now, (seen or Seen(engine)).alive_at(
        batch.id, batch.kind, batch.settings))
    if silent is not None:
        return Progress(done, batch.tickers_failed, running, *calls, None, estimating=silent)
    return Progress(done, batch.tickers_failed, running, *calls,
                    found.whole(found.eta_s), found.whole(found.eta_low_s),
                    found.whole(found.eta_high_s), found.level, found.estimating)


def interval(low_s: int | None, high_s: int | None, level: float | None = eta.LEVEL) -> str:
    """Show the ETA's interval with the share of replayed readings it held (``level``,
    ``eta.Reading.level``): `` (75% interval: 10 min 05 s – 15 min 40 s)``; ``level`` None:
    `` (uncalibrated range: …)``, a rule no recorded night tested; empty without one."""
    if low_s is None or high_s is None or low_s == high_s:
        return ""
    what = "uncalibrated range" if level is None else f"{level:.0%} interval"
    return f" ({what}: {span(low_s)} – {span(high_s)})"


def time_left(prog: Progress) -> str:
    """Show a running batch's ETA with its interval: ``about 12 min 30 s (75% interval:
    10 min 05 s – 15 min 40 s)``; without a basis, ``estimating… (why)``."""
    if prog.eta_s is None:
        return prog.estimating or eta.ESTIMATING
    return f"about {span(prog.eta_s)}{interval(prog.eta_low_s, prog.eta_high_s, prog.eta_level)}"


def describe(night: NightBatch, prog: Progress | None = None) -> str:
    """Return one line naming a nightly batch and its outcome."""
    head = f"nightly batch #{night.id} (as of {night.as_of}) {night.status}"
    if night.status == "running" and prog is not None:
        eta = (f", {time_left(prog)} left" if prog.eta_s is not None
               else f", time left {time_left(prog)}")
        return (f"{head}: {prog.tickers_done} of {prog.tickers_total} tickers done "
                f"({prog.tickers_running} running, {prog.tickers_failed} failed), "
                f"{prog.calls} calls{eta}")
    if night.status in ("succeeded", "partial"):
        return (f"{head}: {night.tickers_succeeded} of {night.tickers_total} tickers, "
                f"finished {when(night.finished_at)}")
    why = f": {night.error}" if night.error else ""
    return (f"{head}{why} ({night.tickers_succeeded} of {night.tickers_total} tickers "
            f"succeeded)")


def span(seconds: float | None) -> str:
    """Show seconds as ``1 h 02 min``, ``3 min 20 s`` or ``12 s`` (the pages' format too);
    under a second but some, ``<1 s`` (a rerun's "over 0 s of calls" read as none)."""
    if seconds is None:
        return "—"
    if 0 < seconds < 1:
        return "<1 s"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s} s"


def latest_beat(engine: Engine, stale_s: float, now: datetime) -> SchedulerHeartbeat | None:
    """Return the newest scheduler daemon heartbeat, and whether it is current."""
    with engine.connect() as conn:
        row = conn.execute(select(SchedulerBeat).order_by(SchedulerBeat.beat_at.desc())
                           .limit(1)).first()
    if row is None:
        return None
    return SchedulerHeartbeat(row.host, row.pid, row.beat_at, row.next_run_at, row.schedule,
                              (now - row.beat_at).total_seconds() <= stale_s)


def _latest(engine: Engine) -> Batch | None:
    """Return this morning's night whatever its outcome (``nights_newest_first``)."""
    with Session(engine) as session:
        return session.scalars(nights_newest_first().limit(1)).first()


def standing_refusal(engine: Engine, latest: NightBatch | None, due_at: datetime | None,
                     since: datetime | None = None, again: bool = False) -> Refusal | None:
    """Return the newest refusal after ``due_at`` and after ``since`` (default: when the
    latest night was created); ``again``: only one that names a command to run again."""
    since = since or (latest.created_at if latest is not None else None)
    after = [NightRefusal.refused_at > since] if since is not None else []
    if again:
        after.append(NightRefusal.command.is_not(None))
    if due_at is not None:
        after.append(NightRefusal.refused_at >= due_at)
    with Session(engine) as session:
        row = session.scalars(select(NightRefusal).where(*after)
                              .order_by(NightRefusal.refused_at.desc()).limit(1)).first()
    return None if row is None else Refusal(row.refused_at, row.as_of, row.title, row.why,
                                            row.advice, row.command)


def _batch(engine: Engine, batch_id: int) -> Batch | None:
    with engine.connect() as conn:
        return conn.execute(select(Batch).where(Batch.id == batch_id)).first()  # type: ignore[return-value]


def night_status(engine: Engine, settings: Settings, ranked_id: int | None,
                 now: datetime | None = None, seen: Seen | None = None) -> NightStatus:
    """Return the latest night's status against the ranking of batch ``ranked_id``.

    ``ranked_id`` is the batch the ranking shows (None: there is no ranking). Each batch's
    status is ``app.morning.summary.Seen.status``'s: one still marked running with no sign of
    life for ``heartbeat_stale_s`` is ``crashed``, as everywhere else.
    """
    now = now or datetime.now(UTC)
    due_at, next_due_at = due_times(nightly_trigger(settings), now)
    stale_s = settings.batch.heartbeat_stale_s
    row, seen = _latest(engine), seen or Seen(engine)
    summary = None if row is None else summarize(row, stale_s, now, seen)
    latest = None if summary is None else _night(summary)
    ranked_row = None if ranked_id is None else _batch(engine, ranked_id)
    ranked = None if ranked_row is None else _night(summarize(ranked_row, stale_s, now, seen))
    prog: Progress | None = None
    status = "stale"
    if latest is not None:
        status = latest.status if latest.status in STATUSES else "running"
        if status == "running":
            prog = progress(engine, latest.id, now, seen)
    missed = (due_at is not None
              and now >= due_at + timedelta(seconds=settings.schedule.start_grace_s)
              and (latest is None or latest.created_at < due_at) and status != "running")
    if missed:
        status = "stale"
    if latest is None:
        status = "none"
    schedule = f"{settings.schedule.cron} ({nightly_trigger(settings).timezone})"
    refused = None
    if status in ("stale", "none"):
        refused = standing_refusal(engine, latest, due_at)
    elif latest is not None and status in STOPPED:
        # A resume of the night refused at its start since it last ran (the server still
        # down): what refused it is the news the digest told, so the morning tells it too.
        # A fire that found the night's date analyzed (``run --continue-night`` of a night
        # owed no resume) refused no resume: its row names no command to run again, and the
        # night's own line and advice are the news (``again``).
        refused = standing_refusal(engine, latest, due_at, since=latest.finished_at
                                   or latest.heartbeat_at or latest.created_at, again=True)
    elif latest is not None and status == "succeeded":
        # A newer night refused since this one (its snapshot missing, the server down, within
        # the due time's grace or off the schedule): the ranking is older than the night
        # asked for. A refusal of this date or an older one leaves this ranking the newest.
        newer = standing_refusal(engine, latest, due_at)
        if newer is not None and (newer.as_of is None or newer.as_of > latest.as_of):
            refused = newer
    if status == "none":
        headline = "this database holds no nightly batch"
    elif status == "stale":
        since = f"since the night due {when(due_at)}" if due_at else "yet"
        headline = f"no nightly batch {since}"  # the refusal, if any: in ``reason``, once
        if latest is not None:
            headline += f"; the latest is {describe(latest)}"
    else:
        assert latest is not None
        headline = describe(latest, prog)
    fresh = ranked is not None and latest is not None and ranked.id == latest.id \
        and status not in ("stale", "none") and not (status == "succeeded" and refused)
    reason = None if fresh else _reason(status, latest, ranked, prog, due_at, refused)
    advice = [] if summary is None else next_steps(engine, summary, stale_s, seen)
    if refused is not None and refused.command is not None:
        # What refused it is the news; the latest batch's own advice is older.
        advice = [Advice(refused.command, "runs the refused command again; first fix what "
                                          "refused it")]
    elif status == "none":
        advice = first_night(settings)
    elif status == "stale" and not advice:
        # No batch came when due, and the latest leaves nothing to do: the night itself is
        # owed, unless a fire found its date analyzed (a notice, no command: that fire's
        # `--continue-night` again would only say so).
        advice = missed_night(settings, None if latest is None else latest.as_of,
                              None if refused is None else refused.as_of)
    return NightStatus(status, headline, latest, prog, ranked, fresh, reason, advice, due_at,
                       next_due_at, schedule,
                       latest_beat(engine, settings.batch.heartbeat_stale_s, now), now, refused)


def refusal_line(refused: Refusal) -> str:
    """Name a standing refusal: ``night of … REFUSED … (when): why``, as every face says it
    (the status's reason, and the lists of batches, where it has no row)."""
    return f"{refused.title} ({when(refused.refused_at)}): {refused.why}"


def _refused(refused: Refusal | None) -> str:
    """Name a standing refusal after a stale line: ``; night of … REFUSED …(when): why``."""
    return "" if refused is None else f"; {refusal_line(refused)}"


def _reason(status: str, latest: NightBatch | None, ranked: NightBatch | None,
            prog: Progress | None, due_at: datetime | None,
            refused: Refusal | None = None) -> str:
    """Say in one line why the ranking shown is not the latest night's."""
    if status == "none":
        return f"{NO_NIGHT}{_refused(refused)}"
    if status == "stale":
        shown = ("" if ranked is None
                 else f"; this ranking is of {ranked.as_of} (batch #{ranked.id})")
        since = f"since the night due {when(due_at)}" if due_at else "yet"
        return f"stale: no nightly batch {since}{_refused(refused)}{shown}"
    assert latest is not None
    shown = ("no finished night to rank" if ranked is None
             else f"this ranking is of {ranked.as_of} (batch #{ranked.id})")
    what = {"running": "is still running", "failed": "failed",
            "interrupted": "was interrupted", "crashed": "crashed"}.get(status, status)
    detail = ""
    if status == "running" and prog is not None:
        detail = f" ({prog.tickers_done} of {prog.tickers_total} tickers done)"
    elif latest.error:
        detail = f": {latest.error}"
    return (f"the latest night, batch #{latest.id} (as of {latest.as_of}), {what}{detail}"
            f"{_refused(refused)}; {shown}")
