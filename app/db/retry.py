"""Run a database write again, as a whole transaction, while the database is briefly away.

A PostgreSQL restart (or an administrator terminating our backends) drops every pooled
connection: the next statement on each fails once with a connection error, and the pool's
pre-ping replaces it on the following checkout. SQLite answers "database is locked" while
another writer holds it past the busy timeout. A full disk (PostgreSQL's ``disk_full``,
SQLite's ``SQLITE_FULL``) passes once space is freed. A write that fails for any of them is
tried again from the start, so a transaction either happened once or not at all. A
constraint violation or a bad statement is never retried: it would fail the same way.
The policy is tenacity's; any error that ends it is raised as it came. How long it tries
is the write budget: ``RETRY_BUDGET_S``, or what ``write_budget`` sets for a batch.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

import psycopg
import psycopg_pool
import structlog
import tenacity
from sqlalchemy.exc import DBAPIError, OperationalError

from app.errors import StorageOutage, first_line

log = structlog.get_logger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

# Long enough for a PostgreSQL restart (a few seconds to a minute), short enough that a
# database that is really gone ends the write with its error within a couple of minutes.
RETRY_BUDGET_S = 120.0
FIRST_DELAY_S = 0.2
MAX_DELAY_S = 5.0


TRANSIENT_WORDS = ("locked", "busy", "terminat", "connection", "server closed", "shutdown",
                   "could not connect", "timeout", "timed out", "recovery mode", "starting up",
                   "disk is full", "no space left",
                   # The resolver's own word for a lookup that may pass (EAI_AGAIN: its server
                   # unreachable a while); a name not found (EAI_NONAME) is not retried.
                   "temporary failure in name resolution")
# PostgreSQL's SQLSTATE classes that pass with time: connection exceptions (08), insufficient
# resources (53: disk_full, out_of_memory, too_many_connections) and the server shutting
# down or starting (57P01..57P05). Others of class 57 (a cancelled statement) do not.
TRANSIENT_SQLSTATES = ("08", "53", "57P")
SQLITE_FULL = 13
# read_only_sql_transaction: a hot standby, a failover under way, default_transaction_read_only.
# It passes with time (the standby promoted, the address moved to the new primary), but only
# a batch's writes (``write_budget``) wait for it; the one write a read command makes is left
# out at once (app.db.readonly).
READ_ONLY = "25006"
# SQLite's primary result codes of a database file it cannot write now: read-only (the file or
# its folder; a filesystem remounted read-only under a file opened since, as ext4's
# errors=remount-ro does on an error of its own), an I/O error (a write through a file opened
# before such a remount: EROFS, or a disk failing), a file it cannot open. The database is as
# good as away: a batch's writes wait for it as for READ_ONLY, read commands are left to
# app.db.readonly. (SQLITE_FULL passes with time anywhere: below.)
SQLITE_UNWRITABLE = (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN)
# A server that answered but takes no connection now, in its own words (libpq gives a refused
# connection no SQLSTATE): too_many_connections (53300: its max_connections or a role's or
# database's CONNECTION LIMIT used up), cannot_connect_now (57P03: starting up, shutting down,
# in recovery), a database closed to connections for a while (55000, ALLOW_CONNECTIONS false).
# A night's first connection waits for these within the write budget (``until_taken``); a
# refusal of what was asked for (no such database or role, a password refused) or silence (no
# server at that address) is said at once: the address may be wrong.
BUSY_SQLSTATES = ("53300", "57P03", "55000")
# psycopg 3.3.9 with its libpq 18: ``sqlstate`` and ``diag.sqlstate`` are None for a refused
# connection (the server's ErrorResponse carries the code; libpq keeps only the text, and
# psycopg exposes no error verbosity to have it printed there), so its words are all there is:
# a server whose lc_messages is another language is refused at once.
# How long a connection refused as ``busy`` is asked again (``until_taken``, at every connect
# of an engine: ``connect_wait_s``) outside a batch: a read command, a page, an operator at a
# terminal; a batch waits its write budget.
READ_WAIT_S = 10.0
BUSY_WORDS = ("too many connections", "too many clients", "connection slots are reserved",
              "the database system is starting up", "the database system is shutting down",
              "the database system is in recovery mode", "not yet accepting connections",
              "not currently accepting connections")


def transient(error: BaseException) -> bool:
    """Return True for errors that a later try of the same transaction may not meet.

    Takes SQLAlchemy's wrapped errors and the drivers' own (the checkpointer talks to
    psycopg and aiosqlite directly).
    """
    cause = getattr(error, "orig", None) or error
    if getattr(cause, "sqlstate", None) == READ_ONLY or sqlite_unwritable(cause):
        return _budget.get() is not None  # first: its connection is given up (invalidated)
    if waited_s(cause) is not None:
        # A refusal ``until_taken`` waited for already: a batch's write ends at its budget (the
        # wait spent it), anything else raises it now rather than wait it a second time.
        return _budget.get() is not None
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, psycopg_pool.PoolTimeout | psycopg.InterfaceError):
        return True
    if isinstance(error, OperationalError | psycopg.OperationalError | sqlite3.OperationalError):
        cause = getattr(error, "orig", None) or error
        if str(getattr(cause, "sqlstate", None) or "").startswith(TRANSIENT_SQLSTATES):
            return True
        if getattr(cause, "sqlite_errorcode", None) == SQLITE_FULL:
            return True
        # OperationalError also covers "no such table"-like mistakes on SQLite: only the
        # connection, locking and disk-space kinds pass with time.
        return any(word in str(cause).lower() for word in TRANSIENT_WORDS)
    return False


def sqlite_unwritable(error: BaseException) -> bool:
    """Return True when SQLite says it cannot write the database file (SQLITE_UNWRITABLE)."""
    code = getattr(getattr(error, "orig", None) or error, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in SQLITE_UNWRITABLE


def busy(error: BaseException) -> bool:
    """Return True when the database answered that it takes no connection now: by its
    SQLSTATE (``BUSY_SQLSTATES``, in any language) where the error carries one, else by its
    words (``BUSY_WORDS``: libpq gives a refused connection none)."""
    cause = getattr(error, "orig", None) or error
    state = getattr(cause, "sqlstate", None)
    if state:
        return bool(state in BUSY_SQLSTATES)
    said = str(cause).lower()
    return any(word in said for word in BUSY_WORDS)


_budget: ContextVar[float | None] = ContextVar("write_budget_s", default=None)


@contextmanager
def write_budget(seconds: float) -> Iterator[None]:
    """Let every write retried inside this context (threads and tasks it starts included)
    try for ``seconds`` instead of ``RETRY_BUDGET_S``."""
    token = _budget.set(seconds)
    try:
        yield
    finally:
        _budget.reset(token)


def budget_s() -> float:
    """Return the write budget in force here."""
    budget = _budget.get()
    return RETRY_BUDGET_S if budget is None else budget


# The setting that bounds each PostgreSQL statement (app.db.engine.statement_timeout).
BOUND = "NIGHTDESK_DB_STATEMENT_TIMEOUT_S"


def mark_bound(error: BaseException, seconds: float) -> None:
    """Record on a driver's error the statement timeout its connection ran under: the error
    itself does not carry it, and ``said`` names it."""
    with suppress(AttributeError):
        error.nightdesk_bound_s = seconds  # type: ignore[attr-defined]


def cancelled_at_bound(error: BaseException) -> str | None:
    """Return the bound that PostgreSQL cancelled ``error``'s statement at (SQLSTATE 57014 in
    its words, "statement timeout"), as the setting and its value; None for any other error."""
    cause = getattr(error, "orig", None) or error
    if getattr(cause, "sqlstate", None) != "57014" or "statement timeout" not in str(cause):
        return None
    seconds = getattr(cause, "nightdesk_bound_s", None)
    return BOUND if seconds is None else f"{BOUND} ({seconds:g} s)"


def said(error: BaseException | None) -> str:
    """Return the error's first line, naming the setting and value that bound a statement
    the server cancelled (its words name neither)."""
    bound = None if error is None else cancelled_at_bound(error)
    if error is not None and sqlite_unwritable(error):
        return first_line(error) + (" (the database file cannot be written: its filesystem "
                                    "read-only or failing, or the file or folder not writable)")
    return first_line(error) + ("" if bound is None else f" ({bound})")


def outage(what: str, error: BaseException) -> StorageOutage:
    """Return the error that stops a batch whose write ``what`` met ``error`` (transient)
    until its budget ran out: the ticker stays resumable, the reason is named."""
    return StorageOutage(f"{what} within the write budget ({budget_s():g} s): {said(error)}")


def _past_budget(state: tenacity.RetryCallState) -> bool:
    """Stop when the next try would start past the budget in force where the write runs."""
    return bool(tenacity.stop_before_delay(budget_s())(state))


def _log_retry(state: tenacity.RetryCallState) -> None:
    """Log one line per failed try that will be tried again."""
    error = state.outcome.exception() if state.outcome else None
    log.warning("database write failed; retrying", write=getattr(state.fn, "__name__", "?"),
                tries=state.attempt_number, error=first_line(error))


# The delay before try n+1 is uniform(d/2, d), d = FIRST_DELAY_S doubling per try up to
# MAX_DELAY_S: half of it fixed, half jittered, so writers that failed together do not all
# come back together. No try starts past the budget; the last error is raised unchanged.
# The budget is read when each write runs, so a batch's ``write_budget`` reaches writes
# decorated at import.
_HALF_FIRST, _HALF_MAX = FIRST_DELAY_S / 2, MAX_DELAY_S / 2
POLICY: dict[str, Any] = {
    "retry": tenacity.retry_if_exception(transient),
    "wait": (tenacity.wait_exponential(multiplier=_HALF_FIRST, max=_HALF_MAX)
             + tenacity.wait_random_exponential(multiplier=_HALF_FIRST, max=_HALF_MAX)),
    "stop": _past_budget,
    "before_sleep": _log_retry,
    "reraise": True,
}


def retrying(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Call ``fn`` (which opens and commits its own transaction) until it passes.

    Transient errors are retried with jittered exponential backoff for up to the write
    budget (``budget_s``); any other error, or the last transient one, is raised.
    """
    return tenacity.Retrying(**POLICY)(fn, *args, **kwargs)


async def aretrying(fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """Await ``fn`` until it passes, retrying transient errors as ``retrying`` does."""
    result: T = await tenacity.AsyncRetrying(**POLICY)(fn, *args, **kwargs)
    return result


def _log_busy(state: tenacity.RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    log.warning("database takes no connection now; waiting", tries=state.attempt_number,
                wait_s=connect_wait_s(), error=first_line(error))


def connect_wait_s() -> float:
    """Return how long a connection refused as ``busy`` is asked again here: the write
    budget in force (a batch, a night's first connection), else ``READ_WAIT_S``."""
    budget = _budget.get()
    return READ_WAIT_S if budget is None else budget


def until_taken(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Call ``fn`` (which opens a connection; every engine's connect does: app.db.engine)
    until the database takes it: a ``busy`` refusal is tried again, with ``retrying``'s
    backoff, for ``connect_wait_s`` (the last try at its end, so "still so after N s" is
    true); any other error is raised, and the last refusal marked with the wait
    (``waited_s``), so no caller waits for it again (``transient``)."""
    bound = connect_wait_s()

    def wait(state: tenacity.RetryCallState) -> float:
        # The backoff, cut to what is left: the last try falls at the wait's end, never
        # short of it by a delay that would have passed it.
        return max(0.0, min(POLICY["wait"](state), bound - (state.seconds_since_start or 0.0)))

    def stop(state: tenacity.RetryCallState) -> bool:
        return (state.seconds_since_start or 0.0) >= bound

    policy = {**POLICY, "retry": tenacity.retry_if_exception(busy), "before_sleep": _log_busy,
              "wait": wait, "stop": stop}
    try:
        return tenacity.Retrying(**policy)(fn, *args, **kwargs)
    except Exception as error:
        if busy(error):
            with suppress(AttributeError):
                error.nightdesk_waited_s = bound  # type: ignore[attr-defined]
        raise


def waited_s(error: BaseException) -> float | None:
    """Return how long ``until_taken`` asked again before giving ``error`` up, if it did."""
    return getattr(getattr(error, "orig", None) or error, "nightdesk_waited_s", None)


def retried(fn: Callable[P, T]) -> Callable[P, T]:
    """Decorate a function that runs one write transaction so that it runs via ``retrying``."""
    return tenacity.retry(**POLICY)(fn)
