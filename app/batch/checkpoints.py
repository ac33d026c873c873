"""Open the LangGraph checkpointer that makes a batch resumable node by node.

SQLite (the embedded default) keeps checkpoints in a file beside the database
(``nightdesk.db`` -> ``nightdesk.checkpoints.db``), so the batch's own writes and the
checkpoints never wait on one lock. PostgreSQL keeps them in the same database, in the
saver's own tables (``checkpoints``, ``checkpoint_blobs``, ``checkpoint_writes``,
``checkpoint_migrations``), through a small connection pool that replaces a connection a
restart killed.

Two guarantees are added around the stock savers:

- a checkpoint is stored only after the usage rows of the calls before it
  (``before_write`` flushes the recorder), so a node a resume skips never lacks its rows;
- a write that meets a database restart is retried as a unit (app.db.retry).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite
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
from sqlalchemy.engine import make_url

from agents.graph import STATE_TYPES
from app.db.retry import aretrying

log = structlog.get_logger(__name__)

BeforeWrite = Callable[[], Awaitable[None]]


class _Guarded:
    """Mixin for a stock async saver: flush usage rows first, retry through restarts."""

    before_write: BeforeWrite | None = None

    async def _ready(self) -> None:
        if self.before_write is not None:
            await self.before_write()

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions
                   ) -> RunnableConfig:
        await self._ready()
        result: RunnableConfig = await aretrying(
            super().aput, config, checkpoint, metadata, new_versions)  # type: ignore[misc]
        return result

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await self._ready()
        await aretrying(super().aput_writes, config, writes, task_id,  # type: ignore[misc]
                        task_path)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        result: CheckpointTuple | None = await aretrying(
            super().aget_tuple, config)  # type: ignore[misc]
        return result

    async def adelete_thread(self, thread_id: str) -> None:
        await aretrying(super().adelete_thread, thread_id)  # type: ignore[misc]


class GuardedSqliteSaver(_Guarded, AsyncSqliteSaver):
    """The SQLite saver with usage rows first and retried writes."""


class GuardedPostgresSaver(_Guarded, AsyncPostgresSaver):
    """The PostgreSQL saver with usage rows first and retried writes."""


def checkpoint_path(database_url: str) -> str:
    """Return the SQLite checkpoint file for a SQLite database URL (``:memory:`` stays so)."""
    database = make_url(database_url).database or ":memory:"
    if database == ":memory:":
        return database
    path = Path(database)
    return str(path.with_name(f"{path.stem}.checkpoints{path.suffix or '.db'}"))


def serializer() -> JsonPlusSerializer:
    """Return a serializer that restores exactly the state's own classes, nothing else."""
    return JsonPlusSerializer(allowed_msgpack_modules=list(STATE_TYPES))


@asynccontextmanager
async def open_checkpointer(database_url: str, *, before_write: BeforeWrite | None = None
                            ) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    """Yield a ready checkpointer for the database of ``database_url``; close it after."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        path = checkpoint_path(database_url)
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        async with aiosqlite.connect(path) as conn:
            # WAL + NORMAL: a commit survives the process being killed (what resume is for);
            # only a power cut can lose the last few, and then those nodes run again.
            await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute("PRAGMA synchronous=NORMAL")
            await conn.execute("PRAGMA busy_timeout=30000")
            sqlite_saver = GuardedSqliteSaver(conn, serde=serializer())
            sqlite_saver.before_write = before_write
            await sqlite_saver.setup()
            yield sqlite_saver
        return
    conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        conninfo, min_size=1, max_size=4, open=False,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        # A connection a restart killed is found on checkout and replaced.
        check=AsyncConnectionPool.check_connection)
    await aretrying(pool.open, wait=True, timeout=30)
    try:
        pg_saver = GuardedPostgresSaver(pool, serde=serializer())
        pg_saver.before_write = before_write
        await aretrying(pg_saver.setup)
        yield pg_saver
    finally:
        await pool.close()


async def prune(saver: BaseCheckpointSaver[Any], threads: Iterable[str]) -> None:
    """Delete the checkpoints of finished threads; a failure only leaves them behind."""
    for thread in threads:
        try:
            await saver.adelete_thread(thread)
        except Exception as error:  # stale checkpoints cost disk, never correctness
            log.warning("checkpoints not pruned", thread=thread, error=str(error)[:200])
