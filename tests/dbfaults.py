"""Make a real database refuse writes for a while: a full disk, a database that is away.

SQLite: ``PRAGMA max_page_count`` clamped to the file's size makes every write that needs a
new page fail with a real ``SQLITE_FULL`` ("database or disk is full"). The pragma holds
per connection, so it is set on each checkout of an engine's pool, and on the checkpoint
saver's own connection (caught as it opens) whenever the fault starts or ends.

PostgreSQL: a statement trigger raises SQLSTATE ``disk_full`` on the tables named while a
row of ``test_faults`` says so; ``TcpProxy`` stands between the client and the server and
can cut every connection and refuse new ones for a while (the database "away").

``check_rows_match`` holds a night's usage rows against the fake servers' request logs;
``timed_apart`` times statements on several connections at once, until each gives up.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, MutableMapping
from typing import Any

import aiosqlite
import psycopg
import pytest
from psycopg import sql
from sqlalchemy import Engine, event, select

import app.runs.checkpoints
from app.batch.engine import BatchEngine, BatchOutcome, BatchPlan, Resume
from app.db.models import LLMCall, LLMRequest
from tests.fakevllm import ChatRequest, FakeServer

UNLIMITED_PAGES = 1_073_741_823  # SQLite's own default maximum


class SqliteFull:
    """A full disk under SQLite files, from ``hold(seconds)`` (or ``hold()``: until
    ``release``). ``engine`` puts it under an engine; ``checkpoints`` under the checkpoint
    file of every checkpointer opened meanwhile."""

    def __init__(self) -> None:
        self.until = 0.0
        self._savers: list[aiosqlite.Connection] = []

    @property
    def full(self) -> bool:
        return time.monotonic() < self.until

    def hold(self, seconds: float = float("inf")) -> None:
        self.until = time.monotonic() + seconds

    def release(self) -> None:
        self.until = 0.0

    def _pages(self) -> int:
        return 1 if self.full else UNLIMITED_PAGES  # 1: clamped to the file's size

    @contextlib.contextmanager
    def engine(self, engine: Engine) -> Iterator[None]:
        def checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
            dbapi_conn.execute(f"PRAGMA max_page_count = {self._pages()}")

        event.listen(engine, "checkout", checkout)
        try:
            yield
        finally:
            event.remove(engine, "checkout", checkout)
            engine.dispose()  # no pooled connection keeps a clamped size

    @contextlib.asynccontextmanager
    async def checkpoints(self, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
        real = aiosqlite.connect

        def connect(*args: Any, **kwargs: Any) -> aiosqlite.Connection:
            conn = real(*args, **kwargs)
            self._savers.append(conn)
            return conn

        monkeypatch.setattr(app.runs.checkpoints.aiosqlite, "connect", connect)

        async def follow() -> None:
            applied: dict[int, int] = {}
            while True:
                pages = self._pages()
                for conn in list(self._savers):
                    if applied.get(id(conn)) != pages:
                        with contextlib.suppress(Exception):  # not open yet, or closed
                            await conn.execute(f"PRAGMA max_page_count = {pages}")
                            applied[id(conn)] = pages
                await asyncio.sleep(0.02)

        async with asyncio.TaskGroup() as tasks:
            follower = tasks.create_task(follow())
            try:
                yield
            finally:
                follower.cancel()


PG_FAULT = """
CREATE TABLE IF NOT EXISTS test_faults (until timestamptz);
INSERT INTO test_faults SELECT NULL WHERE NOT EXISTS (SELECT 1 FROM test_faults);
CREATE OR REPLACE FUNCTION test_disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF (SELECT until FROM test_faults) > clock_timestamp() THEN
    RAISE EXCEPTION 'could not extend file "base/test": No space left on device'
      USING ERRCODE = 'disk_full';
  END IF;
  RETURN NULL;
END $$;
"""


class PostgresFull:
    """A full disk for the writes to some tables of a PostgreSQL database."""

    def __init__(self, dsn: str, tables: list[str]) -> None:
        self.dsn = dsn
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(PG_FAULT)
            for table in tables:
                conn.execute(sql.SQL(
                    "CREATE TRIGGER {} BEFORE INSERT OR UPDATE ON {} FOR EACH STATEMENT "
                    "EXECUTE FUNCTION test_disk_full()").format(
                        sql.Identifier(f"test_full_{table}"), sql.Identifier(table)))

    def hold(self, seconds: float | None = None) -> None:
        """Fill the disk for ``seconds`` (None: until ``release``), timed by the server."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            if seconds is None:
                conn.execute("UPDATE test_faults SET until = 'infinity'")
            else:
                conn.execute("UPDATE test_faults SET until = clock_timestamp() "
                             "+ make_interval(secs => %s)", (seconds,))

    def release(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("UPDATE test_faults SET until = NULL")


class TcpProxy:
    """Forward a port of ``host`` to ``target``; ``cut(seconds)`` drops every connection and
    refuses new ones for ``seconds`` (a database that is away), then serves again;
    ``swallow`` keeps every connection open, and takes new ones, but passes nothing on (a
    server that takes TCP and never answers)."""

    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1") -> None:
        self.target = target
        self.host = host
        with socket.socket() as probe:
            probe.bind((host, 0))
            self.port = probe.getsockname()[1]
        self.cuts = 0
        self.commits = 0
        self.lost_acks = 0
        self._lose: Callable[[int], bool] = lambda n: False
        self._swallow_until = 0.0
        self._keep: int | None = None  # of the server's answers, bytes still passed on
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._call(self._listen())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        losing = False  # the server's next answer is to a COMMIT whose answer is lost

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            nonlocal losing
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await source.read(65536):
                    if sink is up_writer and b"COMMIT" in data:
                        self.commits += 1
                        losing = self._lose(self.commits)
                    elif sink is writer and losing:
                        self.lost_acks += 1
                        writer.transport.abort()
                        up_writer.transport.abort()
                        return
                    data = self._swallowed(data, to_client=sink is writer)
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    async def _drop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await self._server.wait_closed()

    async def _back_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self._listen()

    def cut(self, seconds: float) -> None:
        """Drop every connection now and refuse new ones for ``seconds`` (returns at once)."""
        self.cuts += 1
        self._call(self._drop())
        # Scheduled through the loop's own thread: a timer set from here would not wake it.
        asyncio.run_coroutine_threadsafe(self._back_after(seconds), self._loop)

    def lose_acks(self, which: Callable[[int], bool]) -> None:
        """From now, for each COMMIT ``n`` (counted from 1) for which ``which(n)``, drop its
        connection instead of passing the server's answer on: the commit stored, the client
        told only that its connection was lost (a restart at the worst moment)."""
        self._lose = which

    def swallow(self, seconds: float = float("inf"), keep: int | None = None) -> None:
        """For ``seconds`` pass nothing on either way; with ``keep``, pass the client's bytes
        and the first ``keep`` bytes of the server's answers (a result stalled part way).
        Connections stay open, their bytes lost: a client waits until it gives up."""
        self._keep = keep
        self._swallow_until = time.monotonic() + seconds

    def _swallowed(self, data: bytes, to_client: bool) -> bytes:
        if time.monotonic() >= self._swallow_until:
            return data
        if self._keep is None:
            return b""
        if not to_client:
            return data
        passed, self._keep = data[:self._keep], max(0, self._keep - len(data))
        return passed

    def close(self) -> None:
        if not self._loop.is_running():
            return  # closed already
        with contextlib.suppress(Exception):
            self._call(self._drop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def fill_at(disk: SqliteFull | PostgresFull, chat_index: int, seconds: float
            ) -> Callable[[ChatRequest], None]:
    """A fake server script that fills the disk when chat ``chat_index`` arrives."""
    def script(chat: ChatRequest) -> None:
        if chat.index == chat_index:
            disk.hold(seconds)
    return script


def failed_writes(logs: list[MutableMapping[str, Any]]) -> list[str]:
    """Return what each failed try of a database write (retried) said, a connection refused
    and waited for (app/db/retry.py's busy wait) included."""
    return [e["error"] for e in logs if e["event"] in (
        "database write failed; retrying", "usage write failed; will retry",
        "database takes no connection now; waiting")]


def check_rows_match(db: Engine, *servers: FakeServer) -> None:
    """Every request the servers saw has exactly one llm_calls row and one body per call."""
    with db.connect() as conn:
        calls = conn.execute(select(LLMCall.ticker, LLMCall.node, LLMCall.status,
                                    LLMCall.call_id, LLMCall.attempt)).all()
        bodies = conn.execute(select(LLMRequest.call_id)).scalars().all()
    chats = [c for s in servers for c in s.chats]
    assert len(calls) == len(chats)
    assert len({(c.call_id, c.attempt) for c in calls}) == len(calls)
    assert Counter((t, n) for t, n, s, *_ in calls if s == "ok") == Counter(
        (c.ticker, c.node) for s in servers for c in s.served())
    assert sorted(bodies) == sorted({c.call_id for c in calls})


async def run_freeing_the_disk_at_the_stop(runner: BatchEngine, plan: BatchPlan | Resume,
                                           disk: SqliteFull | PostgresFull) -> BatchOutcome:
    """Run ``plan`` (a new batch or a resume); free the disk once the batch asks to stop (an
    operator freeing space later: the stopped batch can still write its end)."""
    async def free() -> None:
        await runner.halt.requested.wait()
        disk.release()

    async with asyncio.TaskGroup() as tasks:
        freeing = tasks.create_task(free())
        try:
            return await runner.run(plan)
        finally:
            freeing.cancel()


def timed_apart(runs: Mapping[str, Callable[[], object]], took: dict[str, Any],
                go: threading.Event | None = None) -> list[threading.Thread]:
    """Start a daemon thread per run of ``runs`` (a statement on one connection each): once
    ``go`` is set (at once without it) it runs, and ``took[name]`` says ``"answered"``, or
    the seconds it waited until its connection gave up (raised). Return the threads."""
    def timed(name: str, run: Callable[[], object]) -> None:
        if go is not None:
            go.wait()
        started = time.monotonic()
        try:
            run()
            took[name] = "answered"
        except Exception:
            took[name] = time.monotonic() - started

    threads = [threading.Thread(target=timed, args=item, daemon=True) for item in runs.items()]
    for thread in threads:
        thread.start()
    return threads


class Held:
    """Another session that ran ``statement`` in an open transaction and keeps its locks until
    ``release`` or ``seconds`` later; ``pid`` is its backend's."""

    def __init__(self, dsn: str, statement: str, params: tuple[Any, ...], seconds: float) -> None:
        self.holder: psycopg.Connection[Any] | None = psycopg.connect(dsn, connect_timeout=5)
        self.holder.execute(statement, params)
        self.pid = self.holder.info.backend_pid
        self.timer = threading.Timer(seconds, self.release)
        self.timer.start()

    def release(self) -> None:
        self.timer.cancel()
        holder, self.holder = self.holder, None
        if holder is not None:
            holder.close()


class RowHeld(Held):
    """Another session holding a batch row (``SELECT ... FOR UPDATE``) until ``release`` or
    ``seconds`` later: an UPDATE of that row waits on it."""

    def __init__(self, dsn: str, batch_id: int, seconds: float) -> None:
        super().__init__(dsn, "SELECT 1 FROM batches WHERE id = %s FOR UPDATE", (batch_id,),
                         seconds)
