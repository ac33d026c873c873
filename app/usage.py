"""Write usage rows (llm_calls, llm_requests) off the event loop, in batches, exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import zlib
from collections.abc import Mapping
from typing import Any

import structlog
from sqlalchemy import Connection, Engine, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from app.db.models import LLMCall, LLMRequest

log = structlog.get_logger(__name__)

CALLS: Table = LLMCall.__table__  # type: ignore[assignment]
REQUESTS: Table = LLMRequest.__table__  # type: ignore[assignment]


def compress_body(body: Mapping[str, Any]) -> bytes:
    return zlib.compress(json.dumps(body, sort_keys=True).encode(), level=6)


def decompress_body(blob: bytes) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(zlib.decompress(blob))
    return data


def insert_ignoring_duplicates(target: Engine | Connection, table: Table,
                               rows: list[dict[str, Any]]) -> None:
    """Insert rows, skipping any whose unique key is stored already: a retry never doubles.

    Given a connection, the insert joins its open transaction; given an engine, it is one.
    """
    if not rows:
        return
    dialect = target.dialect.name
    stmt = postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
    if isinstance(target, Connection):
        target.execute(stmt.on_conflict_do_nothing(), rows)
        return
    with target.begin() as conn:
        conn.execute(stmt.on_conflict_do_nothing(), rows)


class UsageRecorder:
    """Buffer rows in memory and let one background task write them.

    ``record_*`` only appends to a list, so the call path never waits on the database.
    A failed write keeps its rows and tries again with backoff; the unique keys make a
    write that half-succeeded before failing harmless to repeat.
    """

    def __init__(self, engine: Engine, *, flush_interval_s: float = 0.25, max_rows: int = 500):
        self._engine = engine
        self._interval = flush_interval_s
        self._max_rows = max_rows
        self._pending: dict[str, list[dict[str, Any]]] = {"calls": [], "requests": []}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.written = 0
        self.write_failures = 0
        # Rows handed in and rows stored, per table: each list is written in order, so every
        # row handed in before a moment is stored once ``stored`` reaches ``recorded`` then.
        self._recorded = {"calls": 0, "requests": 0}
        self._stored = {"calls": 0, "requests": 0}
        self._progress = asyncio.Condition()

    def record_call(self, row: dict[str, Any]) -> None:
        self._pending["calls"].append(row)
        self._recorded["calls"] += 1
        if len(self._pending["calls"]) >= self._max_rows:
            self._wake.set()

    def record_request(self, key: Mapping[str, Any], body: Mapping[str, Any]) -> None:
        self._pending["requests"].append({**key, "body": compress_body(body)})
        self._recorded["requests"] += 1

    async def drain(self) -> None:
        """Return once every row handed in before this call is stored.

        The checkpointer calls this before storing a node as finished, so a node that a
        resume will not run again always has its usage rows. While the database is away
        this waits (the writer keeps retrying): no node is marked done without its rows.
        """
        target = dict(self._recorded)

        def stored() -> bool:
            return all(self._stored[name] >= target[name] for name in target)

        if stored():
            return
        if self._task is None:
            await self._flush()
            return
        self._wake.set()
        async with self._progress:
            await self._progress.wait_for(stored)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="usage-writer")

    async def close(self) -> None:
        """Write everything still buffered, then stop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None
        else:
            await self._flush()

    async def __aenter__(self) -> UsageRecorder:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(self) -> None:
        backoff = self._interval
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=backoff)
            self._wake.clear()
            ok = await self._flush()
            if self._closing and ok and not self._has_pending():
                return
            backoff = self._interval if ok else min(backoff * 2, 5.0)
            if self._closing and not ok and self.write_failures > 20:
                log.error("usage rows could not be written", pending=self._count_pending())
                raise RuntimeError("usage rows could not be written to the database")

    def _has_pending(self) -> bool:
        return any(self._pending.values())

    def _count_pending(self) -> int:
        return sum(len(v) for v in self._pending.values())

    async def _flush(self) -> bool:
        # Requests first: a call row never points at a body that is not stored yet.
        for name, table in (("requests", REQUESTS), ("calls", CALLS)):
            rows = self._pending[name]
            if not rows:
                continue
            self._pending[name] = []
            try:
                await asyncio.to_thread(insert_ignoring_duplicates, self._engine, table, rows)
            except SQLAlchemyError as error:
                self.write_failures += 1
                self._pending[name] = rows + self._pending[name]
                log.warning("usage write failed; will retry", table=name, rows=len(rows),
                            error=str(error).splitlines()[0])
                return False
            self.written += len(rows) if name == "calls" else 0
            self._stored[name] += len(rows)
        async with self._progress:
            self._progress.notify_all()
        return True
