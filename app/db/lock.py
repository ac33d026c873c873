"""Hold the single-instance locks: one nightly run, and one scheduler daemon, per database.

PostgreSQL: a session-level advisory lock on a connection of its own; SQLite: a ``flock`` on
a file beside the database. Either is let go when its holder dies. A PostgreSQL restart
also lets go while the run lives on, so the holder proves its lock at every heartbeat and
takes it again (docs/reliability.md); a start that finds a nightly batch ``running`` while
the lock is free asks ``holder_gone`` before taking it for dead.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import structlog
import tenacity
from sqlalchemy import Engine, create_engine, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

from agents.errors import os_said
from app.config import STATEMENT_TIMEOUT_S
from app.db.batchsettings import BatchSettings
from app.db.engine import bounded, connect_args, sqlite_file
from app.db.models import Batch, SchedulerBeat
from app.db.retry import cancelled_at_bound, said
from app.db.runner import Runner
from app.errors import AlreadyRunningError, DatabaseError, first_line

log = structlog.get_logger(__name__)

# One fixed 64-bit key; advisory locks are per database, so test databases never collide.
ADVISORY_KEY = int.from_bytes(hashlib.sha256(b"nightdesk nightly batch").digest()[:8], "big",
                              signed=True)
SCHEDULER_KEY = int.from_bytes(hashlib.sha256(b"nightdesk scheduler daemon").digest()[:8],
                               "big", signed=True)
# The key as a session takes it: advisory locks are per database, so each schema (a URL's
# search_path) gets its own, and two installs in two schemas of one database do not take
# each other's nightly or scheduler lock; ``public`` keeps the key itself (earlier releases').
IN_SCHEMA = ("(CASE WHEN coalesce(current_schema(), 'public') = 'public' THEN CAST(:key AS"
             " bigint) ELSE CAST(:key AS bigint) # hashtextextended(current_schema(), 0) END)")
# Why a night elsewhere is dead once its lock is let go: the same words whether a view read
# it so (``run_gone``) or a start stored it (``holder_gone``).
LOCK_FREE = "its nightly lock was let go"


def lock_file_path(database_url: str, what: str = "nightly") -> Path:
    """Return a lock file of a SQLite database: ``<database>.<what>.lock`` beside it."""
    database = sqlite_file(database_url)
    if database == ":memory:":
        # A memory database lives in one process; a per-process file is still one lock.
        return Path(tempfile.gettempdir()) / f"nightdesk-memory-{os.getpid()}.{what}.lock"
    return Path(database).with_name(Path(database).name + f".{what}.lock")


def running_nightly(engine: Engine) -> int | None:
    """Return the id of the newest nightly batch recorded as running, if any."""
    with engine.connect() as conn:
        return conn.execute(select(Batch.id)
                            .where(Batch.kind == "nightly", Batch.status == "running")
                            .order_by(Batch.id.desc()).limit(1)).scalar()


def after_losing(engine: Engine, batch_id: int) -> str:
    """Return what continues nightly batch ``batch_id`` that stopped on losing the lock, as
    a clause to add to why it stopped: ``run --resume`` answers "already running" while
    another run holds the lock, so it follows the nightly batches running now (read back;
    the database may be away). Another process on this one has nothing left to run;
    another batch is to end first."""
    resume = f"`nightdesk run --resume {batch_id}`"
    try:
        with engine.connect() as conn:
            running = {int(row.id): BatchSettings.read(row.settings).runner for row in conn.execute(
                select(Batch.id, Batch.settings)
                .where(Batch.kind == "nightly", Batch.status == "running"))}
    except Exception as error:
        log.warning("who holds the nightly lock not read", error=first_line(error))
        return (f"; once the database answers, {resume} continues it (while another run "
                "holds the nightly lock it answers `already running`: run it once that run "
                "has ended)")
    taker = running.get(batch_id)
    if taker is not None and not taker.same(Runner.current()):  # it reopened this batch
        return (f"; another run (pid {taker.pid} on {taker.host}) continues batch {batch_id} "
                f"now: nothing to run; `nightdesk report {batch_id}` shows how it went")
    holder = max((batch for batch in running if batch != batch_id), default=None)
    if holder is not None:
        return (f"; batch {holder} holds the nightly lock now: once it has ended, {resume} "
                "continues this one")
    return (f"; {resume} continues it (while another run holds the nightly lock it answers "
            "`already running`: run it once that run has ended)")


def _refuse(engine: Engine) -> AlreadyRunningError:
    batch_id = running_nightly(engine)
    if batch_id is None:
        # The holder has the lock but no batch row yet (starting) or any more (finishing).
        return AlreadyRunningError("already running: another nightly run holds the lock "
                                   "(its batch is starting or finishing)")
    return AlreadyRunningError(f"already running: batch {batch_id}")


def holder_gone(engine: Engine, batch: Any, stale_s: float,
                alive_at: datetime | None = None) -> str | None:
    """Return why a ``running`` nightly batch has lost its process (None: it may be alive).

    Call with the nightly lock held. ``batch`` is its row (settings, heartbeat_at). A runner
    on this host is looked up by its pid. Elsewhere, on SQLite the free lock proves it; on
    PostgreSQL only when the batch beat since the server last started (a restart lets go of
    every lock, also a live run's, which takes it again at its next beat): otherwise its
    heartbeat must be older than ``stale_s``, and ``alive_at`` (its other signs of life,
    ``app.morning.summary.Seen.alive_at``) too.
    """
    runner = BatchSettings.read(batch.settings).runner
    alive = None if runner is None else runner.alive()
    if alive is not None:
        return None if alive else f"its process {runner.pid} is gone"  # type: ignore[union-attr]
    if engine.dialect.name != "postgresql":
        return LOCK_FREE
    with engine.connect() as conn:
        up_since = conn.execute(text("SELECT pg_postmaster_start_time()")).scalar_one()
    beat = batch.heartbeat_at or batch.started_at
    if beat is not None and beat.tzinfo is None:
        beat = beat.replace(tzinfo=UTC)
    if beat is not None and beat > up_since:
        return LOCK_FREE
    last = max((moment for moment in (beat, alive_at) if moment is not None), default=None)
    age = None if last is None else (datetime.now(UTC) - last).total_seconds()
    if age is None or age > stale_s:
        return f"no sign of life for more than {stale_s:.0f} s"
    return None


class NightlyLockView:
    """Whether a session holds the nightly lock on PostgreSQL (``pg_locks``, read without
    taking it), which process holds it and when its session last ran a statement
    (``pg_stat_activity``), with the server's start: read once, at first need, in one query
    however many batches a request asks of it. None engine, or SQLite: nothing to read."""

    def __init__(self, engine: Engine | None) -> None:
        self.engine = engine if engine is not None and engine.dialect.name == "postgresql" \
            else None
        self._read: tuple[bool, datetime, str | None, datetime | None] | None = None

    def _reading(self) -> tuple[bool, datetime, str | None, datetime | None]:
        assert self.engine is not None
        if self._read is None:
            with self.engine.connect() as conn:  # pg_locks splits the bigint key in two
                # quiet: seconds since the holder's session last ran a statement (0 while it
                # runs one), on the server's clock; NULL where this role may not read it.
                held, up_since, name, quiet = conn.execute(text(
                    "SELECT h.held IS NOT NULL, pg_postmaster_start_time(),"
                    " h.application_name, h.quiet FROM (SELECT 1) AS one LEFT JOIN ("
                    "SELECT true AS held, a.application_name, CASE WHEN a.state = 'active'"
                    " THEN 0.0 ELSE EXTRACT(EPOCH FROM clock_timestamp()"
                    " - greatest(a.query_start, a.state_change))::float8 END AS quiet"
                    " FROM pg_locks AS l LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid"
                    " WHERE l.locktype = 'advisory' AND l.granted"
                    " AND l.database = (SELECT oid FROM pg_database"
                    " WHERE datname = current_database())"
                    f" AND l.classid::bigint = ({IN_SCHEMA} >> 32) & 4294967295"
                    f" AND l.objid::bigint = {IN_SCHEMA} & 4294967295"
                    " AND l.objsubid = 1 LIMIT 1) AS h ON true"), {"key": ADVISORY_KEY}).one()
            active = None if quiet is None else datetime.now(UTC) - timedelta(seconds=quiet)
            self._read = (bool(held), up_since, name, active)
        return self._read

    def free_since(self) -> datetime | None:
        """Return the server's start when no session holds the lock; None while one does."""
        held, up_since, _, _ = self._reading()
        return None if held else up_since

    def holder_active_at(self, runner: Runner) -> datetime | None:
        """Return when the lock's holder last ran a statement, on this reader's clock, if
        it is ``runner`` (its ``lock_name``); None when no session holds the lock, another
        does, or this role may not read the holder's activity (not the same role, nor
        pg_read_all_stats). A live night's holder beats on its lock's connection at every
        heartbeat, even one that cannot land (app/batch/engine.py, ``LockHold.beat``)."""
        if self.engine is None:
            return None
        held, _, name, active = self._reading()
        return active if held and name == runner.lock_name() else None


def run_gone(lock: NightlyLockView | None, kind: str, settings: Mapping[str, Any] | None,
             beat: datetime | None) -> str | None:
    """Return why a batch marked ``running`` has lost its process, where a reader (not
    holding the lock) can know it before its heartbeat goes stale; None: it may be alive.

    ``settings``: its row's (the runner); ``beat``: its heartbeat, else its start. A
    runner on this host is looked up by its pid (both dialects). A nightly batch elsewhere,
    on PostgreSQL, is gone when no session holds the nightly lock (``lock``) and it beat
    since the server last started (``holder_gone``'s rule). Otherwise (a SQLite night on
    another host, a database restart since its beat) only its heartbeat can tell.
    """
    runner = BatchSettings.read(settings).runner
    alive = None if runner is None else runner.alive()
    if alive is not None:
        return None if alive else f"its process {runner.pid} is gone"  # type: ignore[union-attr]
    if lock is None or lock.engine is None or kind != "nightly":
        return None
    up_since = lock.free_since()
    if up_since is None:
        return None
    if beat is not None and beat.tzinfo is None:
        beat = beat.replace(tzinfo=UTC)
    return LOCK_FREE if beat is not None and beat > up_since else None


class LockHold:
    """The held nightly lock; ``beat`` proves it and stores the batch's heartbeat."""

    def __init__(self) -> None:
        self.proven_at = time.monotonic()

    @property
    def unproven_s(self) -> float:
        """Return the seconds since the lock was last proven held."""
        return time.monotonic() - self.proven_at

    def beat(self, batch_id: int) -> bool:
        """Store the batch's heartbeat if the lock is (again) held; return whether it is (a
        beat the server cancelled at the statement timeout is missed, the lock still held)."""
        if self._beat(batch_id):
            self.proven_at = time.monotonic()
            return True
        return False

    def _beat(self, batch_id: int) -> bool:
        raise NotImplementedError

    def keep(self) -> bool:
        """Prove the lock still held, taking it again if it was let go; False: not proven now.

        Raise AlreadyRunningError when another process took it meanwhile.
        """
        return True


class _FileHold(LockHold):
    """A flock: held for as long as this process has the file open, so always proven."""

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self._engine = engine

    @property
    def unproven_s(self) -> float:
        return 0.0

    def _beat(self, batch_id: int) -> bool:
        with self._engine.begin() as conn:
            conn.execute(update(Batch).where(Batch.id == batch_id)
                         .values(heartbeat_at=datetime.now(UTC)))
        return True


class _LockLost(Exception):
    """The lock's connection died, or a new one could not be made, in one try."""


# Tries per beat (or ``keep``) to prove the lock on a new connection when its own died, a
# second apart: a restart's or a terminated backend's loss is over in one; past them the
# beat is missed (one line) and the next one tries again, so a connection killed at every
# try costs a bounded wait per beat and never grows the stack.
RETAKES = 3
RETAKE_WAIT_S = 1.0


class _AdvisoryHold(LockHold):
    """An advisory lock on a connection of its own, taken again when that connection dies.

    Its statements are bounded by ``statement_timeout_s`` (NIGHTDESK_DB_STATEMENT_TIMEOUT_S),
    as the engines' are: a heartbeat held up by another session's lock on the batch row is
    cancelled there. The session answered, so it and its lock live: that beat is missed
    (one line), the next one tries again, and the night goes on. A connection lost is
    replaced and the lock taken again, up to ``RETAKES`` tries (one warning each).
    """

    def __init__(self, url: str, key: int = ADVISORY_KEY,
                 statement_timeout_s: float = STATEMENT_TIMEOUT_S, what: str = "nightly") -> None:
        super().__init__()
        self._key = key
        self._what = what
        # Its own engine and connection: a pooled one could be handed to other work, or
        # recycled, and a session-level lock goes wherever its connection goes.
        self._engine = bounded(create_engine(url, poolclass=NullPool, connect_args={
            **connect_args(url, "statement_timeout", statement_timeout_s),
            "application_name": Runner.current().lock_name(what)}), statement_timeout_s)
        self._conn: Connection | None = None

    def take(self) -> bool:
        """Take the lock on a new connection; False when another session holds it."""
        conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            held = bool(conn.execute(text(f"SELECT pg_try_advisory_lock({IN_SCHEMA})"),
                                     {"key": self._key}).scalar())
        except Exception:
            conn.close()
            raise
        if not held:
            conn.close()
            return False
        self._conn = conn
        return True

    def _beat(self, batch_id: int) -> bool:
        try:
            return self._prove(batch_id)
        except AlreadyRunningError:
            log.error(f"{self._what} lock held by another run", batch_id=batch_id)
            return False

    def keep(self) -> bool:
        return self._prove(None)

    def _prove(self, batch_id: int | None) -> bool:
        """Store the batch's heartbeat (``batch_id``) or ask the session if it lives, on the
        lock's connection, taking the lock again on a new one while that died; False when
        ``RETAKES`` tries did not prove it. AlreadyRunningError: another session took it."""
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(RETAKES), wait=tenacity.wait_fixed(RETAKE_WAIT_S),
            retry=tenacity.retry_if_exception_type(_LockLost), reraise=True)
        try:
            return retrying(self._try, batch_id)
        except _LockLost:
            log.warning(f"{self._what} lock not proven held: its connection lost at each of "
                        f"{RETAKES} tries; the next beat tries again", batch_id=batch_id)
            return False

    def _try(self, batch_id: int | None) -> bool:
        taken = self._conn is None
        if taken:
            try:
                held = self.take()
            except Exception as error:
                log.warning(f"{self._what} lock not taken again yet", error=first_line(error))
                raise _LockLost from None
            if not held:
                raise AlreadyRunningError(f"the {self._what} lock was taken by another "
                                          "process meanwhile")
        assert self._conn is not None
        try:
            # On the lock's own connection: a statement answered proves the lock.
            self._conn.execute(text("SELECT 1") if batch_id is None else
                               update(Batch).where(Batch.id == batch_id)
                               .values(heartbeat_at=datetime.now(UTC)))
        except Exception as error:
            if cancelled_at_bound(error) is None:
                log.warning(f"{self._what} lock's connection lost", error=first_line(error))
                self._drop()
                raise _LockLost from None
            # It answered: the session, and so its lock, lives.
            log.warning("heartbeat not stored; tried again at the next beat"
                        if batch_id is not None else "lock's connection slow",
                        batch_id=batch_id, error=said(error))
        if taken:
            log.warning(f"{self._what} lock taken again", batch_id=batch_id)
        return True

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    def release(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # a dropped connection has let go already
                self._conn.execute(text(f"SELECT pg_advisory_unlock({IN_SCHEMA})"),
                                   {"key": self._key})
        self._drop()
        self._engine.dispose()


@contextlib.contextmanager
def _file_lock(path: Path, engine: Engine, what: str) -> Iterator[LockHold | None]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle: IO[str] = path.open("a+")
    except OSError as error:  # a folder in its place, a read-only disk: one line, no trace
        raise DatabaseError(f"cannot take the {what} lock: cannot open its file {path}: "
                            f"{os_said(error)}") from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        # Who holds it, for an operator reading the file; the lock itself is the flock, so
        # a note a full disk cannot take leaves the file empty and the night goes on.
        with contextlib.suppress(OSError):
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()
        try:
            yield _FileHold(engine)
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    finally:
        with contextlib.suppress(OSError):  # the note's bytes still buffered: see above
            handle.close()


@contextlib.contextmanager
def _advisory_lock(url: str, key: int, what: str,
                   statement_timeout_s: float) -> Iterator[LockHold | None]:
    hold = _AdvisoryHold(url, key, statement_timeout_s, what)
    try:
        held = hold.take()
    except Exception as error:
        hold.release()
        raise DatabaseError(f"cannot take the {what} lock: {first_line(error)}") from None
    try:
        yield hold if held else None
    finally:
        hold.release()


def _lock(engine: Engine, key: int, what: str, statement_timeout_s: float) -> tuple[
        contextlib.AbstractContextManager[LockHold | None], str]:
    """Return the lock ``what`` of the engine's database, and where it is (for the log)."""
    url = engine.url.render_as_string(hide_password=False)
    if engine.dialect.name == "postgresql":
        return _advisory_lock(url, key, what, statement_timeout_s), f"advisory lock {key}"
    path = lock_file_path(url, what)
    return _file_lock(path, engine, what), str(path)


@contextlib.contextmanager
def nightly_lock(engine: Engine, statement_timeout_s: float = STATEMENT_TIMEOUT_S
                 ) -> Iterator[LockHold]:
    """Hold the nightly lock for the block; raise AlreadyRunningError when another run has it.
    On PostgreSQL its connection's statements are bounded by ``statement_timeout_s``."""
    held_lock, where = _lock(engine, ADVISORY_KEY, "nightly", statement_timeout_s)
    with held_lock as hold:
        if hold is None:
            raise _refuse(engine)
        # Debug, not info: a run refused right after (bad input, preflight) must stay one
        # line on stderr; the batch's own log lines say when a night ran.
        log.debug("nightly lock taken", lock=where)
        try:
            yield hold
        finally:
            log.debug("nightly lock released", lock=where)


@contextlib.contextmanager
def scheduler_lock(engine: Engine, statement_timeout_s: float = STATEMENT_TIMEOUT_S
                   ) -> Iterator[LockHold]:
    """Hold the scheduler daemon's lock for the block (its life); AlreadyRunningError (exit 4)
    when another daemon serves the same database. Bounded as ``nightly_lock``'s."""
    with _lock(engine, SCHEDULER_KEY, "scheduler", statement_timeout_s)[0] as hold:
        if hold is None:
            raise AlreadyRunningError("already running: another `nightdesk scheduler` serves "
                                      f"this database{_scheduler_holder(engine)}")
        yield hold


def _scheduler_holder(engine: Engine) -> str:
    """Return which daemon beat last, as the refusal names it (empty when none is known)."""
    try:
        with engine.connect() as conn:
            beat = conn.execute(select(SchedulerBeat.host, SchedulerBeat.pid)
                                .order_by(SchedulerBeat.beat_at.desc()).limit(1)).first()
    except Exception:  # the schema not there yet: the lock alone says enough
        return ""
    return "" if beat is None else f" (pid {beat.pid} on {beat.host})"
