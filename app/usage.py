"""Write usage rows (llm_calls, llm_requests) off the event loop, in batches, exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import zlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog
import tenacity
from sqlalchemy import Connection, Engine, Table
from sqlalchemy.dialects import postgresql, sqlite

from app.db.models import LLMCall, LLMRequest
from app.db.retry import POLICY
from app.errors import UsageLost, first_line

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
    A write that fails transiently is tried again under the database writes' policy
    (app/db/retry.py); the unique keys make a write that half-succeeded harmless to repeat.
    When the policy gives up, or the database refuses the rows, the writer stops with
    ``UsageLost``: ``on_lost`` is called with it and ``drain`` and ``close`` raise it, so
    rows are never dropped without the batch stopping. ``sleep`` waits between tries.
    """

    def __init__(self, engine: Engine, *, flush_interval_s: float = 0.25, max_rows: int = 500,
                 on_lost: Callable[[UsageLost], None] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self._engine = engine
        self._interval = flush_interval_s
        self._max_rows = max_rows
        self._pending: dict[str, list[dict[str, Any]]] = {"calls": [], "requests": []}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._on_lost = on_lost
        self._sleep = sleep
        self.lost: UsageLost | None = None
        self.written = 0
        self.write_failures = 0  # failed tries of a write
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
        this waits while the writer retries, and raises ``UsageLost`` if it gives up: no
        node is marked done without its rows.
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
            await self._progress.wait_for(lambda: stored() or self.lost is not None)
        if self.lost is not None and not stored():
            raise self.lost

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="usage-writer")

    async def close(self) -> None:
        """Write everything still buffered, then stop; raise ``UsageLost`` if rows are not."""
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
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._interval)
            self._wake.clear()
            await self._flush()
            if self._closing and not self._has_pending():
                return

    def _has_pending(self) -> bool:
        return any(self._pending.values())

    def _count_pending(self) -> int:
        return sum(len(v) for v in self._pending.values())

    async def _flush(self) -> None:
        if self.lost is not None:
            raise self.lost
        # Requests first: a call row never points at a body that is not stored yet.
        for name, table in (("requests", REQUESTS), ("calls", CALLS)):
            rows = self._pending[name]
            if not rows:
                continue
            self._pending[name] = []
            retrying = tenacity.AsyncRetrying(**{
                **POLICY, "sleep": self._sleep,
                "before_sleep": functools.partial(self._failed_try, name, len(rows))})
            try:
                await retrying(asyncio.to_thread, insert_ignoring_duplicates, self._engine,
                               table, rows)
            except Exception as error:
                self.write_failures += 1
                self._pending[name] = rows + self._pending[name]
                raise await self._give_up(error) from error
            self.written += len(rows) if name == "calls" else 0
            self._stored[name] += len(rows)
        async with self._progress:
            self._progress.notify_all()

    def _failed_try(self, table: str, rows: int, state: tenacity.RetryCallState) -> None:
        self.write_failures += 1
        error = state.outcome.exception() if state.outcome else None
        log.warning("usage write failed; will retry", table=table, rows=rows,
                    tries=state.attempt_number, error=first_line(error))

    async def _give_up(self, error: BaseException) -> UsageLost:
        """Stop the writer for good: say why once, wake every ``drain``; return UsageLost."""
        self.lost = UsageLost(f"usage rows could not be stored ({self._count_pending()} "
                              f"not written): {first_line(error)}")
        log.error("usage writer gave up", pending=self._count_pending(),
                  error=first_line(error))
        if self._on_lost is not None:
            self._on_lost(self.lost)
        async with self._progress:
            self._progress.notify_all()
        return self.lost
