"""Hold the single-instance lock of the nightly batch: one nightly run per database at a time.

PostgreSQL: a session-level advisory lock (``pg_try_advisory_lock``) on a connection of its
own, kept open for the whole run. SQLite: an exclusive ``flock`` on a file beside the
database file. Either way the operating system or the server lets go when the holder dies,
so a crashed run never leaves a stale lock behind. Reruns do not take this lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import structlog
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.pool import NullPool

from app.db.models import Batch
from app.errors import AlreadyRunningError, DatabaseError

log = structlog.get_logger(__name__)

# One fixed 64-bit key; advisory locks are per database, so test databases never collide.
ADVISORY_KEY = int.from_bytes(hashlib.sha256(b"nightdesk nightly batch").digest()[:8], "big",
                              signed=True)


def lock_file_path(database_url: str) -> Path:
    """Return the lock file of a SQLite database: ``<database>.nightly.lock`` beside it."""
    database = make_url(database_url).database
    if not database or database == ":memory:":
        # A memory database lives in one process; a per-process file is still one lock.
        return Path(tempfile.gettempdir()) / f"nightdesk-memory-{os.getpid()}.nightly.lock"
    return Path(database).with_name(Path(database).name + ".nightly.lock")


def running_nightly(engine: Engine) -> int | None:
    """Return the id of the newest nightly batch recorded as running, if any."""
    with engine.connect() as conn:
        return conn.execute(select(Batch.id)
                            .where(Batch.kind == "nightly", Batch.status == "running")
                            .order_by(Batch.id.desc()).limit(1)).scalar()


def _refuse(engine: Engine) -> AlreadyRunningError:
    batch_id = running_nightly(engine)
    if batch_id is None:
        # The holder has the lock but no batch row yet (starting) or any more (finishing).
        return AlreadyRunningError("already running: another nightly run holds the lock "
                                   "(its batch is starting or finishing)")
    return AlreadyRunningError(f"already running: batch {batch_id}")


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[bool]:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle: IO[str] = path.open("a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        # Who holds it, for an operator reading the file; the lock itself is the flock.
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    finally:
        handle.close()


@contextlib.contextmanager
def _advisory_lock(url: str) -> Iterator[bool]:
    # Its own engine and connection: a pooled one could be handed to other work, or
    # recycled, and a session-level lock goes wherever its connection goes.
    lock_engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 5})
    try:
        conn: Connection = lock_engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    except Exception as error:
        lock_engine.dispose()
        raise DatabaseError(f"cannot take the nightly lock: {error}".splitlines()[0]) from None
    try:
        held = bool(conn.execute(text("SELECT pg_try_advisory_lock(:key)"),
                                 {"key": ADVISORY_KEY}).scalar())
        try:
            yield held
        finally:
            if held:
                with contextlib.suppress(Exception):  # a dropped connection has let go already
                    conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": ADVISORY_KEY})
    finally:
        conn.close()
        lock_engine.dispose()


@contextlib.contextmanager
def nightly_lock(engine: Engine) -> Iterator[None]:
    """Hold the nightly lock for the block; raise AlreadyRunningError when another run has it."""
    url = engine.url.render_as_string(hide_password=False)
    if engine.dialect.name == "postgresql":
        held_lock = _advisory_lock(url)
        where = f"advisory lock {ADVISORY_KEY}"
    else:
        path = lock_file_path(url)
        held_lock = _file_lock(path)
        where = str(path)
    with held_lock as held:
        if not held:
            raise _refuse(engine)
        # Debug, not info: a run refused right after (bad input, preflight) must stay one
        # line on stderr; the batch's own log lines say when a night ran.
        log.debug("nightly lock taken", lock=where)
        try:
            yield
        finally:
            log.debug("nightly lock released", lock=where)
