"""Run a database write again, as a whole transaction, while the database is briefly away.

A PostgreSQL restart (or an administrator terminating our backends) drops every pooled
connection: the next statement on each fails once with a connection error, and the pool's
pre-ping replaces it on the following checkout. SQLite answers "database is locked" while
another writer holds it past the busy timeout. Both pass; a write that fails for them is
tried again from the start, so a transaction either happened once or not at all. A
constraint violation or a bad statement is never retried: it would fail the same way.
"""

from __future__ import annotations

import asyncio
import functools
import random
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

import psycopg
import psycopg_pool
import structlog
from sqlalchemy.exc import DBAPIError, OperationalError

log = structlog.get_logger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

# Long enough for a PostgreSQL restart (a few seconds to a minute), short enough that a
# database that is really gone ends the write with its error within a couple of minutes.
RETRY_BUDGET_S = 120.0
FIRST_DELAY_S = 0.2
MAX_DELAY_S = 5.0


TRANSIENT_WORDS = ("locked", "busy", "terminat", "connection", "server closed", "shutdown",
                   "could not connect", "timeout", "timed out", "recovery mode", "starting up")


def transient(error: BaseException) -> bool:
    """Return True for errors that a later try of the same transaction may not meet.

    Takes SQLAlchemy's wrapped errors and the drivers' own (the checkpointer talks to
    psycopg and aiosqlite directly).
    """
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, psycopg_pool.PoolTimeout | psycopg.InterfaceError):
        return True
    if isinstance(error, OperationalError | psycopg.OperationalError | sqlite3.OperationalError):
        text = str(getattr(error, "orig", None) or error).lower()
        # OperationalError also covers "no such table"-like mistakes on SQLite: only the
        # connection and locking kinds pass with time.
        return any(word in text for word in TRANSIENT_WORDS)
    return False


def retrying(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Call ``fn`` (which opens and commits its own transaction) until it passes.

    Transient errors are retried with jittered exponential backoff for up to
    ``RETRY_BUDGET_S``; any other error, or the last transient one, is raised.
    """
    deadline = time.monotonic() + RETRY_BUDGET_S
    delay = FIRST_DELAY_S
    tries = 0
    while True:
        tries += 1
        try:
            return fn(*args, **kwargs)
        except DBAPIError as error:
            if not transient(error) or time.monotonic() + delay > deadline:
                raise
            log.warning("database write failed; retrying", write=fn.__name__, tries=tries,
                        error=str(error.orig or error).strip().splitlines()[0][:200])
            # Full jitter: writers that failed together do not all come back together.
            time.sleep(random.uniform(delay / 2, delay))
            delay = min(delay * 2, MAX_DELAY_S)


async def aretrying(fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """Await ``fn`` until it passes, retrying transient errors as ``retrying`` does."""
    deadline = time.monotonic() + RETRY_BUDGET_S
    delay = FIRST_DELAY_S
    tries = 0
    while True:
        tries += 1
        try:
            return await fn(*args, **kwargs)
        except Exception as error:
            if not transient(error) or time.monotonic() + delay > deadline:
                raise
            log.warning("database write failed; retrying", write=getattr(fn, "__name__", "?"),
                        tries=tries, error=str(error).strip().splitlines()[0][:200]
                        if str(error).strip() else type(error).__name__)
            await asyncio.sleep(random.uniform(delay / 2, delay))
            delay = min(delay * 2, MAX_DELAY_S)


def retried(fn: Callable[P, T]) -> Callable[P, T]:
    """Decorate a function that runs one write transaction so that it runs via ``retrying``."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        return retrying(fn, *args, **kwargs)

    return wrapper
