"""Run the nightly batch on a cron schedule: the ``nightdesk scheduler`` daemon (APScheduler 3).

The schedule lives in the project's database (APScheduler's ``apscheduler_jobs`` table), so a
host that was off at the scheduled time runs the missed night once when it comes back, within
the grace time; ``coalesce`` folds several missed nights into that one run. The job store
creates that table itself, and no migration does: its columns are APScheduler's to change
between releases, it holds nothing but the schedule's state (lost, the daemon only computes
the next run afresh), and only databases that run the daemon need it. The job runs in
the scheduler's own (main) thread: a batch then handles SIGTERM exactly as ``nightdesk run``
does, and two runs in one daemon can never overlap. Across daemons and timers, the nightly
lock is what keeps a night single; a second daemon on the same database is refused at its
start (exit 4) by the scheduler lock the first holds for its life (app/db/lock.py). While it
serves, a thread of its own writes the daemon's heartbeat (``scheduler_heartbeats``), which
the morning's status reads (app/morning/nightstatus.py), and proves that lock at each beat.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from types import FrameType
from typing import Any

import structlog
from apscheduler.events import (
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    EVENT_JOB_SUBMITTED,
    EVENT_SCHEDULER_STARTED,
    JobEvent,
    SchedulerEvent,
)
from apscheduler.executors.debug import DebugExecutor
from apscheduler.job import Job
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers import SchedulerNotRunningError
from apscheduler.schedulers.blocking import BlockingScheduler
from sqlalchemy import Engine, delete, insert, update

from app.batch.signals import BatchInterrupted
from app.config import Settings
from app.db.engine import SchemaWatch
from app.db.lock import LockHold, scheduler_lock
from app.db.models import SchedulerBeat
from app.errors import ERRORS, AlreadyRunningError
from app.morning.nightstatus import span
from app.morning.summary import when
from app.morning.timetable import NightlyTrigger, schedule_zone
from app.runs.nightly import START_AGAIN, NightlyResult, run_nightly
from app.runs.preflight import tell_refusal

log = structlog.get_logger(__name__)

JOB_ID = "nightdesk-nightly"
# The level a finished night is logged at; any other outcome is an error.
NIGHT_LEVELS = {"succeeded": logging.INFO, "partial": logging.WARNING}
JOBS_TABLE = "apscheduler_jobs"

NightRunner = Callable[..., NightlyResult]
"""run_nightly's shape; tests give a recording stand-in."""

# Set by the executor around each run: which daemon runs it, and for which scheduled time.
_daemon: contextvars.ContextVar[NightlyDaemon] = contextvars.ContextVar("nightdesk_daemon")
_fire_time: contextvars.ContextVar[datetime] = contextvars.ContextVar("nightdesk_fire_time")


def _not_missed(record: logging.LogRecord) -> bool:
    """Keep a record unless it is APScheduler's warning of a missed run (3.11's run_job)."""
    return "was missed by" not in str(record.msg)


def scheduled_night() -> None:
    """Run the nightly job for the daemon whose executor called it (APScheduler's entry)."""
    _daemon.get().run_night(_fire_time.get())


class InlineExecutor(DebugExecutor):
    """Run each job in the thread that processes the schedule, telling it its fire time."""

    def __init__(self, daemon: NightlyDaemon) -> None:
        super().__init__()
        self.daemon = daemon

    def _do_submit_job(self, job: Job, run_times: list[datetime]) -> None:
        contextvars.copy_context().run(self._submit_in, job, run_times)

    def _submit_in(self, job: Job, run_times: list[datetime]) -> None:
        _daemon.set(self.daemon)
        _fire_time.set(run_times[-1])
        super()._do_submit_job(job, run_times)


class Heartbeat:
    """Write the daemon's ``scheduler_heartbeats`` row every ``interval_s`` while open.

    A thread of its own beats while a night runs in the scheduler's thread, so the morning
    page can tell a live daemon from a dead one. Each beat also proves the daemon's lock
    (``hold``, set while it serves); ``on_lost`` is called once another daemon has taken it.
    Closing stops the thread, waits for it and deletes this daemon's row: a daemon that
    stopped is no silent one (``/metrics`` drops its heartbeat; one that died leaves it).
    While ``schema`` (default: its own watch) finds a revision this install does not know,
    it writes nothing, its row deleted at the close included: every fire is refused then,
    so its beat ages on every face as a daemon's that serves no night, and that schema's
    tables are no longer this code's to write. It beats again once the revision is known.
    """

    def __init__(self, engine: Engine, interval_s: float,
                 next_run: Callable[[], datetime | None], schedule: str,
                 schema: SchemaWatch | None = None) -> None:
        self.hold: LockHold | None = None
        self.on_lost: Callable[[], None] = lambda: None
        self.engine = engine
        self.schema = schema or SchemaWatch(engine)
        self.refused = ""  # the schema's line while it stops the beats
        self.interval_s = interval_s
        self.next_run = next_run
        self.schedule = schedule
        self.host = socket.gethostname()[:255]
        self.started_at = datetime.now(UTC)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nightdesk-heartbeat",
                                        daemon=True)

    def beat(self) -> None:
        """Store one heartbeat: this host's row, created or updated."""
        try:
            next_run = self.next_run()
        except Exception:  # the scheduler shutting down under us: no next run to tell
            next_run = None
        values = {"pid": os.getpid(), "started_at": self.started_at,
                  "beat_at": datetime.now(UTC), "next_run_at": next_run,
                  "schedule": self.schedule[:200]}
        with self.engine.begin() as conn:
            changed = conn.execute(update(SchedulerBeat)
                                   .where(SchedulerBeat.host == self.host).values(values))
            if changed.rowcount == 0:
                conn.execute(insert(SchedulerBeat).values(host=self.host, **values))

    def _schema_known(self) -> bool:
        """Return whether the schema's revision is one this install knows; say once when
        that changes (the line: SchemaTooNew's, what every fire is refused with)."""
        said = self.schema.refusal()
        if said and not self.refused:
            log.error("scheduler heartbeat stopped: every night is refused", error=said)
        elif self.refused and not said:
            log.info("scheduler heartbeat resumed: the schema's revision is known again")
        self.refused = said
        return not said

    def nudge(self) -> None:
        """Beat now rather than at the next interval (the next run time has changed)."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self.hold is not None and not self.hold.keep():
                    log.warning("scheduler lock not proven (database away?)")
            except AlreadyRunningError:
                log.error("scheduler lock taken by another daemon; stopping")
                self.on_lost()
                return
            try:
                if self._schema_known():
                    self.beat()
            except Exception as error:  # a missed beat is not worth stopping the daemon
                log.warning("scheduler heartbeat not stored", error=str(error))
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()
        if self.refused:  # its tables are not this code's: the beat is left to age
            return
        try:
            with self.engine.begin() as conn:
                conn.execute(delete(SchedulerBeat).where(SchedulerBeat.host == self.host,
                                                         SchedulerBeat.pid == os.getpid()))
        except Exception as error:  # the database away at the stop: the beat then ages
            log.warning("scheduler heartbeat not removed", error=str(error))


class NightlyDaemon:
    """Own one APScheduler whose single job runs tonight's batch through ``run_nightly``."""

    def __init__(self, settings: Settings, engine: Engine, *,
                 runner: NightRunner = run_nightly) -> None:
        self.settings = settings
        self.engine = engine
        self.runner = runner
        self.zone, self.zone_source = schedule_zone(settings)
        self.trigger = NightlyTrigger.from_crontab(settings.schedule.cron, timezone=self.zone)
        self.scheduler = BlockingScheduler(
            timezone=self.zone,
            executors={"default": InlineExecutor(self)},
            job_defaults={"coalesce": True, "max_instances": 1,
                          "misfire_grace_time": settings.schedule.misfire_grace_s},
        )
        self.store = SQLAlchemyJobStore(engine=engine, tablename=JOBS_TABLE)
        self.scheduler.add_jobstore(self.store)
        self.scheduler.add_listener(self._started, EVENT_SCHEDULER_STARTED)
        self.scheduler.add_listener(self._missed, EVENT_JOB_MISSED)
        # _missed says a missed night (and pushes its digest): APScheduler's own warning of
        # it would be the same fault a second time, in its words. Its other records stand.
        logging.getLogger("apscheduler.executors.default").addFilter(_not_missed)
        self.scheduler.add_listener(self._after_run, EVENT_JOB_SUBMITTED | EVENT_JOB_MAX_INSTANCES)
        self.heartbeat = Heartbeat(engine, settings.batch.heartbeat_interval_s, self.next_run_time,
                                   f"{settings.schedule.cron} ({self.zone})")
        self.in_run = False
        self.stopping = False
        self.handling_signals = False
        self.interrupted_fire: datetime | None = None

    def schedule(self) -> None:
        """Put the nightly job in the store under its fixed id, keeping a missed run due.

        ``add_job(replace_existing=True)`` alone would recompute the next run time from
        now and so drop a night missed while the host was off: when the stored job has the
        same trigger, its stored next run time is carried over.
        """
        kept = self._stored_next_run()
        self.scheduler.add_job(
            scheduled_night, self.trigger, id=JOB_ID, name="nightly batch",
            replace_existing=True, coalesce=True, max_instances=1,
            misfire_grace_time=self.settings.schedule.misfire_grace_s,
            **({"next_run_time": kept} if kept is not None else {}))

    def _stored_next_run(self) -> datetime | None:
        # Starting the store early creates its table if missing; the scheduler's own start
        # does the same again, harmlessly.
        self.store.start(self.scheduler, "default")
        try:
            stored = self.store.lookup_job(JOB_ID)
        except Exception as error:  # a job pickled by an incompatible version: start afresh
            log.warning("stored schedule unreadable; starting afresh", error=str(error))
            return None
        if stored is None or stored.next_run_time is None:
            return None
        if repr(stored.trigger) != repr(self.trigger):
            log.info("schedule changed; next run computed afresh",
                     was=repr(stored.trigger), now=repr(self.trigger))
            return None
        return stored.next_run_time

    def serve(self) -> None:
        """Run until SIGTERM or SIGINT: schedule, log the next run, fire nights as they come.

        Holds the scheduler lock throughout: AlreadyRunningError (exit 4) at once when another
        daemon serves this database.
        """
        # A second daemon stops here, exit 4.
        with scheduler_lock(self.engine, self.settings.store.db_statement_timeout_s) as hold:
            self.heartbeat.hold = hold
            self.heartbeat.on_lost = self._lost_lock
            self._serve()

    def _serve(self) -> None:
        log.info("scheduler starting", cron=self.settings.schedule.cron,
                 timezone=str(self.zone), timezone_source=self.zone_source,
                 misfire_grace_s=self.settings.schedule.misfire_grace_s)
        self.schedule()
        self.install_signal_handlers()
        try:
            with self.heartbeat:
                self.scheduler.start()  # returns once shut down
        except KeyboardInterrupt:  # a stop that unwound the scheduler itself
            pass
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self._shutdown()
        log.info("scheduler stopped", on_request=self.stopping)

    def install_signal_handlers(self) -> None:
        """Make SIGTERM and SIGINT stop the daemon (and end a running batch as interrupted)."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.handling_signals = True

    def _on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        # No logging here: a handler that took a lock the interrupted code holds (the log
        # stream's) would wait forever.
        self.stopping = True
        if self.in_run:
            # A night being set up or wound down, outside the batch's own handler: the
            # same path as Ctrl-C under `nightdesk run`; the batch row ends interrupted.
            raise KeyboardInterrupt
        # Waiting for the next night: shut down from a thread. It waits for the locks the
        # main thread may hold this instant; APScheduler would swallow an exception raised
        # inside one of its listeners.
        threading.Thread(target=self._shutdown, name="nightdesk-stop", daemon=True).start()

    def _lost_lock(self) -> None:
        # From the heartbeat's thread: the same path as a stop asked while waiting.
        self.stopping = True
        if not self.in_run:
            self._shutdown()

    def _shutdown(self) -> None:
        with contextlib.suppress(SchedulerNotRunningError):
            self.scheduler.shutdown(wait=False)

    def run_night(self, fire_time: datetime) -> None:
        """Run the night scheduled for ``fire_time``; log, never raise, whatever happens."""
        if self.stopping:  # the stop came as this run was being picked up: leave it due
            self.interrupted_fire = fire_time
            return
        self.in_run = True
        in_main = threading.current_thread() is threading.main_thread()
        if in_main and self.handling_signals:
            # Ctrl-C during the batch is the batch's to handle, as under `nightdesk run`.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        log.info("nightly run firing", scheduled_for=fire_time.isoformat())
        try:
            # The same preflight as `nightdesk run` (the model at /v1/models included).
            night = self.runner(self.settings, engine=self.engine, resume=True,
                                skip_if_finished_since=fire_time, server="require",
                                once_per_as_of=not self.settings.schedule.repeat_as_of)
        except AlreadyRunningError as error:
            log.warning("nightly run skipped", reason=str(error))
        except (BatchInterrupted, KeyboardInterrupt):
            self.interrupted_fire = fire_time
            self.stopping = True
            log.warning("nightly run interrupted; the night stays due",
                        scheduled_for=fire_time.isoformat())
        except ERRORS as error:  # a refusal among them (its digest is sent): bad input, no room
            log.error("nightly run failed", error=str(error))
        except Exception as error:  # the daemon outlives one bad night
            log.exception("nightly run crashed", error=str(error))
        else:
            outcome = night.outcome
            if outcome is None and night.covered_by is not None:
                log.warning("nightly run skipped: its as-of date has a nightly batch",
                            batch_id=night.covered_by)
            elif outcome is None:
                log.info("nightly run had nothing to do")
            elif outcome.halt is not None and outcome.halt.exit_code == BatchInterrupted.exit_code:
                # The signal reached the batch's own handler, which stopped it cleanly (its
                # calls at the server finished, their nodes checkpointed): the daemon was
                # asked to stop all the same, and the night stays due for its next start.
                self.interrupted_fire = fire_time
                self.stopping = True
                log.warning("nightly run interrupted; the night stays due",
                            scheduled_for=fire_time.isoformat(), batch_id=outcome.batch_id)
            elif outcome.halt is not None:
                # An outage past its budget, a refused key: the batch waits for a resume.
                log.error("nightly run stopped", batch_id=outcome.batch_id,
                          status=outcome.status, error=outcome.halt.message)
            else:
                # Loud as the timer's path: there a partial night exits 3 and a failed one 1,
                # and either starts the unit's OnFailure= alert.
                log.log(NIGHT_LEVELS.get(outcome.status, logging.ERROR), "nightly run finished",
                        batch_id=outcome.batch_id, status=outcome.status,
                        succeeded=len(outcome.succeeded), failed=len(outcome.failed))
        finally:
            self.in_run = False
            if in_main and self.handling_signals:
                # The batch's asyncio handler put the default SIGTERM action back.
                self.install_signal_handlers()

    def next_run_time(self) -> datetime | None:
        """Return the stored next run time of the nightly job."""
        job = self.scheduler.get_job(JOB_ID)
        return None if job is None else job.next_run_time

    def _started(self, _event: SchedulerEvent) -> None:
        self._log_next("scheduler started")

    def _missed(self, event: JobEvent) -> None:
        due, grace = event.scheduled_run_time, self.settings.schedule.misfire_grace_s
        log.warning("nightly run missed: past the grace time", scheduled_for=due.isoformat(),
                    misfire_grace_s=grace)
        # No silent night: the journal line alone reaches nobody in the morning.
        now = datetime.now(UTC)
        tell_refusal(self.settings, None,
                     f"the scheduler daemon reached it at {when(now)}, "
                     f"{span((now - due).total_seconds())} after it was due: past "
                     f"NIGHTDESK_SCHEDULE_MISFIRE_GRACE_S ({span(grace)})",
                     f"if the night is still wanted, start it now: `{START_AGAIN}`",
                     command=START_AGAIN, headline=f"the night due {when(due)} MISSED")

    def _after_run(self, _event: Any) -> None:
        if self.interrupted_fire is not None:
            # The scheduler has just moved the job on to tomorrow: put tonight back, so a
            # daemon started again within the grace time resumes the night.
            self.scheduler.modify_job(JOB_ID, next_run_time=self.interrupted_fire)
            self._log_next("night interrupted; it stays due")
        else:
            self._log_next("next nightly run")
        if self.stopping:
            # Here, between two wake-ups, the scheduler holds none of its locks.
            self._shutdown()

    def _log_next(self, message: str) -> None:
        self.heartbeat.nudge()  # the stored heartbeat carries the new next run
        when = self.next_run_time()
        log.info(message, next_run=None if when is None else when.isoformat(),
                 timezone=str(self.zone))
