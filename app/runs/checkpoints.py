"""The LangGraph checkpoints that make a batch resumable node by node (``Checkpoints``, handed
to the engine by whoever runs it).

SQLite keeps checkpoints in a file beside the database, PostgreSQL in the database itself.
The savers flush usage rows before a write, retry through a restart or a full disk for the
write budget (past it the batch stops resumable: ``StorageOutage``), and close only once no
call they were handed runs (their task group, ``calls``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import psycopg
import structlog
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine, select
from sqlalchemy.engine import make_url

from agents.graph import STATE_TYPES, thread_id
from app.config import STATEMENT_TIMEOUT_S
from app.db.engine import (
    AnsweredAsyncConnection,
    answer_bound,
    connect_args,
    reason,
    sqlite_file,
)
from app.db.models import TickerRun
from app.db.retry import aretrying, mark_bound, outage, transient
from app.errors import DatabaseError
from app.home import unwritable
from app.morning.summary import tickers_left
from app.tasks import beside

log = structlog.get_logger(__name__)

BeforeWrite = Callable[[], Awaitable[None]]
T = TypeVar("T")
# How long one try at opening the checkpoint pool waits for its first connection.
POOL_OPEN_S = 30.0


class _Guarded(BaseCheckpointSaver[Any]):
    """Mixin for a stock async saver: flush usage rows first, retry through restarts, and own
    every call until it is over."""

    before_write: BeforeWrite | None = None
    calls: asyncio.TaskGroup | None = None  # open_checkpointer's: the connection's lifetime
    statement_timeout_s: float | None = None  # its PostgreSQL pool's, for the stop's line

    async def _write(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        if self.before_write is not None:
            await self.before_write()
        return await _retried("checkpoint not stored", self.statement_timeout_s, fn, *args)

    async def _own(self, call: Coroutine[Any, Any, T]) -> T:
        """Run ``call`` in a task of the saver's group (``calls``) and return its result; a
        cancelled caller leaves it running to its end, which the saver's exit waits for."""
        # LangGraph's writes of a cancelled node outlive the graph run, and a SQLite
        # connection closed under one keeps the file's write lock.
        assert self.calls is not None, "a saver is used inside open_checkpointer only"
        task = self.calls.create_task(_outcome(call))
        try:
            return (await asyncio.shield(task)).result()
        except asyncio.CancelledError:
            task.add_done_callback(_report_left_behind)
            raise

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions
                   ) -> RunnableConfig:
        return await self._own(self._write(super().aput, config, checkpoint, metadata,
                                           new_versions))

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await self._own(self._write(super().aput_writes, config, writes, task_id, task_path))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._own(_retried("checkpoint not read", self.statement_timeout_s,
                                         super().aget_tuple, config))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._own(aretrying(super().adelete_thread, thread_id))


async def _retried(what: str, bound_s: float | None, fn: Callable[..., Awaitable[T]],
                   *args: Any) -> T:
    """Await ``fn`` under the write policy; past its budget, raise ``StorageOutage`` (naming
    the statement timeout ``bound_s`` where the server cancelled the statement at it)."""
    try:
        return await aretrying(fn, *args)
    except Exception as error:
        if not transient(error):
            raise
        if bound_s is not None:
            mark_bound(error, bound_s)
        # The database failed, not the ticker: its node stays unstored and runs again on
        # resume, so the ticker stops resumable instead of failing for good.
        raise outage(what, error) from error


async def _outcome(call: Awaitable[T]) -> asyncio.Future[T]:
    """Await ``call``; return what it returned or raised, as a done future: a call's error is
    its caller's, and would end the saver's group (every other call cut) if raised there."""
    outcome: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    try:
        outcome.set_result(await call)
    except Exception as error:
        outcome.set_exception(error)
    return outcome


def _report_left_behind(task: asyncio.Task[asyncio.Future[Any]]) -> None:
    """Log the failure of a checkpoint call whose caller was cancelled (none else sees it)."""
    if not task.cancelled() and (error := task.result().exception()) is not None:
        log.warning("checkpoint write failed after its caller stopped", error=str(error)[:200])


class GuardedSqliteSaver(_Guarded, AsyncSqliteSaver):
    """The SQLite saver with usage rows first and retried writes."""


class GuardedPostgresSaver(_Guarded, AsyncPostgresSaver):
    """The PostgreSQL saver with usage rows first and retried writes."""


def checkpoint_path(database_url: str) -> str:
    """Return the SQLite checkpoint file for a SQLite database URL (``:memory:`` stays so)."""
    database = sqlite_file(database_url)
    if database == ":memory:":
        return database
    path = Path(database)
    return str(path.with_name(f"{path.stem}.checkpoints{path.suffix or '.db'}"))


def check_checkpoints(database_url: str) -> None:
    """Raise DatabaseError in one line when a SQLite checkpoint file cannot be used, before
    a batch row exists (PostgreSQL's checkpoints are in the database checked already)."""
    path = checkpoint_path(database_url)
    if make_url(database_url).get_backend_name() != "sqlite" or path == ":memory:":
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA schema_version").fetchone()  # reads the file's header
    except (sqlite3.Error, OSError) as error:
        why = unwritable(Path(path).parent)  # SQLite's words for it name no cause
        raise DatabaseError(f"cannot open the checkpoint file {path}: " + (
            f"{why}: make it writable (remount its filesystem read-write, or set "
            "NIGHTDESK_HOME to a writable folder), then run the command again" if why
            else reason(error))) from None


def serializer() -> JsonPlusSerializer:
    """Return a serializer that restores exactly the state's own classes, nothing else."""
    return JsonPlusSerializer(allowed_msgpack_modules=list(STATE_TYPES))


@asynccontextmanager
async def open_checkpointer(database_url: str, *, before_write: BeforeWrite | None = None,
                            statement_timeout_s: float = STATEMENT_TIMEOUT_S
                            ) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    """Yield a ready checkpointer for the database of ``database_url``; close it after.

    On PostgreSQL each statement of its pool is bounded by ``statement_timeout_s``
    (``NIGHTDESK_DB_STATEMENT_TIMEOUT_S``), as the engines' are: a write cancelled at it is
    retried within the write budget, past which the batch stops resumable (``_retried``).
    """
    url = make_url(database_url)
    async with contextlib.AsyncExitStack() as closing:  # closed last to first
        saver: GuardedSqliteSaver | GuardedPostgresSaver
        if url.get_backend_name() == "sqlite":
            path = checkpoint_path(database_url)
            if path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            conn = await closing.enter_async_context(aiosqlite.connect(path))
            # An open transaction of a cut statement would keep the write lock.
            closing.push_async_callback(conn.rollback)
            # WAL + NORMAL: a commit survives a kill; a power cut only reruns the last nodes.
            await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute("PRAGMA synchronous=NORMAL")
            await conn.execute("PRAGMA busy_timeout=30000")
            saver = GuardedSqliteSaver(conn, serde=serializer())
            await saver.setup()
        else:
            conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)

            async def opened() -> AsyncConnectionPool[Any]:
                # psycopg closes a pool that is not ready in time, for good: each try its own.
                pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                    conninfo, min_size=1, max_size=4, open=False,
                    kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row,
                            **connect_args(url, "statement_timeout", statement_timeout_s)},
                    # A connection a restart killed, or one to a server that now takes no
                    # writes (a standby: a failover), is found on checkout and replaced.
                    check=_writable,
                    connection_class=AnsweredAsyncConnection, configure=_answered(
                        answer_bound(statement_timeout_s)))
                try:
                    await pool.open(wait=True, timeout=POOL_OPEN_S)
                except BaseException:
                    await pool.close()
                    raise
                return pool

            pool = await aretrying(opened)
            closing.push_async_callback(pool.close)
            saver = GuardedPostgresSaver(pool, serde=serializer())
            saver.statement_timeout_s = statement_timeout_s
            await aretrying(saver.setup)
        saver.before_write = before_write
        # Closed first, before the connection: its exit waits for every call handed to the
        # saver (a cancelled node's write too), and cancelled, still for their end. The
        # saver owns them, not the callers' groups: LangGraph starts such a write once it
        # has cancelled the node, and nothing of the batch awaits it.
        saver.calls = await closing.enter_async_context(beside())
        yield saver


async def _writable(conn: AnsweredAsyncConnection) -> None:
    """The pool's ``check``: raise for a connection that is lost or takes no writes (closed
    first: the pool would put a live one back, and hand it out again)."""
    row = await (await conn.execute("SHOW transaction_read_only")).fetchone()
    if (row or {}).get("transaction_read_only") != "off":
        await conn.close()
        raise psycopg.OperationalError("the server takes no writes now")


def _answered(seconds: float) -> Callable[[AnsweredAsyncConnection], Awaitable[None]]:
    """Return the pool's ``configure``: each connection's exchanges bounded at ``seconds``."""
    async def configure(conn: AnsweredAsyncConnection) -> None:
        conn.answer_s = seconds
    return configure


@dataclass(frozen=True)
class Checkpoints:
    """A batch's checkpoints: in the database of ``database_url``, or beside it (SQLite),
    with its rows in ``engine``."""

    database_url: str
    engine: Engine
    statement_timeout_s: float = STATEMENT_TIMEOUT_S  # NIGHTDESK_DB_STATEMENT_TIMEOUT_S

    def open(self, before_write: BeforeWrite | None = None
             ) -> AbstractAsyncContextManager[BaseCheckpointSaver[Any]]:
        """Return the checkpointer, ready when entered and closed after."""
        return open_checkpointer(self.database_url, before_write=before_write,
                                 statement_timeout_s=self.statement_timeout_s)

    async def prune(self, saver: BaseCheckpointSaver[Any], threads: Iterable[str]) -> None:
        """Delete the checkpoints of finished threads; a failure only leaves them behind."""
        for thread in threads:
            try:
                await saver.adelete_thread(thread)
            except Exception as error:  # stale checkpoints cost disk, never correctness
                log.warning("checkpoints not pruned", thread=thread, error=str(error)[:200])

    def finished(self, batch_id: int) -> list[str]:
        """Return the checkpoint thread of every (ticker, sample) of a batch, but for tickers
        a resume still takes up (failed to the infrastructure): a resume continues those."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(TickerRun.ticker, TickerRun.samples)
                                .where(TickerRun.batch_id == batch_id)).all()
            left = set(tickers_left(conn, batch_id))
        return [thread_id(batch_id, ticker, s) for ticker, samples in rows
                if ticker not in left for s in range(samples)]
