"""What a batch was and how it went, from its rows: status, as-of, tickers n/m, duration,
and the tickers that did not succeed with their errors.

One summary for ``nightdesk batches``, the head of ``nightdesk report``, ``nightdesk
ranking``, the pages, the API, the morning digest and the metrics, so they all say the same:
``status_of`` is the one place a batch's status is read, ``duration_s`` the one duration.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, computed_field
from sqlalchemy import Connection, Engine, Select, and_, func, or_, select

from app.db.batchsettings import BatchSettings
from app.db.lock import NightlyLockView, run_gone
from app.db.models import (
    FINISHED_STATUSES,
    INFRASTRUCTURE,
    Batch,
    Decision,
    LLMCall,
    TickerRun,
    batch_row,
    newest_first,
)
from app.db.models import RESUMABLE_KINDS as RESUMABLE_KINDS

# Ticker states that are no failure: done, or not reached yet by a batch still running.
NOT_FAILED = ("succeeded", "queued", "running")
DIED = "the batch's process died"  # a dead batch's unfinished ticker's error
# Ticker states ``run --resume`` leaves as they are (the kinds of batch it takes: app/db).
FINISHED_TICKER = ("succeeded", "failed")


def status_of(status: str, heartbeat_at: datetime | None, started_at: datetime | None,
              stale_s: float, now: datetime, gone: str | None = None,
              alive_at: datetime | None = None) -> str:
    """Return a batch's status as every command, page and message names it.

    The stored status, except that a batch still marked ``running`` is ``crashed`` when its
    process is known gone (``gone``: ``app.db.lock.run_gone``'s reason, at once) or its last
    sign of life is older than ``stale_s`` (``heartbeat_stale_s``): the later of its
    heartbeat (else its start) and ``alive_at`` (``Seen.alive_at``: its last call's end, its
    lock's holder's last statement), so a night whose heartbeat is held up but that still
    works reads running. The next start marks a dead one so (``app.runs.resumable``).
    """
    if status != "running":
        return status
    if gone is not None:
        return "crashed"
    signs = [moment for moment in (heartbeat_at or started_at, alive_at) if moment is not None]
    if signs and (now - max(signs)).total_seconds() > stale_s:
        return "crashed"
    return status


def last_calls(conn: Connection, batch_ids: Iterable[int]) -> dict[int, datetime]:
    """Return the end of each batch's last usage row (``llm_calls``), in one query; a batch
    with none is left out."""
    return dict(conn.execute(select(LLMCall.batch_id, func.max(LLMCall.ended_at))
                             .where(LLMCall.batch_id.in_(list(batch_ids)))
                             .group_by(LLMCall.batch_id)).tuples().all())


def last_alive(started_at: datetime | None, heartbeat_at: datetime | None,
               last_call_at: datetime | None) -> datetime | None:
    """Return when a crashed batch was last alive: the later of its last heartbeat and its
    last usage row's end (calls end between beats, and a night killed before its first beat
    has only its calls), else its start. Its stored end (``app.runs.resumable``) and every
    view's duration (``duration_s``) are this."""
    signs = [moment for moment in (heartbeat_at, last_call_at) if moment is not None]
    return max(signs) if signs else started_at


class Seen:
    """What summaries read beyond their batches' rows, each read once however many batches
    one request shows: the nightly lock (``NightlyLockView``: for ``run_gone``, and its
    holder's last statement) and each batch's last usage row's end (``last_alive``).
    ``status`` is the one reading of a batch's status that every surface makes."""

    def __init__(self, engine: Engine | None) -> None:
        self.engine = engine
        self.lock = NightlyLockView(engine)
        self._ends: dict[int, datetime | None] = {}

    @classmethod
    def of(cls, engine: Engine | Seen | None) -> Seen:
        return engine if isinstance(engine, Seen) else cls(engine)

    def read_ends(self, batch_ids: Iterable[int]) -> None:
        """Read the last usage row's end of those of ``batch_ids`` not read yet (one query)."""
        ids = set(batch_ids) - self._ends.keys()
        if self.engine is not None and ids:
            with self.engine.connect() as conn:
                found = last_calls(conn, ids)
            self._ends.update({batch_id: found.get(batch_id) for batch_id in ids})

    def last_call_at(self, batch_id: int) -> datetime | None:
        self.read_ends([batch_id])
        return self._ends.get(batch_id)

    def alive_at(self, batch_id: int, kind: str, settings: Mapping[str, Any] | None
                 ) -> datetime | None:
        """Return the batch's last sign of life besides its heartbeat: the later of its last
        call's end (a call ends only in a live process) and, for a nightly batch whose
        runner holds the nightly lock, that holder's last statement (it tries its heartbeat
        on the lock's connection even while the batch row is held: PostgreSQL, where this
        role may read it). None: neither is known."""
        runner = BatchSettings.read(settings).runner
        signs = [self.last_call_at(batch_id),
                 self.lock.holder_active_at(runner)
                 if kind == "nightly" and runner is not None else None]
        return max((moment for moment in signs if moment is not None), default=None)

    def last_alive(self, batch_id: int, kind: str, settings: Mapping[str, Any] | None,
                   heartbeat_at: datetime | None, started_at: datetime | None
                   ) -> datetime | None:
        """Return when a batch that reads crashed was last alive: ``last_alive`` of every
        sign ``status`` weighs (its heartbeat, ``alive_at``), else its start. Its end on
        every surface, the moment its reason names, and its stored end once marked."""
        return last_alive(started_at, heartbeat_at, self.alive_at(batch_id, kind, settings))

    def status(self, batch_id: int, status: str, kind: str, settings: Mapping[str, Any] | None,
               heartbeat_at: datetime | None, started_at: datetime | None, stale_s: float,
               now: datetime) -> tuple[str, str | None]:
        """Return a batch's status (``status_of``) and, where it reads ``crashed`` while its
        row says ``running``, why: its process gone (``run_gone``), else no sign of life
        for ``stale_s``. The signs beyond the heartbeat are read only when it is stale."""
        if status != "running":
            return status, None
        beat = heartbeat_at or started_at
        gone = run_gone(self.lock, kind, settings, beat)
        alive_at = None
        if gone is None and beat is not None and (now - beat).total_seconds() > stale_s:
            alive_at = self.alive_at(batch_id, kind, settings)
            # A runner alive on this host: a forward step of the wall clock since its beat
            # is no silence of its own (a live night was read, and marked, crashed).
            runner = BatchSettings.read(settings).runner
            now -= timedelta(seconds=runner.stepped_s() if runner is not None else 0.0)
        read = status_of(status, heartbeat_at, started_at, stale_s, now, gone, alive_at)
        if read == status:
            return read, None
        return read, gone or died_since(last_alive(started_at, heartbeat_at, alive_at))


def duration_s(started_at: datetime | None, end: datetime | None, now: datetime
               ) -> float | None:
    """Return a batch's duration: start to ``end`` (``ended_at``), to now while it runs
    (``end`` None); None before it started. The one definition every page, command and
    digest shows."""
    if started_at is None:
        return None
    return max(0.0, ((end or now) - started_at).total_seconds())


def ended_at(batch: Any, status: str, seen: Seen) -> datetime | None:
    """Return when a batch ended (None while it runs, ``status`` as ``Seen.status`` reads
    it): one still ``running`` in its row that reads crashed ended when it was last alive
    (``Seen.last_alive``), as its row says once a start or ``report`` marks it so
    (``app.runs.resumable``); any other its stored end (else its last heartbeat)."""
    if status == "running":
        return None
    if batch.status == "running":  # it reads crashed, its row not marked yet
        return seen.last_alive(batch.id, batch.kind, batch.settings, batch.heartbeat_at,
                               batch.started_at)
    return batch.finished_at or batch.heartbeat_at


# A resume hint inside a stored error: "; resume with `nightdesk run --resume 5`",
# "; `nightdesk run --resume` completes the batch", "(`nightdesk run --resume 5` continues it)".
_HINT = re.compile(r"[;,]?\s*(?:resume with\s+)?`nightdesk run --resume(?: \d+)?`"
                   r"(?:\s+(?:continues it|completes the batch))?")


def plain_error(error: str | None) -> str | None:
    """Return a stored error without the resume hint its writer added (None stays None):
    the advice (``app.morning.advice``) names the command that fits, once."""
    if error is None:
        return None
    return _HINT.sub("", error).strip() or None


def when(moment: datetime | None) -> str:
    """Show a moment as ``YYYY-MM-DD HH:MM UTC`` (None: —)."""
    return "—" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _iso(value: date) -> str:
    return value.isoformat()


IsoDate = Annotated[date, PlainSerializer(_iso, return_type=str, when_used="json")]
"""A date (``IsoDatetime``: a time with its offset) written by ``isoformat()`` in JSON.

nightdesk's JSON writes UTC as ``+00:00``, not as pydantic's ``Z``: every model of its
JSON types its dates and times with these two."""
IsoDatetime = Annotated[datetime, PlainSerializer(_iso, return_type=str, when_used="json")]


class BatchSummary(BaseModel):
    """One batch as the operator reads it: ``nightdesk batches``, the head of ``report``,
    every page's and ``/api/…``'s batch, the digest and the metrics (one serializer: the
    model's JSON, its fields in this order). ``duration_s``: see ``duration_s()``;
    ``tickers``: "n/m", tickers succeeded of tickers planned."""

    model_config = ConfigDict(frozen=True)

    id: int
    kind: str
    label: str | None
    status: str
    as_of: IsoDate
    created_at: IsoDatetime | None
    started_at: IsoDatetime | None
    finished_at: IsoDatetime | None  # ``ended_at``: a dead night's too, marked or not
    heartbeat_at: IsoDatetime | None
    duration_s: float | None
    tickers: str
    tickers_total: int
    tickers_succeeded: int
    tickers_failed: int
    error: str | None
    demo: bool  # the engine marks batches run on DEMO data
    samples: int | None
    model: str | None
    server_profile: str | None
    strategy: str | None
    source_batch_id: int | None  # a replay's recorded batch
    # What reading its universe said (a duplicate removed, tickers `--limit` left out):
    # the ranking, the report and the digest show them.
    notes: list[str] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def outcome(self) -> str:
        """The tickers' outcome in the one sentence the digest, report and page all show:
        succeeded of planned, failed, and (once the batch stopped) those not finished."""
        said = (f"{self.tickers_succeeded} of {self.tickers_total} tickers succeeded, "
                f"{self.tickers_failed} failed")
        unfinished = self.tickers_total - self.tickers_succeeded - self.tickers_failed
        return said + (f", {unfinished} not finished"
                       if unfinished and self.status != "running" else "")

    @classmethod
    def csv_fields(cls) -> tuple[str, ...]:
        """Return the JSON's keys, computed ones too: the header of ``batches --format csv``."""
        return (*cls.model_fields, *cls.model_computed_fields)


@dataclass(frozen=True)
class FailedTicker:
    ticker: str
    status: str  # failed | interrupted
    error: str | None
    # The later rerun whose rating the ranking shows for this failed ticker (``rerun_since``;
    # /metrics counts it "rerun", the advice passes it by); None: none.
    rated_by: int | None = None

    def said(self) -> str:
        """Its status as every list of a batch's failures says it: ``failed``, ``failed,
        rated since by rerun #3``, ``interrupted``."""
        return self.status + (f", rated since by rerun #{self.rated_by}"
                              if self.rated_by is not None else "")


def died_since(alive: datetime | None) -> str:
    """Return the error of a batch last alive at ``alive`` (``Seen.last_alive``: its last
    heartbeat or call, whichever came later): the same words whether a view reads it so or
    a command has stored it (``mark_stale_crashed``)."""
    return f"no sign of life since {when(alive)}: its process has died"


def summarize(batch: Any, stale_s: float, now: datetime | None = None,
              engine: Engine | Seen | None = None) -> BatchSummary:
    """Return the summary of a ``batches`` row (an ORM object or a selected row) at ``now``.

    Its status is ``status_of``'s (a running batch whose process is gone, ``run_gone`` asked
    of ``engine`` where given, or without a heartbeat for ``stale_s`` is ``crashed``, its
    error says why); its duration ``duration_s``'s (a crashed one's end read of ``engine``);
    its error ``plain_error``'s. A request that shows several batches gives each one ``Seen``.
    """
    now = now or datetime.now(UTC)
    settings = BatchSettings.read(batch.settings)
    seen = Seen.of(engine)
    status, why = seen.status(batch.id, batch.status, batch.kind, batch.settings,
                              batch.heartbeat_at, batch.started_at, stale_s, now)
    error = why or plain_error(batch.error)
    end = ended_at(batch, status, seen)
    return BatchSummary(
        id=batch.id, kind=batch.kind, label=batch.label, status=status,
        as_of=batch.as_of, created_at=batch.created_at, started_at=batch.started_at,
        finished_at=end, heartbeat_at=batch.heartbeat_at,
        duration_s=duration_s(batch.started_at, end, now),
        tickers=f"{batch.tickers_succeeded or 0}/{batch.tickers_total or 0}",
        tickers_total=batch.tickers_total or 0,
        tickers_succeeded=batch.tickers_succeeded or 0,
        tickers_failed=batch.tickers_failed or 0, error=error,
        demo=settings.demo_data, samples=settings.samples, model=settings.model,
        server_profile=settings.server_profile, strategy=settings.strategy,
        source_batch_id=batch.source_batch_id, notes=settings.universe_notes)


def batch_summary(engine: Engine, batch_id: int, stale_s: float, seen: Seen | None = None
                  ) -> BatchSummary:
    """Return one batch's summary; InputError when there is no such batch. ``seen``: the
    request's, where it has one."""
    return summarize(batch_row(engine, batch_id), stale_s, engine=seen or engine)


def list_batches(engine: Engine, stale_s: float, limit: int = 20, kind: str | None = None,
                 seen: Seen | None = None) -> list[BatchSummary]:
    """Return the newest ``limit`` batches (of ``kind`` when given) in the one order of
    nights (``app.db.models.newest_first``: the latest as-of date first), as the ranking
    and the night's status read them (``seen``: the request's, which its status reads too)."""
    stmt = select(Batch).order_by(*newest_first()).limit(limit)
    if kind is not None:
        stmt = stmt.where(Batch.kind == kind)
    now = datetime.now(UTC)
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    seen = seen or Seen(engine)
    seen.read_ends(row.id for row in rows if row.status == "running")
    return [summarize(row, stale_s, now, seen) for row in rows]


def ticker_state(status: str, error: str | None, batch_status: str) -> tuple[str, str | None]:
    """Return a ticker run's status and error as every surface reads them: one its batch
    left queued or running reads as the crashed marking (``app.runs.resumable``) makes it
    once the batch reads crashed (``batch_status``), before its row is marked as after:
    interrupted, because its process died; any other as stored (``plain_error``)."""
    if batch_status == "crashed" and status in ("queued", "running"):
        return "interrupted", DIED
    return status, plain_error(error)


def failed_tickers(engine: Engine, batch_id: int, dead: bool = False) -> list[FailedTicker]:
    """Return the batch's tickers that ended without a result, with the error recorded.

    Tickers still queued or running in a batch that runs are not failures and are left out.
    In a ``dead`` one (it reads crashed, its row not marked yet) they are what the crashed
    marking (``app.runs.resumable``) makes them: interrupted, because its process died.
    """
    with engine.connect() as conn:
        rows = conn.execute(select(TickerRun.ticker, TickerRun.status, TickerRun.error)
                            .where(TickerRun.batch_id == batch_id,
                                   TickerRun.status != "succeeded" if dead
                                   else TickerRun.status.not_in(NOT_FAILED))
                            .order_by(TickerRun.ticker)).all()
        batch = conn.execute(select(Batch.kind, Batch.status, Batch.as_of)
                             .where(Batch.id == batch_id)).first()
    # The ranking applies later reruns to a ranked night (a failed or cut-short one is
    # none), and to any rerun's tickers.
    redone = rerun_since(engine, batch_id, batch.as_of) if batch is not None and rows and (
        batch.kind == "rerun" or batch.status in FINISHED_STATUSES) else {}
    return [FailedTicker(r.ticker, *ticker_state(r.status, r.error, "crashed" if dead else ""),
                         rated_by=redone.get(r.ticker) if r.status == "failed" else None)
            for r in rows]


def tickers_left(conn: Connection, batch_id: int, retry_failed: bool = False) -> list[str]:
    """Return the batch's tickers ``run --resume`` takes up, in the batch's order: those not
    finished, those the infrastructure failed, and with ``retry_failed`` every failed one.

    The one rule: ``app.runs.resumable`` resumes these, and ``app.morning.advice`` advises a resume
    only when there are some.
    """
    failed = TickerRun.status == "failed"
    again = failed if retry_failed else and_(failed, TickerRun.failure_class == INFRASTRUCTURE)
    return list(conn.execute(
        select(TickerRun.ticker)
        .where(TickerRun.batch_id == batch_id,
               or_(TickerRun.status.not_in(FINISHED_TICKER), again))
        .order_by(TickerRun.id)).scalars())


def applied_reruns(nightly_id: int, as_of: date) -> Select[tuple[Batch]]:
    """Return the query of the reruns the ranking of nightly batch ``nightly_id`` applies:
    those that succeeded, of its as-of date, started after it; oldest first."""
    return (select(Batch).where(Batch.kind == "rerun", Batch.status == "succeeded",
                                Batch.as_of == as_of, Batch.id > nightly_id)
            .order_by(Batch.id))


def rated_by_reruns(engine: Engine, batch_id: int, as_of: date, status: str,
                    left: Iterable[str]) -> bool:
    """Return whether later reruns the ranking applies have rated every one of a partial
    batch's tickers ``left`` (``tickers_left``): resumed, they would run again in it while the
    ranking went on showing the reruns' ratings, so neither the advice nor the timer's
    ``--continue-night`` takes them up (an explicit ``run --resume N`` still does)."""
    tickers = set(left)
    return (status == "partial" and bool(tickers)
            and tickers <= rerun_since(engine, batch_id, as_of).keys())


def rerun_since(engine: Engine, nightly_id: int, as_of: date) -> dict[str, int]:
    """Return the tickers of batch ``nightly_id`` that a rerun it would apply has redone
    (a rerun's: those a later rerun of its date has), each with the newest such rerun (the
    one whose rating the ranking shows)."""
    reruns = applied_reruns(nightly_id, as_of).with_only_columns(Batch.id).subquery()
    with engine.connect() as conn:
        rows = conn.execute(select(Decision.ticker, func.max(Decision.batch_id)).where(
            Decision.batch_id.in_(select(reruns.c.id))).group_by(Decision.ticker))
        return {ticker: rerun for ticker, rerun in rows}
