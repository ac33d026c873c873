"""Run one night: the entry point that `nightdesk run`, the scheduler daemon and the timer share.

Under the single-instance lock: decide the as-of date and universe, run the batch, or
continue a night cut short (``run_nightly(resume=True)``, ``resume_recorded``).
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import date, datetime
from pathlib import Path

import structlog
from sqlalchemy import ColumnElement, Engine, select

from agents.data.snapshot import UNIVERSE, day_dir, latest_as_of
from agents.tickers import choose_tickers, read_universe
from app.batch.engine import BatchEngine, BatchOutcome, BatchPlan
from app.batch.signals import NONE_KEPT, BatchInterrupted, run_batch
from app.config import Settings
from app.db.engine import check_reachable, check_schema, ready_engine
from app.db.lock import LockHold, nightly_lock
from app.db.models import FINISHED_STATUSES, Batch, nights_newest_first
from app.errors import (
    ERRORS,
    AlreadyRunningError,
    DatabaseError,
    InputError,
    SchemaTooNew,
    StorageOutage,
    first_line,
)
from app.morning.advice import advise
from app.morning.digest import send_digest, send_refusal
from app.morning.numbers import counted
from app.morning.summary import batch_summary, rated_by_reruns, tickers_left
from app.recorder.record import Recorder
from app.runs import resumable
from app.runs.checkpoints import Checkpoints
from app.runs.preflight import (
    ServerCheck,
    check_start,
    provider_missing,
    refusal_demo,
    tell_refusal,
)
from serving.facts import batch_server_facts

log = structlog.get_logger(__name__)

# A night in one of these states is owed a resume ("running" is read under the lock only,
# where no live run owns it).
UNFINISHED = ("crashed", "interrupted", "running")
# A "failed" or "partial" night is owed one only with tickers left: stopped by a refused
# key, URL or model, or with tickers the infrastructure failed (app/batch/faults.py).
STOPPED = ("failed", "partial")

# Told which batch is about to be resumed, before it is (the CLI prints it).
Announce = Callable[[resumable.ResumePoint], None] | None
# Told why a night is refused before its batch row exists (run_nightly pushes the digest).
Refused = Callable[[Exception], None] | None
# What a refused night's digest advises once its cause is fixed: this night, now.
START_AGAIN = "nightdesk run --continue-night"
# A run cancelled before its batch row existed (or was reopened) says so.
NOTHING_RECORDED = "interrupted before a batch was created or continued: nothing was recorded"


@dataclass
class NightlyRequest:
    """What one night analyzes; every field left empty takes the settings' default."""

    as_of: date | None = None
    tickers: str | None = None
    universe: Path | None = None
    limit: int | None = None
    samples: int | None = None
    strategy: str = "adaptive"
    command: str | None = None  # the command line that asked for it (the CLI's), if any
    notes: tuple[str, ...] = ()  # what reading its --universe or --tickers said (a duplicate)

    def options(self) -> str:
        """Return the `nightdesk run` options that give this night its tickers and shape
        ("" for the defaults), each after a space."""
        given = (("--tickers", self.tickers), ("--universe", self.universe),
                 ("--limit", self.limit), ("--samples", self.samples),
                 ("--strategy", None if self.strategy == "adaptive" else self.strategy))
        return "".join(f" {option} {shlex.quote(str(value))}" for option, value in given
                       if value is not None)


@dataclass
class NightlyResult:
    """What a nightly run did: its batch's outcome (None: skipped, the night was done)."""

    outcome: BatchOutcome | None
    tickers: int = 0
    resumed: resumable.ResumePoint | None = None  # set when an earlier batch was continued
    covered_by: int | None = None  # skipped: this nightly batch already has the as-of date
    said: str | None = None  # skipped: why, and what to do (the digest's)


def default_as_of(settings: Settings, provider: str | None = None) -> date:
    """Return the as-of date of a run given none: the newest snapshot, or today (live data).
    ``provider``: one other than the settings' (``data show --provider``)."""
    if (provider or settings.agents.data_provider) != "snapshot":
        return date.today()
    newest = latest_as_of(settings.paths.data_dir)
    if newest is None:
        raise InputError(f"no snapshot under {settings.paths.data_dir}: write one first with "
                         "`nightdesk data demo` (DEMO data), or market data (`nightdesk data "
                         "freeze --help` says how)")
    return newest


def nightly_tickers(settings: Settings, as_of: date, tickers: str | None = None,
                    universe: Path | None = None) -> tuple[list[str], list[str]]:
    """Return the night's tickers and notes: the options, else NIGHTDESK_UNIVERSE_FILE,
    else the snapshot's own universe.txt."""
    if tickers is not None or universe is not None:
        return choose_tickers(tickers, universe)
    notes: list[str] = []
    if settings.paths.universe_file is not None:
        return read_universe(settings.paths.universe_file, notes), notes
    if settings.agents.data_provider == "snapshot":
        # A date without a snapshot is said so, rather than "no universe".
        provider_missing(settings, as_of, [])
    snapshot_universe = day_dir(settings.paths.data_dir, as_of) / UNIVERSE
    if settings.agents.data_provider == "snapshot" and snapshot_universe.is_file():
        return read_universe(snapshot_universe, notes), notes
    raise InputError("no universe: give --tickers or --universe, or set "
                     "NIGHTDESK_UNIVERSE_FILE")


def knowing_the_universe(settings: Settings, point: resumable.ResumePoint
                         ) -> resumable.ResumePoint:
    """Return ``point`` with the tickers a new night of its date would take now
    (``nightly_tickers``' rule; None when it has none), so that its advice to analyze the
    date anew names the batch's own tickers only when they differ."""
    try:
        universe: tuple[str, ...] | None = tuple(nightly_tickers(settings, point.as_of)[0])
    except ERRORS:
        universe = None
    return replace(point, universe=universe)


def owed_night(engine: Engine, as_of: date) -> int | None:
    """Return the newest nightly batch of ``as_of`` that is owed a resume (call under the lock)."""
    with engine.connect() as conn:
        candidates = conn.execute(nights_newest_first(
            Batch.as_of == as_of, Batch.status.in_((*UNFINISHED, *STOPPED)))
            .with_only_columns(Batch.id, Batch.status)).all()
    for batch_id, status in candidates:
        if status in UNFINISHED or owes_resume(engine, batch_id):
            return int(batch_id)
    return None


def owes_resume(engine: Engine, batch_id: int) -> bool:
    """Return whether a batch that stopped has tickers ``run --resume`` takes up that the
    ranking would show resumed: not those later reruns it applies have all rated
    (``rated_by_reruns``: the advice passes them by too)."""
    with engine.connect() as conn:
        row = conn.execute(select(Batch.status, Batch.as_of).where(Batch.id == batch_id)).one()
        left = tickers_left(conn, batch_id)
    return bool(left) and not rated_by_reruns(engine, batch_id, row.as_of, row.status, left)


def nightly_of(engine: Engine, as_of: date, *where: ColumnElement[bool]) -> int | None:
    """Return the newest nightly batch of ``as_of`` (``nights_newest_first``) that meets
    ``where`` (none: any)."""
    with engine.connect() as conn:
        return conn.execute(nights_newest_first(Batch.as_of == as_of, *where)
                            .with_only_columns(Batch.id).limit(1)).scalar()


def execute_plan(settings: Settings, engine: Engine,
                 start: BatchPlan | resumable.ResumePoint, lock: LockHold | None = None, *,
                 server: ServerCheck, announce: Announce = None,
                 refused: Refused = None) -> BatchOutcome:
    """Run one batch, from a plan or a resume point, to its final row and send its digest;
    SIGTERM or Ctrl-C stop it interrupted (resumable).

    The preflight (``server``: how far it asks the server; a resumed batch in its own
    shape) raises before any row is written, ``refused`` told first; then a resume is
    ``announce``d, and refused while the usage rows an earlier run kept are under another
    data home. ``lock``: the nightly lock a nightly batch runs under.
    """
    resumed = start if isinstance(start, resumable.ResumePoint) else None
    try:
        check_start(resumed.shaped(settings) if resumed else settings, engine,
                    start.as_of, start.tickers, server=server,
                    budgets_kept=resumed.budgets_kept(settings) if resumed else None)
    except ERRORS as error:
        if refused is not None:
            refused(error)
        raise
    if resumed is not None:
        for key, (own, now) in resumed.kept(settings).items():
            # Kept, not refused (app/runs/resumable.py's KEPT), but never silently.
            log.warning("the resumed batch keeps its own setting", batch_id=resumed.batch_id,
                        setting=f"NIGHTDESK_{key.upper()}", batch=own, now=now)
        if announce is not None:
            announce(resumed)
        resumed.refuse_a_spool_elsewhere(settings)
    runner = BatchEngine(settings, engine, lock=lock, server_facts=batch_server_facts(
        settings.llm.server_profile, settings.llm.url, settings.paths.server_dir,
        settings.llm.router_urls),
        checkpoints=Checkpoints(settings.store.database_url, engine,
                                settings.store.db_statement_timeout_s))
    try:
        outcome = run_batch(runner.run(start, recording=Recorder(engine)), runner.halt,
                            settings.batch.shutdown_grace_s)
        send_digest(settings, engine, outcome)
    except (BatchInterrupted, KeyboardInterrupt):
        raise _cancelled(settings, engine, runner.batch_id) from None
    except StorageOutage as error:
        if runner.batch_id is not None:
            _tell_unstored(settings, start, runner.batch_id, error)
        raise
    except DatabaseError as error:
        if runner.batch_id is None and refused is not None:  # no row: no digest of a batch
            refused(error)
        raise
    return outcome


def _tell_unstored(settings: Settings, start: BatchPlan | resumable.ResumePoint,
                   batch_id: int, error: StorageOutage) -> None:
    """Push that a batch stopped with its end not stored (the database full or away): its
    row still says running, so the digest its end sends is not built; this one says why
    and the resume that continues it. Not a refusal: nothing is stored (it could not be)."""
    what = f"nightly batch #{batch_id}" if start.kind == "nightly" else f"batch #{batch_id}"
    demo = (start.settings.demo_data if isinstance(start, resumable.ResumePoint)
            else refusal_demo(settings, start.as_of))
    send_refusal(settings, start.as_of, first_line(error, 400).split("; resume with")[0],
                 "once the database takes writes again (room on its disk, or back), continue "
                 f"it: nightdesk run --resume {batch_id}", outcome="its end not stored",
                 headline=f"{what} (as of {start.as_of}) STOPPED", demo=demo)


def _cancelled(settings: Settings, engine: Engine, batch_id: int | None) -> BatchInterrupted:
    """Return the error of a run cancelled outright (Ctrl-C pressed until it stopped at
    once): its batch and what to do about it as the digest says it (``advise``), pushing
    that digest; before any batch row, that nothing was recorded."""
    if batch_id is None:
        return BatchInterrupted(NOTHING_RECORDED)
    done: int | None = None  # its tickers finished; None: not read
    try:
        summary = batch_summary(engine, batch_id, settings.batch.heartbeat_stale_s)
        stands, done = summary.status, summary.tickers_succeeded + summary.tickers_failed
        advice = advise(engine, batch_id, settings.batch.heartbeat_stale_s)
    except Exception as error:  # the database away: the batch is still named
        log.warning("cancelled batch not read", batch_id=batch_id, error=first_line(error))
        stands, advice = "interrupted", ""
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C again: no digest, the line stays
        send_digest(settings, engine, BatchOutcome(batch_id, stands))
    # Said of an interrupted batch only where it is true (the engine's ``_with_resume``).
    kept = "" if stands != "interrupted" or done is None else (
        f"; its {counted(done, 'finished ticker')} kept" if done else NONE_KEPT)
    return BatchInterrupted(f"batch {batch_id} {stands}: cancelled at once by the operator"
                            f"{kept}; {advice or f'`nightdesk report {batch_id}` shows it'}")


def _orphans(settings: Settings, engine: Engine) -> None:
    for batch_id in resumable.mark_orphaned(engine, settings.batch.heartbeat_stale_s):
        log.warning("nightly batch without its process marked crashed", batch_id=batch_id)


def run_nightly(settings: Settings, request: NightlyRequest | None = None, *,
                engine: Engine | None = None, resume: bool = False,
                skip_if_finished_since: datetime | None = None, once_per_as_of: bool = False,
                server: ServerCheck = "if_up", announce: Announce = None) -> NightlyResult:
    """Run tonight's batch under the single-instance lock and say what it did.

    ``resume``: continue an unfinished nightly batch of the same date rather than start a
    second. ``skip_if_finished_since``: run nothing when a nightly batch of that date has
    finished since then. ``once_per_as_of``: run nothing when the date has a nightly batch
    at all (``covered_by``), and push a digest saying so. ``server``, ``announce``: as
    ``execute_plan``. A night refused before its batch row exists (the database away, no
    snapshot, no universe, the preflight) pushes a digest naming why and what to do, then
    raises.
    AlreadyRunningError when another run holds the lock, before any row or call.
    """
    request = request or NightlyRequest()
    given = engine
    store = settings.store
    engine = engine or ready_engine(store.database_url, store.db_statement_timeout_s,
                                    store.db_write_budget_s)
    as_of = request.as_of

    def refused(error: Exception) -> None:
        tell_refused(settings, request, error, as_of)

    with contextlib.ExitStack() as held:
        try:
            if given is not None:  # a daemon's, checked at its start: migrated since?
                # Its connections used up by others at the fire are waited for, as mid-night.
                check_reachable(engine, store.db_write_budget_s)
                check_schema(engine)
            lock = held.enter_context(nightly_lock(
                engine, settings.store.db_statement_timeout_s))  # the database away: refused
            _orphans(settings, engine)
            as_of = request.as_of or default_as_of(settings)
            if skip_if_finished_since is not None:
                done = nightly_of(engine, as_of, Batch.status.in_(FINISHED_STATUSES),
                                  Batch.started_at >= skip_if_finished_since)
                # A partial night with tickers the infrastructure failed is not done: it is
                # owed a resume (below) like a night cut short.
                if done is not None and not (resume and owes_resume(engine, done)):
                    log.info("night already done", batch_id=done, as_of=str(as_of))
                    return NightlyResult(None)
            owed = owed_night(engine, as_of) if resume else None
            covered = nightly_of(engine, as_of) if once_per_as_of and owed is None else None
            if covered is not None:
                said = _tell_covered(settings, engine, request, as_of, covered)
                return NightlyResult(None, covered_by=covered, said=said)
            if owed is not None:
                point = knowing_the_universe(settings, resumable.find_resumable(
                    engine, owed, settings.batch.heartbeat_stale_s, closing=True))
            else:
                symbols, notes = nightly_tickers(settings, as_of, request.tickers,
                                                 request.universe)
        except ERRORS as error:
            refused(error)
            raise
        if owed is not None:
            def tell(point: resumable.ResumePoint) -> None:
                log.info("resuming the night", batch_id=point.batch_id, status=point.status,
                         as_of=str(as_of), left=len(point.tickers), finished=point.finished,
                         failed_to_infrastructure=point.infrastructure)
                if announce is not None:
                    announce(point)

            return NightlyResult(execute_plan(settings, engine, point, lock, server=server,
                                              announce=tell, refused=refused),
                                 point.total, point)
        if request.limit and len(symbols) > request.limit:
            # A ticker of the universe left out is news to the morning, as a duplicate is.
            out = symbols[request.limit:]
            notes.append(f"--limit {request.limit} left out {len(out)} of the universe's "
                         f"{len(symbols)} tickers: {', '.join(out[:10])}"
                         + (f" and {len(out) - 10} more" if len(out) > 10 else ""))
        for note in notes:  # the request's own notes were told when its options were read
            log.warning("universe note", note=note)
        notes = [*request.notes, *notes]
        symbols = symbols[:request.limit] if request.limit else symbols
        plan = BatchPlan("nightly", as_of, symbols, request.samples or settings.batch.samples,
                         request.strategy, notes=tuple(notes))
        return NightlyResult(execute_plan(settings, engine, plan, lock, server=server,
                                          refused=refused), len(symbols))


def tell_refused(settings: Settings, request: NightlyRequest, error: Exception,
                 as_of: date | None = None) -> None:
    """Push the digest of a night refused before its batch row exists: ``error``'s line, and
    what to do (the command that starts ``request`` again; ``as_of``: its date, once known).
    Another run holding the lock (AlreadyRunningError) is no refusal."""
    if isinstance(error, AlreadyRunningError):
        return
    # The command as it was given starts the same night again: a plain `run` analyzes its
    # date again even where a night of it finished or was cut short, which
    # `--continue-night` would not (it runs nothing, or continues the old batch). A night
    # with no command line of its own (the daemon's) is owed what the timer runs.
    command = request.command or (
        START_AGAIN + (f" --as-of {request.as_of}" if request.as_of else ""))
    again = command or "the same `nightdesk run` command as before"
    fix = ("make the database reachable and writable (its server up, its disk not full, "
           "NIGHTDESK_DATABASE_URL right)" if isinstance(error, DatabaseError) else "fix that")
    if isinstance(error, SchemaTooNew):  # its line says what to do; its schema takes no row
        fix = "do as it says"
    tell_refusal(settings, as_of or request.as_of, first_line(error, 400),
                 f"{fix}, then start the night again: {again}", command=command,
                 store=not isinstance(error, SchemaTooNew))


def _tell_covered(settings: Settings, engine: Engine, request: NightlyRequest, as_of: date,
                  covered: int) -> str:
    """Push that the night was not run: its as-of date has a nightly batch; return that
    in one line (the CLI prints it, the daemon logs ``covered_by``). Its command to analyze
    the date again takes the request's own tickers and shape; first comes what the morning
    advises that night (``advise``: a failed one's tickers again in it, a partial one's
    reruns)."""
    stale_s = settings.batch.heartbeat_stale_s
    status = batch_summary(engine, covered, stale_s).status
    failed = status == "failed"
    done = f"of as-of {as_of} failed" if failed else f"has already analyzed as-of {as_of}"
    why = f"nightly batch #{covered} {done}, and there is no newer data to analyze"
    first = advise(engine, covered, stale_s) if status in ("failed", "partial") else ""
    what = ((f"{first}. Else " if first else "")
            + "write newer data for the next night (`nightdesk data freeze --help`), or "
            f"analyze {as_of} again now: `nightdesk run --as-of {as_of}{request.options()}` "
            "(NIGHTDESK_SCHEDULE_REPEAT_AS_OF=true lets the scheduler do so at each fire)")
    # Nothing was refused: the date was analyzed. Told once per date and batch (a daemon
    # fires each hour or night on the same snapshot); no command: newer data, or the date again.
    did = f"already run: nightly batch #{covered} failed" if failed else \
        f"already analyzed by nightly batch #{covered}"
    tell_refusal(settings, as_of, why, what, outcome="nothing run",
                 headline=f"night of {as_of} {did}", level="warning" if first else "info",
                 once=True)
    return f"{why}: nothing run; {what}"


def resume_recorded(settings: Settings, engine: Engine, batch_id: int | None = None, *,
                    server: ServerCheck = "if_up", announce: Announce = None,
                    retry_failed: bool = False) -> NightlyResult:
    """Continue a recorded batch (``nightdesk run --resume [BATCH_ID]``).

    ``batch_id`` None: the newest batch with tickers left, chosen under the nightly lock
    once batches that lost their process are marked crashed. A nightly batch resumes under
    that lock (AlreadyRunningError while another run holds it); a rerun takes none, and one
    whose heartbeat is fresh is refused the same way. ``retry_failed`` also runs the
    tickers that failed on their own account again.
    """
    again = retry_failed
    if batch_id is not None and resumable.pick(engine, batch_id)[1] != "nightly":
        return _resume(settings, engine, batch_id, server, announce, None, retry_failed=again)
    with nightly_lock(engine, settings.store.db_statement_timeout_s) as lock:
        _orphans(settings, engine)
        target, kind = resumable.pick(engine, batch_id, retry_failed=again)
        if kind == "nightly":
            return _resume(settings, engine, target, server, announce, lock, retry_failed=again,
                           nightly=True)
    return _resume(settings, engine, target, server, announce, None, retry_failed=again)


def _resume(settings: Settings, engine: Engine, batch_id: int, server: ServerCheck,
            announce: Announce, lock: LockHold | None, retry_failed: bool = False,
            nightly: bool = False) -> NightlyResult:
    """Continue batch ``batch_id``; a ``nightly`` one refused at its start (the server down
    or serving another model) pushes a digest naming why and the resume to run again."""
    point = knowing_the_universe(settings, resumable.find_resumable(
        engine, batch_id, settings.batch.heartbeat_stale_s, retry_failed=retry_failed))
    again = f"nightdesk run --resume {batch_id}" + (" --retry-failed" if retry_failed else "")

    def refused(error: Exception) -> None:
        tell_refusal(settings, point.as_of, first_line(error, 400),
                     f"fix that, then continue it: {again}", command=again,
                     outcome=f"batch #{batch_id} not continued",
                     demo=point.settings.demo_data)  # as the batch is labelled

    return NightlyResult(execute_plan(settings, engine, point, lock, server=server,
                                      announce=announce, refused=refused if nightly else None),
                         point.total, point)
