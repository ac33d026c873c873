"""Find batches that died or stopped early, and the one a resume continues: its
``ResumePoint``, which the engine reopens the batch through.

A ``running`` batch is dead once its heartbeat is stale (``mark_stale_crashed``), or, for a
nightly one, once its lock is free and its holder gone (``mark_orphaned``). Which tickers a
resume takes up is one rule (``app.morning.summary.tickers_left``): finished tickers stay as
they are, the others continue from their last checkpointed node. A ticker failed to the
infrastructure (app/batch/faults.py) is not finished; one failed on its own account is,
unless the resume is asked to ``retry_failed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select, update

from app.batch.engine import BatchPlan
from app.config import Settings, SettingsSnapshot
from app.db import retry
from app.db.batchsettings import BatchSettings
from app.db.lock import holder_gone
from app.db.models import INFRASTRUCTURE, Batch, LLMCall, TickerRun, newest_first
from app.db.runner import Runner
from app.errors import AlreadyRunningError, DatabaseError, InputError, NoNightYet
from app.morning.summary import (
    DIED,
    FINISHED_TICKER,
    RESUMABLE_KINDS,
    Seen,
    last_alive,
    last_calls,
    rerun_since,
    tickers_left,
)
from app.traffic.strategy import Strategy
from app.usage import spool_path

# A batch in one of these states may still have tickers to do.
RESUMABLE = ("interrupted", "crashed", "failed", "partial")
# Statuses that are no end the batch wrote for its work: a resume with nothing left closes it.
UNENDED = ("interrupted", "crashed")

# The recorded settings that give a night's answers their meaning (``Settings.snapshot``'s
# keys; sampling's are recorded as one group), and how a resume treats each: one check,
# ``ResumePoint.shaped``. Those nightdesk itself makes, a resume keeps as the batch
# recorded them, whatever the settings say now, as it keeps its samples and strategy:
# the graph's shape, the sampling, the request seeds.
KEPT = ("debate_rounds", "risk_rounds", "node_max_tokens", "request_seeds", "temperature",
        "top_p", "top_k", "presence_penalty", "enable_thinking")
# Those that come from outside it cannot be kept: the server answers with the model it
# serves, the provider has the data it has. Changed after the batch had answers, a resume
# would mix two nights in one, so it is refused. Not the server's profile, its URL or the
# concurrency cap: how the model is served (a longer max-model-len, say) is a fix, not
# another night.
MATCHED = {"model": "llm_model", "data_provider": "data_provider"}


@dataclass(frozen=True)
class ResumePoint:
    """A batch to continue: what it was, and the tickers it has left (the engine's
    ``Resume``)."""

    batch_id: int
    kind: str
    as_of: date
    label: str | None
    settings: BatchSettings
    tickers: list[str]  # left to do, in the batch's order
    finished: int  # tickers already finished (succeeded, or failed for good)
    status: str  # how it stood before this resume
    infrastructure: int = 0  # of ``tickers``: failed to the infrastructure, taken up again
    retried: int = 0  # of ``tickers``: failed on their own, taken up as asked
    answered: int = 0  # the batch's calls the server answered so far
    planned: tuple[str, ...] = ()  # all the batch's tickers, in its order
    # The tickers a new night of its date would take now (`run --as-of`, no --tickers: the
    # caller that knows the universe's rule says, app/runs/nightly.py); None: not known.
    universe: tuple[str, ...] | None = None

    @property
    def total(self) -> int:
        return self.finished + len(self.tickers)

    def plan(self) -> BatchPlan:
        """Return the batch's plan: its tickers left, its samples and strategy as recorded."""
        return BatchPlan(self.kind, self.as_of, self.tickers, self.settings.samples or 1,
                         self.settings.strategy or "adaptive", self.label)

    def shaped(self, settings: Settings) -> Settings:
        """Return the settings the batch resumes with: ``settings`` with its recorded
        ``KEPT`` values. InputError (one line, naming both values and the ways out) when
        a ``MATCHED`` one differs, the batch has answers made under the recorded one and
        tickers left to ask more (with none, the resume only writes its end)."""
        recorded, now = _flat(self.settings), _flat(settings.snapshot())
        changed = [key for key in MATCHED if key in recorded and recorded[key] != now[key]]
        if changed and self.answered and self.tickers:
            key = changed[0]
            name = f"NIGHTDESK_{MATCHED[key].upper()}"
            raise InputError(
                f"batch {self.batch_id} ran with {key} {recorded[key]!r} ({self.answered} "
                f"answers), and {name} is now {now[key]!r}: a resume would mix the two in one "
                f"night; continue it with {name}={recorded[key]}, or analyze {self.as_of} "
                f"anew under {now[key]!r}: `{self.anew(settings)}`")
        return settings.updated(**{key: recorded[key] for key in KEPT if key in recorded})

    def kept(self, settings: Settings) -> dict[str, tuple[Any, Any]]:
        """Return the ``KEPT`` settings whose recorded value ``settings`` would change:
        name -> (the batch's, the settings'); the resume runs with the batch's."""
        recorded, now = _flat(self.settings), _flat(settings.snapshot())
        return {key: (recorded[key], now[key]) for key in KEPT
                if key in recorded and recorded[key] != now[key]}

    def budgets_kept(self, settings: Settings) -> str | None:
        """Say that the batch's output budgets are its own and the way out of them (None:
        it recorded none, and the settings' apply): what a refusal advises instead of
        lowering NIGHTDESK_NODE_MAX_TOKENS, which a resume would not read."""
        if self.settings.node_max_tokens is None:
            return None
        return (f"batch {self.batch_id} keeps the NIGHTDESK_NODE_MAX_TOKENS it ran with; "
                f"analyze {self.as_of} anew with lower ones: `{self.anew(settings)}`")

    def anew(self, settings: Settings) -> str:
        """Return the command that analyzes the batch's date again as a new batch of the
        same tickers, samples and strategy under ``settings``: the options a new start
        would otherwise take from elsewhere are given (the universe's tickers, or the
        first N of them, unless they are the batch's own; NIGHTDESK_SAMPLES)."""
        samples = self.settings.samples or 1
        if self.kind == "rerun" and self.planned:
            also = f" --samples {samples}" if samples != 1 else ""
            return f"nightdesk rerun {self.planned[0]} --as-of {self.as_of}{also}"
        chosen, universe = list(self.planned), list(self.universe or ())
        if self.universe is not None and chosen == universe:
            picks = ""
        elif self.universe is not None and chosen and chosen == universe[:len(chosen)]:
            picks = f" --limit {len(chosen)}"
        else:
            picks = f" --tickers {','.join(chosen)}"
        also = f" --samples {samples}" if samples != settings.batch.samples else ""
        strategy = self.settings.strategy or "adaptive"
        also += f" --strategy {strategy}" if strategy != "adaptive" else ""
        return f"nightdesk run --as-of {self.as_of}{picks}{also}"

    def refuse_a_spool_elsewhere(self, settings: Settings) -> None:
        """Raise DatabaseError (one line, the batch untouched) when the usage rows an earlier
        run kept are in a spool under that run's data home and ``settings``' home is another.

        The spool is found by its home (an operator's shell beside the units'
        /var/lib/nightdesk): resumed there, the batch would end without those rows and leave
        the file, saying nothing."""
        home = self.settings.home
        if home is None or Path(home) == settings.paths.home:
            return
        url = settings.store.database_url
        theirs = spool_path(Path(home), url, self.batch_id)
        if theirs.exists():
            raise DatabaseError(
                f"batch {self.batch_id}'s usage rows not stored are kept in {theirs}, under "
                f"NIGHTDESK_HOME={home}: resume it with that NIGHTDESK_HOME (or move the file "
                f"to {spool_path(settings.paths.home, url, self.batch_id)})")

    @retry.retried
    def reopen(self, engine: Engine, recorded: BatchSettings) -> None:
        """Set the batch running again and its tickers left queued for another attempt;
        ``recorded``: what this run records of its settings (its data home among them),
        over what the last run recorded."""
        now = datetime.now(UTC)
        with engine.begin() as conn:
            settings = self.settings.updated(**recorded.model_dump(exclude_unset=True),
                                             resumes=[*self.settings.resumes, now],
                                             runner=Runner.current()).stored()
            conn.execute(update(Batch).where(Batch.id == self.batch_id)
                         .values(status="running", heartbeat_at=now, finished_at=None,
                                 error=None, settings=settings))
            conn.execute(update(TickerRun)
                         .where(TickerRun.batch_id == self.batch_id,
                                TickerRun.ticker.in_(self.tickers))
                         .values(status="queued", error=None, failure_class=None,
                                 finished_at=None, attempt=TickerRun.attempt + 1))
            # The failed tickers taken up again are no longer counted failed.
            conn.execute(update(Batch).where(Batch.id == self.batch_id).values(
                tickers_failed=select(func.count()).select_from(TickerRun)
                .where(TickerRun.batch_id == self.batch_id, TickerRun.status == "failed")
                .scalar_subquery()))

    def ended(self, engine: Engine) -> tuple[list[str], dict[str, str]]:
        """Return the batch's tickers that succeeded, and those that failed with their
        error."""
        with engine.connect() as conn:
            rows = conn.execute(select(TickerRun.ticker, TickerRun.status, TickerRun.error)
                                .where(TickerRun.batch_id == self.batch_id,
                                       TickerRun.status.in_(FINISHED_TICKER))
                                .order_by(TickerRun.id)).all()
        return ([r.ticker for r in rows if r.status == "succeeded"],
                {r.ticker: r.error or "failed" for r in rows if r.status == "failed"})


def _flat(recorded: SettingsSnapshot) -> dict[str, Any]:
    """Return the settings recorded (those a row holds) with the sampling group's keys
    beside the others."""
    held = recorded.model_dump(exclude_unset=True)
    return {**held, **(held.get("sampling") or {})}


@retry.retried
def mark_stale_crashed(engine: Engine, stale_s: float, seen: Seen | None = None) -> list[int]:
    """Mark ``running`` batches whose heartbeat is older than ``stale_s`` crashed, unless
    they show another sign of life (``Seen.status``, as every view reads them: a night
    whose heartbeat is held up lives on); return their ids. ``seen``: the command's."""
    now, seen = datetime.now(UTC), seen or Seen(engine)
    cutoff = now - timedelta(seconds=stale_s)
    # Typed as the column, so the driver's value reads back as the stored moment.
    beat = func.coalesce(Batch.heartbeat_at, Batch.started_at,
                         type_=Batch.__table__.c.heartbeat_at.type)
    with engine.connect() as conn:
        rows = conn.execute(select(Batch.id, Batch.kind, Batch.settings, Batch.heartbeat_at,
                                   Batch.started_at)
                            .where(Batch.status == "running", beat < cutoff)).all()
    dead = {int(row.id): why for row in rows for status, why in [seen.status(
        row.id, "running", row.kind, row.settings, row.heartbeat_at, row.started_at, stale_s,
        now)] if status == "crashed" and why is not None}
    # Each one's end as the views read it (its lock's holder's last statement included).
    ends = {int(row.id): seen.last_alive(row.id, row.kind, row.settings, row.heartbeat_at,
                                         row.started_at) for row in rows if row.id in dead}
    if dead:
        with engine.begin() as conn:
            _crash(conn, dead, ends)
    return list(dead)


@retry.retried
def mark_orphaned(engine: Engine, stale_s: float) -> list[int]:
    """Mark ``running`` nightly batches whose process is gone crashed; return their ids.

    Call under the nightly lock. One whose run may be alive (``holder_gone``: a database
    restart let its lock go) raises AlreadyRunningError.
    """
    with engine.connect() as conn:
        running = conn.execute(select(Batch.__table__).where(Batch.kind == "nightly",
                                                             Batch.status == "running")).all()
    orphans: dict[int, str] = {}
    ends: dict[int, datetime | None] = {}
    now, seen = datetime.now(UTC), Seen(engine)
    for batch in running:
        # Its signs of life as every view weighs them (a call after a held-up heartbeat).
        alive_at = seen.alive_at(batch.id, batch.kind, batch.settings)
        why = holder_gone(engine, batch, stale_s, alive_at)
        if why is None:
            raise AlreadyRunningError(
                f"already running: batch {batch.id} (the nightly lock was free, but its run "
                "may be alive and taking it again after a database restart)")
        # Where the views read it dead, their reason, in their words, is the one stored.
        _, said = seen.status(batch.id, "running", batch.kind, batch.settings,
                              batch.heartbeat_at, batch.started_at, stale_s, now)
        orphans[int(batch.id)] = said or why
        ends[int(batch.id)] = last_alive(batch.started_at, batch.heartbeat_at, alive_at)
    if orphans:
        with engine.begin() as conn:
            _crash(conn, orphans, ends)
    return list(orphans)


def _crash(conn: Any, why: dict[int, str], ends: dict[int, datetime | None] | None = None
           ) -> None:
    """Mark ``running`` batches crashed, each with its reason; their open tickers interrupted.

    A crashed batch finished when it was last alive (``ends``: ``Seen.last_alive``, as every
    view read it before it was marked; else ``last_alive``: the later of its last heartbeat
    and its last call's end, else its start), not when a later start or ``report`` happened
    to find it dead.
    """
    calls = last_calls(conn, why)
    for batch_id, error in why.items():
        row = conn.execute(select(Batch.started_at, Batch.heartbeat_at)
                           .where(Batch.id == batch_id)).one()
        end = (ends or {}).get(batch_id) or last_alive(row.started_at, row.heartbeat_at,
                                                       calls.get(batch_id))
        conn.execute(update(Batch).where(Batch.id == batch_id, Batch.status == "running")
                     .values(status="crashed", finished_at=end,
                             error=f"{error}; resume with `nightdesk run --resume {batch_id}`"))
    conn.execute(update(TickerRun)
                 .where(TickerRun.batch_id.in_(list(why)),
                        TickerRun.status.in_(("queued", "running")))
                 .values(status="interrupted", error=DIED))


@retry.retried
def _crash_if_gone(engine: Engine, batch_id: int) -> None:
    """Mark the batch crashed when it is ``running`` and its process, on this host, is gone
    (a rerun takes no lock: its heartbeat alone would keep its resume refused, the one a
    stop whose end was not stored advises, until it went stale)."""
    with engine.begin() as conn:
        row = conn.execute(select(Batch.status, Batch.settings)
                           .where(Batch.id == batch_id)).one()
        runner = BatchSettings.read(row.settings).runner
        if row.status == "running" and runner is not None and runner.alive() is False:
            _crash(conn, {batch_id: f"its process {runner.pid} is gone"})


def pick(engine: Engine, batch_id: int | None, *, retry_failed: bool = False
         ) -> tuple[int, str]:
    """Return the batch ``run --resume`` means, and its kind: ``batch_id``, else the newest
    interrupted, crashed or stopped batch with tickers left (those failed on their own
    count with ``retry_failed``)."""
    with engine.connect() as conn:
        if batch_id is None:
            # The one order of nights (``newest_first``): the latest date's first.
            candidates = conn.execute(
                select(Batch.id, Batch.kind).where(Batch.status.in_(RESUMABLE),
                                                   Batch.kind.in_(RESUMABLE_KINDS))
                .order_by(*newest_first())).all()
            for candidate, kind in candidates:
                if tickers_left(conn, candidate, retry_failed):
                    return int(candidate), str(kind)
            if not candidates:  # said apart: "every … has finished" of none is untrue
                raise NoNightYet("no batch to resume: none ended short (interrupted, "
                                 "crashed, failed or partial)")
            raise InputError("no batch to resume: every interrupted, crashed or stopped batch "
                             "has finished all its tickers"
                             + ("" if retry_failed else " (tickers failed on their own "
                                "account are finished: add --retry-failed to run them again)"))
        kind = conn.execute(select(Batch.kind).where(Batch.id == batch_id)).scalar()
    if kind is None:
        raise InputError(f"no batch with id {batch_id}")
    if kind not in RESUMABLE_KINDS:
        raise InputError(f"batch {batch_id} is a {kind} batch: only nightly and rerun "
                         "batches resume")
    return batch_id, str(kind)


def _failed_said(engine: Engine, batch: Any, failed: dict[str, str | None]) -> str:
    """Say what of a batch with no tickers left failed on its own account: the retry that
    runs them again; those a later rerun rated (a partial night's: the ranking shows that
    rating over any retry's, as the advice knows) by that rerun, with no retry."""
    rated = (rerun_since(engine, batch.id, batch.as_of)
             if (batch.kind, batch.status) == ("nightly", "partial") else {})
    again = [ticker for ticker in failed if ticker not in rated]
    said = "".join(f"; {ticker} failed, rated since by rerun #{rated[ticker]}"
                   for ticker in failed if ticker in rated)
    if again:
        said += (f"; {len(again)} failed on their own account: `nightdesk run --resume "
                 f"{batch.id} --retry-failed` runs them again")
    return said


def find_resumable(engine: Engine, batch_id: int | None, stale_s: float, *,
                   closing: bool = False, retry_failed: bool = False) -> ResumePoint:
    """Return the batch to resume: ``batch_id``, or the newest one with tickers left.

    A ``running`` batch raises AlreadyRunningError (the dead ones are marked first: a
    stale heartbeat, or a process on this host that is gone), one
    whose stored strategy this version cannot run (a removed knob) InputError.
    ``closing`` also takes one with no tickers left: the resume only writes its end.
    ``retry_failed`` takes up the tickers failed on their own account too.
    """
    batch_id, _ = pick(engine, batch_id, retry_failed=retry_failed)
    _crash_if_gone(engine, batch_id)
    with engine.connect() as conn:
        batch = conn.execute(select(Batch.__table__).where(Batch.id == batch_id)).one()
        if batch.status == "running":
            beat = batch.heartbeat_at or batch.started_at or batch.created_at
            age = (datetime.now(UTC) - beat).total_seconds()
            raise AlreadyRunningError(
                f"already running: batch {batch_id} (heartbeat {age:.0f} s ago; it is taken "
                f"for dead after {stale_s:.0f} s without one)")
        left = tickers_left(conn, batch_id, retry_failed)
        ended = conn.execute(select(TickerRun.ticker, TickerRun.status, TickerRun.failure_class)
                             .where(TickerRun.batch_id == batch_id,
                                    TickerRun.status.in_(FINISHED_TICKER))).all()
        failed = {r.ticker: r.failure_class for r in ended if r.status == "failed"}
        answered = conn.execute(select(func.count()).select_from(LLMCall).where(
            LLMCall.batch_id == batch_id, LLMCall.status == "ok")).scalar_one()
        planned = tuple(conn.execute(select(TickerRun.ticker).where(
            TickerRun.batch_id == batch_id).order_by(TickerRun.id)).scalars())
        # One stopped short with every ticker ended (its end not stored, cut between its last
        # ticker and its end, or a write that landed after its halt gave up on it) is
        # closed: the resume writes the end it lacks.
        if not left and not closing and batch.status not in UNENDED:
            raise InputError(f"batch {batch_id} ({batch.status}) has no tickers left to run"
                             + ("" if retry_failed else _failed_said(engine, batch, failed)))
    try:
        Strategy.parse(BatchSettings.read(batch.settings).strategy or "adaptive")
    except InputError as error:
        raise InputError(f"batch {batch_id} cannot resume: {error}") from None
    infrastructure = len([t for t in left if failed.get(t) == INFRASTRUCTURE])
    retried = len([t for t in left if t in failed]) - infrastructure
    return ResumePoint(batch_id, batch.kind, batch.as_of, batch.label,
                       BatchSettings.read(batch.settings), left,
                       len(ended) - infrastructure - retried, batch.status, infrastructure,
                       retried, int(answered), planned)
