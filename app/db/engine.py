"""Make the database engine and sessions, and bring the schema up to date with Alembic."""

from __future__ import annotations

import asyncio
import itertools
import re
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from datetime import UTC
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import psycopg
import structlog
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from app.config import STATEMENT_TIMEOUT_S
from app.db.retry import (
    BOUND,
    READ_ONLY,
    busy,
    cancelled_at_bound,
    mark_bound,
    until_taken,
    waited_s,
    write_budget,
)
from app.errors import DatabaseError, SchemaTooNew, first_line
from serving.urls import redact

log = structlog.get_logger(__name__)

# How long a SQLite statement waits for another connection's write lock before "database is
# locked" (pysqlite's busy timeout); the write budget then tries it again.
SQLITE_BUSY_S = 30.0


def reason(error: BaseException) -> str:
    """Return what went wrong, in one line (the driver's, where SQLAlchemy wraps one) and
    without a URL's password."""
    return redact(first_line(error, sys.maxsize))


def shown(url: str | URL) -> str:
    """Return a database URL as the operator sets it, its password masked (``redact``).

    app/config.py adds psycopg's driver to a bare ``postgresql://`` (SQLAlchemy's own default
    would be psycopg2, not installed); psycopg is the one PostgreSQL driver nightdesk has, so
    both forms name the same connection, and the bare one is what the operator reads back.
    """
    parsed = make_url(url) if isinstance(url, str) else url
    if parsed.drivername == "postgresql+psycopg":
        parsed = parsed.set(drivername="postgresql")
    return redact(parsed.render_as_string(hide_password=False))


def sqlite_file(url: str) -> str:
    """Return the file a SQLite URL names (a URI filename's path, ``?uri=true``), or
    ``:memory:`` when it names none."""
    parsed = make_url(url)
    database = parsed.database or ":memory:"
    if parsed.query.get("uri") == "true":
        database = database.removeprefix("file:") or ":memory:"
    return database


def _sqlite_folder(url: str) -> None:
    """Make a SQLite file's folder; one that cannot be made is a DatabaseError (one line)."""
    database = make_url(url).database
    if database and database != ":memory:" and not database.startswith("file:"):
        folder = Path(database).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise DatabaseError(f"cannot open database {shown(url)}: cannot make its "
                                f"folder {folder}: {error.strerror or error}") from None


def _pragmas(dbapi_conn: sqlite3.Connection) -> None:
    cursor = dbapi_conn.cursor()
    # WAL lets readers (report, ranking) read while the batch writes.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _snapshot_uri(database: str, uri: bool) -> str | None:
    """Return a URI that opens ``database`` read-only as it lies on disk, or None.

    Only a file whose WAL holds nothing qualifies: ``immutable`` reads the main file alone,
    so a WAL with committed pages would hide them.
    """
    path = unquote(urlsplit(database).path) if uri else database
    if not path or path == ":memory:" or not Path(path).is_file():
        return None
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        return None
    return f"file:{quote(str(Path(path).resolve()))}?mode=ro&immutable=1"


def _sqlite_events(engine: Engine) -> None:
    """Open each SQLite connection with WAL and foreign keys, or as a read-only snapshot.

    Reading a WAL file needs its shared-memory file (``-shm``) made or grown, a write:
    a file in a read-only folder, or on a full disk, cannot be opened at all
    ("attempt to write a readonly database", "disk I/O error"). Then the connection
    reads the file as it lies (``immutable``) when its WAL is empty, so read commands still
    serve what is stored; a write on it fails as read-only. Such a connection is not kept
    in the pool: the next checkout tries the normal way again.
    """

    warned = False

    @event.listens_for(engine, "do_connect")
    def _open(dialect: Any, record: Any, cargs: list[Any], cparams: dict[str, Any]) -> Any:
        nonlocal warned
        dbapi_conn = dialect.loaded_dbapi.connect(*cargs, **cparams)
        try:
            _pragmas(dbapi_conn)
        except sqlite3.OperationalError as error:
            dbapi_conn.close()
            snapshot = _snapshot_uri(cargs[0], bool(cparams.get("uri")))
            if snapshot is None:
                raise
            if not warned:  # once: a write's own error ("readonly") would hide the cause
                log.warning("database cannot be written now; read as it lies on disk",
                            database=shown(engine.url),
                            error=str(error))
                warned = True
            record.info["snapshot"] = True
            return dialect.loaded_dbapi.connect(snapshot, **{**cparams, "uri": True})
        return dbapi_conn

    @event.listens_for(engine, "checkin")
    def _forget_snapshot(_dbapi_conn: Any, record: Any) -> None:
        if record.info.pop("snapshot", False):
            record.invalidate(soft=True)


def make_engine(url: str, statement_timeout_s: float = STATEMENT_TIMEOUT_S) -> Engine:
    """Create an engine; a SQLite file gets its folder, WAL and foreign keys.

    Every call is bounded: a PostgreSQL connection's statements by ``statement_timeout_s``
    (``NIGHTDESK_DB_STATEMENT_TIMEOUT_S``; the server cancels one that runs longer, and
    ``timed_out`` says so in one line), a SQLite statement's wait for another writer's lock
    by its busy timeout (``SQLITE_BUSY_S``). A folder that cannot be made is a
    DatabaseError naming the database (one line).
    """
    if make_url(url).get_backend_name() == "sqlite":
        _sqlite_folder(url)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_S})
        _sqlite_events(engine)
        return engine
    return bounded(create_engine(url, pool_pre_ping=True, connect_args=connect_args(
        url, "statement_timeout", statement_timeout_s)), statement_timeout_s)


# A server whose host is gone (powered off, the network cut) sends no reset: a connection
# waited for its answer as long as the kernel's defaults (2 h idle before the first
# keepalive probe, 15 min for data not acknowledged). With these a dead peer is found
# within DEAD_PEER_S; a live server's kernel answers the probes however long it works.
DEAD_PEER_S = 30
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
              "keepalives_count": 4, "tcp_user_timeout": DEAD_PEER_S * 1000}


def connect_args(url: str | URL, bound: str, seconds: float) -> dict[str, Any]:
    """Return libpq's parameters for every PostgreSQL connection nightdesk makes (engines,
    locks, migrations, the checkpoint pool) to ``url``: a connect bounded at 5 s, a dead peer
    found within ``DEAD_PEER_S``, and ``bound`` (``statement_timeout``, ``lock_timeout``) set
    to ``seconds``, after the URL's own ``options`` (``?options=-csearch_path%3Dnd``: these
    parameters replace the URL's, so without them every table would be read and written
    in another schema than the one named)."""
    own = make_url(url).query.get("options", ())
    own = " ".join([own] if isinstance(own, str) else own)
    setting = f"-c {bound}={max(1, round(seconds * 1000))}"
    return {"connect_timeout": 5, "options": f"{own} {setting}".strip(), **KEEPALIVES}


def no_connection(error: BaseException) -> str | None:
    """Return one line for a connection the server refused as ``busy`` (its connections used
    up, starting up) past any wait: the first connection's ``check_reachable`` says it,
    this a later one's; None for any other error."""
    if not isinstance(error, DBAPIError | psycopg.Error) or not busy(error):
        return None
    waited = waited_s(error)
    still = "" if waited is None else f" (still so after {waited:g} s)"
    return (f"the database takes no connection now ({reason(error)}){still}: its connections "
            "are used up by others, or it is starting or stopping; run the command again in a "
            "moment")


def timed_out(error: BaseException) -> str | None:
    """Return one line for a statement PostgreSQL cancelled at its statement timeout
    (SQLSTATE 57014 with its words), naming the setting and its value; None for any other
    error."""
    bound = cancelled_at_bound(error)
    if bound is None:
        return None
    return (f"the database did not answer a statement within {bound}: the server cancelled "
            "it (a lock held too long, or the server overloaded)")


# A server that accepts TCP but never answers (its backend stopped, a proxy swallowing bytes)
# cancels nothing at statement_timeout, and its kernel acknowledges every byte, so the
# keepalives find nothing wrong: a statement waited for ever. Each exchange with the server
# is bounded on this side too, at the statement timeout plus ANSWER_GRACE_S (time for the
# server's own cancel to arrive first): past it the connection's socket is shut down, which
# ends the wait as a lost connection, retried within the write budget as any other.
ANSWER_GRACE_S = 5.0
WATCH_EVERY_S = 1.0  # how often the one watching thread looks


def _cut(fd: int) -> None:
    """Shut down the socket ``fd`` (a duplicate's shutdown reaches it; libpq keeps its own
    descriptor, so none is closed under it)."""
    with suppress(OSError), socket.socket(fileno=socket.dup(fd)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


class _Watch:
    """One thread for the process that shuts down the socket of each exchange still open
    past its deadline. An exchange costs a dict entry, not a thread (a timer thread an
    exchange doubled a statement's time), and the cut lands within ``WATCH_EVERY_S`` of it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, tuple[float, int]] = {}  # exchange -> (deadline, socket)
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None

    @contextmanager
    def within(self, fd: int, seconds: float | None) -> Iterator[None]:
        """Shut down ``fd`` should the block still run ``seconds`` later (never, when None)."""
        if seconds is None:
            yield
            return
        key = next(self._keys)
        with self._lock:
            self._open[key] = (time.monotonic() + seconds, fd)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="db-answer-watch",
                                                daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:  # after this, no cut: the descriptor may be reused
                self._open.pop(key, None)

    def _run(self) -> None:
        while True:
            time.sleep(WATCH_EVERY_S)
            now = time.monotonic()
            with self._lock:
                for key, (deadline, fd) in list(self._open.items()):
                    if deadline <= now:
                        _cut(fd)
                        del self._open[key]


_watch = _Watch()


class AnsweredConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every exchange with the server (a statement, its rows, a
    commit) ends within ``answer_s`` (``bounded`` sets it): its socket is shut down past it.
    psycopg has no client-side timer of its own; every exchange passes through ``wait``."""

    answer_s: float | None = None

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        with _watch.within(self.pgconn.socket, self.answer_s):
            return super().wait(gen, *args, **kwargs)


class AnsweredAsyncConnection(psycopg.AsyncConnection[Any]):
    """``AnsweredConnection`` for the checkpoint pool's asyncio connections."""

    answer_s: float | None = None

    async def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        if self.answer_s is None:
            return await super().wait(gen, *args, **kwargs)
        cutting = asyncio.get_running_loop().call_later(self.answer_s, _cut,
                                                        self.pgconn.socket)
        try:
            return await super().wait(gen, *args, **kwargs)
        finally:
            cutting.cancel()


def answer_bound(seconds: float) -> float:
    """Return how long an exchange may wait for the server under statement timeout
    ``seconds`` before its connection is given up (``AnsweredConnection``)."""
    return seconds + ANSWER_GRACE_S


def bounded(engine: Engine, seconds: float) -> Engine:
    """Return ``engine``, each error of its statements marked with the statement timeout it
    ran under (``seconds``), for the line that reports it (``timed_out``, ``said``), and each
    of its connections' exchanges bounded client-side (``AnsweredConnection``)."""

    @event.listens_for(engine, "handle_error")
    def _mark(context: Any) -> None:
        mark_bound(context.original_exception, seconds)
        # A session that takes no writes (its server a standby: a failover under way) stays
        # so: given up, the write's next try opens one on whatever serves the address now.
        if getattr(context.original_exception, "sqlstate", None) == READ_ONLY:
            context.is_disconnect = True

    @event.listens_for(engine, "do_connect")
    def _open(_dialect: Any, _record: Any, cargs: list[Any], cparams: dict[str, Any]) -> Any:
        # Every connection, a command's first or a later one: a busy server asked again.
        conn = until_taken(AnsweredConnection.connect, *cargs, **cparams)
        conn.answer_s = answer_bound(seconds)
        return conn

    return engine


def migration_engine(url: str, statement_timeout_s: float = STATEMENT_TIMEOUT_S) -> Engine:
    """Return an engine for running migrations: each one commits whole or not at all.

    On PostgreSQL each wait for a lock is bounded by ``statement_timeout_s``
    (``NIGHTDESK_DB_STATEMENT_TIMEOUT_S``, as its ``lock_timeout``), the work itself not: a
    migration behind another session's lock fails (``lock_held``), a long data migration
    runs to its end. pysqlite would commit each CREATE, ALTER and DROP on its own, so its
    transaction handling is off and each transaction starts with ``BEGIN IMMEDIATE`` (the
    write lock at once: a second upgrade waits instead of failing half-way);
    docs/reliability.md, "Interrupted upgrades". No pool: the connection closes with the
    upgrade.
    """
    if make_url(url).get_backend_name() != "sqlite":
        engine = create_engine(url, poolclass=NullPool, connect_args=connect_args(
            url, "lock_timeout", statement_timeout_s))
        event.listen(engine, "do_connect", lambda dialect, _record, cargs, cparams:
                     until_taken(dialect.connect, *cargs, **cparams))  # as ``bounded``'s
        return engine
    _sqlite_folder(url)
    engine = create_engine(url, poolclass=NullPool, connect_args={"timeout": SQLITE_BUSY_S})

    @event.listens_for(engine, "connect")
    def _own_transactions(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        _pragmas(dbapi_conn)  # outside any transaction: SQLite ignores them inside one
        dbapi_conn.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def get_engine(url: str, statement_timeout_s: float = STATEMENT_TIMEOUT_S) -> Engine:
    """Return one shared engine per URL (and statement timeout, ``make_engine``'s), however
    the timeout is passed: ``get_engine(url)`` and ``get_engine(url, 60.0)`` were two
    engines, two pools, so every command held two of a server's connections."""
    return _shared_engine(url, float(statement_timeout_s))


@lru_cache(maxsize=8)
def _shared_engine(url: str, statement_timeout_s: float) -> Engine:
    return make_engine(url, statement_timeout_s)


get_engine.cache_clear = _shared_engine.cache_clear  # type: ignore[attr-defined]


def session_scope(engine: Engine) -> AbstractContextManager[Session]:
    """Return a session that commits on success, rolls back on error and closes after."""
    return sessionmaker(engine, expire_on_commit=False).begin()


def migrations_dir() -> Path:
    """Return the folder of the installed ``migrations`` package (Alembic's script location).

    Found through the package, not the source tree, so a wheel install has it too; Alembic
    needs a real folder, which an installed (unzipped) package always is.
    """
    return Path(str(files("migrations")))


def alembic_config(url: str) -> Config:
    """Build Alembic's configuration in code: no alembic.ini is needed at run time."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def _select_one(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))


WRITE_BUDGET = "NIGHTDESK_DB_WRITE_BUDGET_S"


def check_reachable(engine: Engine, wait_s: float | None = None,
                    budget: str = WRITE_BUDGET) -> None:
    """Raise DatabaseError in one line when the database cannot be opened and read.

    Whatever the driver says: a host that does not answer, a refused login, a file that
    cannot be opened or is not a database at all. A server that answers it takes no
    connection now (its connections used up, starting up: ``busy``) is asked again by the
    engine's connect (``until_taken``) for ``wait_s`` (a night's start: its write budget,
    the setting ``budget``; a read command: ``READ_WAIT_S``, ``budget`` ""), else for the
    wait in force (``connect_wait_s``); anything else is said at once.
    """
    try:
        # The wait is the engine's connect's (``until_taken``), for ``wait_s`` here.
        with write_budget(wait_s) if wait_s is not None else nullcontext():
            _select_one(engine)
    except (DBAPIError, OSError) as error:
        waited = waited_s(error)
        still = "" if waited is None else \
            f" (still so after {waited:g} s{': ' + budget if budget else ''})"
        raise DatabaseError(f"cannot reach database {shown(engine.url)}: {reason(error)}"
                            f"{still}") from None


# "0003_quality" was once the revision after "0003"; two revisions now come between them.
REORDERED = "0003_quality"
SKIPPED = ("0003", "0005_request_attempt")  # (before them, the last of them)


def _catch_up_reordered(conn: Connection, cfg: Config) -> None:
    """Run the revisions a database stamped ``0003_quality`` before the reordering lacks.

    Alembic takes such a database for current, though it has neither ``llm_calls``'
    context-trim columns nor ``llm_requests.attempt``: without this every usage row would
    fail to insert. Stamped back to before them, it runs just those, then is stamped again.
    """
    if MigrationContext.configure(conn).get_current_revision() != REORDERED:
        return
    if "context_trimmed" in {c["name"] for c in inspect(conn).get_columns("llm_calls")}:
        return
    before, last = SKIPPED
    command.stamp(cfg, before, purge=True)
    command.upgrade(cfg, last)
    command.stamp(cfg, REORDERED, purge=True)


# SQLSTATE invalid_schema_name: a CREATE with no schema of the search_path existing.
NO_SCHEMA = "3F000"


def upgrade(url: str, statement_timeout_s: float = STATEMENT_TIMEOUT_S,
            wait_s: float | None = None, budget: str = WRITE_BUDGET) -> str | None:
    """Upgrade the schema to the newest migration (idempotent); return the revision it was at
    before (None: there was no schema, it was created).

    A schema already current is only read, so a read-only or full database still serves
    reads. Each migration is one transaction (``migration_engine``): an upgrade killed at
    any statement, or failed, leaves the database at the last migration that finished, and
    running it again goes on from there. One waiting past ``statement_timeout_s`` for a
    lock another session holds is a DatabaseError naming the setting and that session; a
    schema at a revision this install does not know is refused unchanged (``SchemaTooNew``).
    ``wait_s``, ``budget``: ``check_reachable``'s.
    """
    # The shared engine of ``get_engine(url, statement_timeout_s)``, as every caller's
    # first: an in-memory database is its one connection, and a server with few
    # connections left is asked for one, kept in its pool for the command.
    engine = get_engine(url, statement_timeout_s)
    check_reachable(engine, wait_s, budget)
    at = current_revision(engine)
    if at == head_revision():
        return at
    refuse_unknown(url, at)
    # An in-memory database lives in its engine's one connection: migrate that one.
    memory = make_url(url).database in (None, "", ":memory:")
    target = engine if memory else migration_engine(url, statement_timeout_s)
    cfg = alembic_config(url)
    try:
        with target.connect() as conn:
            cfg.attributes["connection"] = conn
            with conn.begin():  # stamped back, two revisions, stamped again: all or none
                _catch_up_reordered(conn, cfg)
            command.upgrade(cfg, "head")
    except SQLAlchemyError as error:
        held = lock_held(engine, error, statement_timeout_s)
        if getattr(getattr(error, "orig", None), "sqlstate", None) == NO_SCHEMA:
            held = (f"the database {shown(url)} has no schema its search_path names (the "
                    "URL's options): create that schema, or name one that exists; nothing "
                    "was written")
        raise DatabaseError(held or f"migration failed: {reason(error)}") from None
    finally:
        if not memory:
            target.dispose()
    return at


def lock_held(engine: Engine, error: SQLAlchemyError, seconds: float) -> str | None:
    """Return one line for a migration PostgreSQL stopped at its lock timeout (SQLSTATE
    55P03): the migration, the setting, the session holding a table its statement names
    where ``pg_locks`` shows one, and the revision the schema stays at; None otherwise."""
    if getattr(getattr(error, "orig", None), "sqlstate", None) != "55P03":
        return None
    names = re.findall(r"[a-z_][a-z0-9_]*", str(getattr(error, "statement", "") or ""))
    try:
        at = current_revision(engine)
        with engine.connect() as conn:
            holder = conn.execute(text(
                "SELECT a.pid, c.relname, coalesce(nullif(a.application_name, ''), a.usename),"
                " a.state, a.xact_start FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                " JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.granted"
                " AND l.pid <> pg_backend_pid() AND c.relname = ANY(:names) AND l.database ="
                " (SELECT oid FROM pg_database WHERE datname = current_database())"
                " ORDER BY a.xact_start NULLS LAST LIMIT 1"), {"names": names}).first()
    except SQLAlchemyError:  # these reads held up too: say what is known
        return (f"a migration waited more than {BOUND} ({seconds:g} s) for a lock another "
                "session holds: nothing of it applied; run `nightdesk db upgrade` again once "
                "that lock is let go")
    failed = next((s.revision for s in scripts().walk_revisions() if s.down_revision == at),
                  "?")
    since = "" if holder is None or holder[4] is None else \
        f" since {holder[4].astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    who = "another session" if holder is None else \
        f"session {holder[0]} ({holder[2]}, {holder[3]}{since}) on {holder[1]}"
    return (f"migration {failed} waited more than {BOUND} ({seconds:g} s) for a lock held by "
            f"{who}: nothing of it applied, the schema stays at {at or 'none'}; run "
            "`nightdesk db upgrade` again once that lock is let go")


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


@lru_cache(maxsize=1)
def scripts() -> ScriptDirectory:
    """Return this install's migrations (Alembic's script directory)."""
    return ScriptDirectory.from_config(alembic_config("sqlite://"))


def head_revision() -> str | None:
    return scripts().get_current_head()


def refuse_unknown(url: str | URL, at: str | None) -> None:
    """Raise SchemaTooNew when the schema is at a revision none of this install's migrations
    names: most likely a newer nightdesk migrated it (a package rolled back, or hosts on two
    versions sharing one database), else another program wrote its ``alembic_version``.
    Alembic cannot upgrade from it, and this code's models may not match it, so nothing may
    read or write it."""
    if at is None or at in {script.revision for script in scripts().walk_revisions()}:
        return
    raise SchemaTooNew(
        f"the database {shown(url)} is at schema revision {at}, one this nightdesk does not "
        f"know (its newest is {head_revision()}): a newer nightdesk migrated it, or another "
        "program wrote it; upgrade nightdesk, on every host that shares this database, to "
        "the version that migrated it, or restore the database from before that upgrade; "
        "nothing was written")


def check_schema(engine: Engine) -> None:
    """Raise SchemaTooNew (``refuse_unknown``) when the database was migrated, since this
    process checked it at its start, to a revision this install does not know: another
    host upgraded it under a running daemon or web server. One read of the revision; one
    that fails (the database away) is left to what comes next, which says so its own way."""
    try:
        at = current_revision(engine)
    except SQLAlchemyError:
        return
    refuse_unknown(engine.url, at)


# How often a long-lived process re-reads the schema's revision (``SchemaWatch``).
SCHEMA_CHECK_S = 30.0


class SchemaWatch:
    """``check_schema`` at most once every ``every_s`` (``SCHEMA_CHECK_S``), for a process
    that serves a database another host may migrate under it: one per process, shared by
    all it serves from that database (the pages, the metrics port, the daemon's heartbeat).

    ``refusal()``: SchemaTooNew's line while the newest check found a revision this install
    does not know, else "". Thread-safe: one caller reads while the others wait for it.
    """

    def __init__(self, engine: Engine, every_s: float | None = None) -> None:
        self.engine = engine
        self.every_s = every_s
        self._lock = threading.Lock()
        self._checked_at: float | None = None
        self._said = ""

    @property
    def said(self) -> str:
        """Return the newest check's line, or "" (no read, no wait)."""
        return self._said

    def due(self) -> bool:
        """Return whether the next ``refusal()`` reads the revision (no read here)."""
        every = SCHEMA_CHECK_S if self.every_s is None else self.every_s
        return self._checked_at is None or time.monotonic() - self._checked_at >= every

    def refusal(self) -> str:
        """Return SchemaTooNew's line, or "" while the revision is known; read when due."""
        with self._lock:
            if self.due():
                self._checked_at = time.monotonic()
                try:
                    check_schema(self.engine)
                    self._said = ""
                except SchemaTooNew as error:
                    self._said = str(error)
            return self._said

    def check(self) -> None:
        """Raise SchemaTooNew with ``refusal()``'s line, if it has one."""
        said = self.refusal()
        if said:
            raise SchemaTooNew(said)


def ready_engine(url: str, statement_timeout_s: float = STATEMENT_TIMEOUT_S,
                 wait_s: float | None = None, budget: str = WRITE_BUDGET) -> Engine:
    """Upgrade the schema if needed and return the engine: what every command calls first.
    ``wait_s``, ``budget`` (a command that runs a batch: its write budget; a read command:
    ``READ_WAIT_S``, no setting): ``check_reachable``'s."""
    upgrade(url, statement_timeout_s, wait_s, budget)
    return get_engine(url, statement_timeout_s)
