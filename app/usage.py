"""Write usage rows (llm_calls, llm_requests) off the event loop, in batches, exactly once.

Rows the database does not take within the write budget (full, or away) are kept in a spool
file of their batch (under the home, else off it: ``spare_place``) and written first when
the batch runs again (``run --resume``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import json
import os
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog
import tenacity
from sqlalchemy import Connection, Engine, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url

from app.db.models import LLMCall, LLMRequest
from app.db.retry import POLICY, budget_s, said, transient
from app.errors import BatchStopped, DatabaseError, StorageOutage, UsageLost, first_line
from app.tasks import beside, in_thread

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


def spool_path(home: Path, database_url: str, batch_id: int) -> Path:
    """Return where a batch's unstored usage rows are kept: under ``home``, one file per
    database and batch (the URL's password is not part of the name)."""
    where = make_url(database_url).render_as_string(hide_password=True)
    tag = hashlib.sha256(where.encode()).hexdigest()[:12]
    return home / "spool" / f"usage-{tag}-batch-{batch_id}.jsonl"


# The units' runtime directory (RuntimeDirectory=nightdesk): read on every resume, so one run
# from a shell finds the rows a unit's run kept there.
UNITS_RUNTIME = Path("/run/nightdesk")


def spare_place() -> Path | None:
    """Return where a spool goes when the home takes no write (its filesystem forced
    read-only): the service's runtime directory (systemd's ``$RUNTIME_DIRECTORY``,
    /run/nightdesk under the units), else the user's (``$XDG_RUNTIME_DIR``/nightdesk), None
    without either. A tmpfs, emptied by a reboot: the stop's line says so."""
    if service := os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]:
        return Path(service)
    user = os.environ.get("XDG_RUNTIME_DIR")
    return Path(user, "nightdesk") if user else None


def _encode(value: object) -> Any:
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode()}
    raise TypeError(f"cannot spool a {type(value).__name__}")


def _decode(obj: dict[str, Any]) -> Any:
    if obj.keys() == {"$datetime"}:
        return datetime.fromisoformat(obj["$datetime"])
    if obj.keys() == {"$bytes"}:
        return base64.b64decode(obj["$bytes"])
    return obj


# The spool is written when the database will not take rows, most often because its disk is
# full; under the default home that is the spool's disk too, so room for it is set aside
# (``set_aside``: a file of this size beside it) while a batch writes, and given back just
# before the spool is written.
SPOOL_RESERVE_BYTES = 8 * 1024 * 1024


def _reserve(spool: Path) -> Path:
    return spool.with_name(spool.name + ".reserve")


def set_aside(spool: Path) -> None:
    """Set ``SPOOL_RESERVE_BYTES`` aside for ``spool``; a disk already too full is logged."""
    reserve = _reserve(spool)
    try:
        reserve.parent.mkdir(parents=True, exist_ok=True)
        with reserve.open("wb") as out:
            os.posix_fallocate(out.fileno(), 0, SPOOL_RESERVE_BYTES)
    except OSError as error:
        reserve.unlink(missing_ok=True)
        log.warning("no room set aside for the usage spool", spool=str(spool),
                    error=first_line(error, typed=True))


def write_spool(path: Path, pending: Mapping[str, list[dict[str, Any]]]) -> None:
    """Replace ``path`` with ``pending`` (one JSON line per row), durably: written to a
    temporary file, flushed to disk, then renamed over the old one; the room set aside for
    it is given back first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _reserve(path).unlink(missing_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    try:
        with temporary.open("w", encoding="utf-8") as out:
            for table, rows in pending.items():
                for row in rows:
                    out.write(json.dumps({"table": table, "row": row}, default=_encode) + "\n")
            out.flush()
            os.fsync(out.fileno())
    except OSError:
        temporary.unlink(missing_ok=True)
        raise
    temporary.replace(path)


def read_spool(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Return the rows kept in ``path`` per table (none when there is no such file)."""
    rows: dict[str, list[dict[str, Any]]] = {"calls": [], "requests": []}
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return rows
    for line in text.splitlines():
        if line.strip():
            entry = json.loads(line, object_hook=_decode)
            rows[entry["table"]].append(entry["row"])
    return rows


class UsageRecorder:
    """Buffer rows in memory and let one task write them while its ``async with`` lasts.

    ``record_*`` only appends to a list, so the call path never waits on the database.
    A write that fails transiently (the database away, its disk full) is tried again for the
    write budget (app/db/retry.py); the unique keys make a write that half-succeeded
    harmless to repeat. When the budget runs out the writer stops with ``StorageOutage``
    and every row not stored, then or later, goes to ``spool``: entered in the batch's
    next run, it writes them first, so no row is lost and none is stored twice. Rows the
    database refuses (or that cannot be spooled) stop it with ``UsageLost``. Either way
    ``stopped`` is set (``lost`` says why), and ``drain`` and its exit raise the same
    error: the batch waits on ``stopped`` beside its work and halts, so rows are never left
    unstored without the batch stopping. ``sleep`` waits between tries.
    """

    def __init__(self, engine: Engine, *, flush_interval_s: float = 0.25, max_rows: int = 500,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 spool: Path | None = None):
        self._engine = engine
        self._interval = flush_interval_s
        self._max_rows = max_rows
        self._pending: dict[str, list[dict[str, Any]]] = {"calls": [], "requests": []}
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None  # while this context is entered
        self._closing = False
        self._sleep = sleep
        self._spool = spool
        self._spooled = False  # the spool file holds rows not yet stored
        self._off_home = False  # they are kept off the home (``spare_place``)
        self._why = ""  # what the database said when the writer stopped
        self.lost: BatchStopped | None = None
        self.stopped = asyncio.Event()  # set once the writer gives up, ``lost`` set before
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
        this waits while the writer retries, and raises what stopped the writer if it
        stops: no node is marked done without its rows.
        """
        target = dict(self._recorded)

        def stored() -> bool:
            return all(self._stored[name] >= target[name] for name in target)

        if stored():
            return
        if self._writer is None:
            await self._flush()
            return
        self._wake.set()
        async with self._progress:
            await self._progress.wait_for(lambda: stored() or self.lost is not None)
        if self.lost is not None and not stored():
            raise self.lost

    async def __aenter__(self) -> UsageRecorder:
        """Take up the rows an earlier run of the batch kept in the spool, then write in a
        task of this context's own until it exits; a spool that cannot be read raises
        DatabaseError (one line)."""
        self._life = self._writing()
        await self._life.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        """Write everything still buffered, then stop, the body's error or not; raise what
        stopped the writer if rows are not stored (those a stop kept are in the spool, those
        handed in since too)."""
        await self._life.__aexit__(*exc)

    @contextlib.asynccontextmanager
    async def _writing(self) -> AsyncIterator[None]:
        for spool in self._spools():
            try:
                kept = await in_thread(read_spool, spool)
            except (OSError, ValueError, KeyError, TypeError) as error:
                # Going on without them would lose them: the batch does not start.
                raise DatabaseError(f"cannot read the usage rows kept in {spool}: "
                                    f"{first_line(error, typed=True)}") from None
            for name, rows in kept.items():
                self._pending[name] = rows + self._pending[name]
                self._recorded[name] += len(rows)
                self._spooled |= bool(rows)
            if any(kept.values()):
                log.info("usage rows taken from the spool", spool=str(spool),
                         calls=len(kept["calls"]), requests=len(kept["requests"]))
        if self._spool is not None:
            await in_thread(set_aside, self._spool)
        held: BaseException | None = None
        try:
            # The writer's own error (not a stop) is raised by ``beside`` as itself.
            async with beside(self._close) as group:
                self._writer = group.create_task(self._run(), name="usage-writer")
                try:
                    yield
                except BaseException as error:  # raised below, once the last rows are written
                    held = error
        finally:
            self._writer = None
        stopped_before = self.lost
        try:
            await self._flush()
        except StorageOutage as kept_rows:
            # Already told to the batch, which stopped for it; every row is in the spool.
            if kept_rows is not stopped_before:
                raise
        finally:
            if self._spool is not None:
                with contextlib.suppress(OSError):  # a spool's folder gone: nothing to give back
                    await in_thread(_reserve(self._spool).unlink, missing_ok=True)
        if held is not None:
            raise held

    def _close(self) -> None:
        """Let the writer write what is left, then end."""
        self._closing = True
        self._wake.set()

    async def _run(self) -> None:
        with contextlib.suppress(BatchStopped):  # told through ``stopped``, raised at exit
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self._interval)
                self._wake.clear()
                await self._flush()
                if self._closing and not self._has_pending():
                    return

    def _spools(self) -> list[Path]:
        """Return the spool, its spare (``spare_place``) and the units' (``UNITS_RUNTIME``):
        where kept rows may be."""
        spool, spare = self._spool, spare_place()
        places = [] if spare is None else [spare]
        return [] if spool is None else list(dict.fromkeys(
            [spool, *(place / spool.name for place in [*places, UNITS_RUNTIME])]))

    @property
    def untold(self) -> BatchStopped | None:
        """Return what stopped the writer when the batch's line must say it: rows lost, or
        kept off the home (a reboot empties that place); None otherwise."""
        return None if isinstance(self.lost, StorageOutage) and not self._off_home else self.lost

    def _has_pending(self) -> bool:
        return any(self._pending.values())

    def _count_pending(self) -> int:
        return sum(len(v) for v in self._pending.values())

    async def _flush(self) -> None:
        if self.lost is not None:
            if isinstance(self.lost, StorageOutage) and self._has_pending():
                # Rows handed in after the stop (calls that ended in its grace) join those
                # kept: the spool is rewritten with every row not stored.
                await self._keep()
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
                await retrying(in_thread, insert_ignoring_duplicates, self._engine,
                               table, rows)
            except Exception as error:
                self.write_failures += 1
                self._pending[name] = rows + self._pending[name]
                raise await self._give_up(error) from error
            self.written += len(rows) if name == "calls" else 0
            self._stored[name] += len(rows)
        if self._spooled and not self._has_pending():
            # Every row the spools held is stored now (they were written first).
            for spool in self._spools():
                await in_thread(spool.unlink, missing_ok=True)
            self._spooled = False
        async with self._progress:
            self._progress.notify_all()

    def _failed_try(self, table: str, rows: int, state: tenacity.RetryCallState) -> None:
        self.write_failures += 1
        error = state.outcome.exception() if state.outcome else None
        log.warning("usage write failed; will retry", table=table, rows=rows,
                    tries=state.attempt_number, error=first_line(error))

    async def _keep(self) -> None:
        """Write every row not stored to the spool; set ``lost`` to what the writer stopped
        with: ``StorageOutage`` once they are kept, ``UsageLost`` if they cannot be."""
        assert self._spool is not None
        pending, spool, spare = self._count_pending(), self._spool, spare_place()
        where = str(spool)
        try:
            await in_thread(write_spool, spool, self._pending)
        except OSError as error:
            said = f"{spool}: {error.strerror or error}"
            try:  # the home takes no write (forced read-only): a place off it, if there is one
                if spare is None:
                    raise error
                spool = spare / spool.name
                await in_thread(write_spool, spool, self._pending)
            except OSError as also:
                said += "" if also is error else f"; nor in {spool}: {also.strerror or also}"
                self.lost = UsageLost(f"usage rows could not be stored ({pending} not written):"
                                      f" {self._why}; nor kept in {said}")
                return
            self._off_home = True
            where = f"{spool} (not in {said}; a reboot empties that place)"
        self._spooled = True
        if self.lost is None:  # kept again at close: the rows joined the same spool
            self.lost = StorageOutage(
                f"usage rows not stored within the write budget ({budget_s():g} s): "
                f"{self._why}; kept in {where} for the resume")
        log.warning("usage rows kept for the resume", rows=pending, spool=str(spool))

    async def _give_up(self, error: BaseException) -> BatchStopped:
        """Stop the writer: keep the rows for a resume when the database may take them
        later, say why once, wake every ``drain``; return the error it stopped with."""
        self._why = said(error)
        if transient(error) and self._spool is not None:
            await self._keep()
        else:
            self.lost = UsageLost(f"usage rows could not be stored ({self._count_pending()} "
                                  f"not written): {first_line(error)}")
        assert self.lost is not None
        log.error("usage writer gave up", pending=self._count_pending(),
                  error=first_line(error), reason=str(self.lost))
        self.stopped.set()
        async with self._progress:
            self._progress.notify_all()
        return self.lost
