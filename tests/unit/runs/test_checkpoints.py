"""The checkpointer outlives every write it was handed: closing it never cuts one."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from app.errors import StorageOutage
from app.runs.checkpoints import check_checkpoints, checkpoint_path, open_checkpointer
from tests.unit.support.endings import ENDINGS, End, run_to_its_end

CONFIG = {"configurable": {"thread_id": "b1:AAA:0", "checkpoint_ns": "", "checkpoint_id": "c1"}}


class HeldInsert:
    """An SQLite authorizer that holds the connection's worker as it prepares a write's INSERT
    (the machine's load, made certain), until ``release`` is set."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, action: int, table: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_INSERT and table == "writes":
            self.entered.set()
            self.release.wait()
        return sqlite3.SQLITE_OK


async def test_closing_waits_for_a_write_still_running_and_leaves_the_file_unlocked(
        sqlite_url: str) -> None:
    # LangGraph starts the write recording a node it cancelled from a done-callback, once its
    # executor has taken the list of tasks it waits for: when a halt cancels a batch's
    # tickers, such writes are still running as the batch leaves the checkpointer. On a busy
    # machine the connection's worker thread is behind, and a write's INSERT and the close
    # meet in its queue. Here the worker is held as it prepares the INSERT (the machine's
    # load, made certain) while the checkpointer closes.
    held = HeldInsert()
    async with open_checkpointer(sqlite_url) as saver:
        await saver.conn.set_authorizer(held)  # type: ignore[attr-defined]
        # Nobody awaits this write, as nobody awaits LangGraph's; the test keeps it, as
        # LangGraph's executor keeps its failed tasks (that reference kept the lock).
        write = asyncio.create_task(saver.aput_writes(CONFIG, [("value", 1)], "task-1"))
        assert await asyncio.to_thread(held.entered.wait, 60)  # the INSERT is being prepared
        # The worker goes on once the checkpointer has begun to close.
        asyncio.get_running_loop().call_soon(held.release.set)
    await asyncio.wait({write})

    # Closing left no transaction open: another connection can write at once. (Before,
    # SQLite closed the connection with the write's statement alive, and kept its write lock
    # until the garbage collector freed that statement: a batch resumed in the same process
    # met "database is locked" on every checkpoint.)
    fresh = sqlite3.connect(checkpoint_path(sqlite_url), timeout=0, isolation_level=None)
    try:
        fresh.execute("BEGIN IMMEDIATE")
        fresh.execute("ROLLBACK")
        # And the write was not cut: what it stored is there for a resume.
        stored = fresh.execute("SELECT task_id, channel FROM writes WHERE thread_id = ?",
                               ("b1:AAA:0",)).fetchall()
    finally:
        fresh.close()
    assert stored == [("task-1", "value")]
    assert write.exception() is None


async def test_a_close_cancelled_outright_still_ends_its_writes_before_the_connection(
        sqlite_url: str) -> None:
    # A third Ctrl-C cancels the batch while it waits for such a write: the write is
    # cancelled too, and the connection closes only after it ended (never under it).
    held = HeldInsert()
    writes: list[asyncio.Task[None]] = []
    closing_now = asyncio.Event()

    async def batch() -> None:
        async with open_checkpointer(sqlite_url) as saver:
            await saver.conn.set_authorizer(held)  # type: ignore[attr-defined]
            writes.append(asyncio.create_task(
                saver.aput_writes(CONFIG, [("value", 1)], "task-1")))
            assert await asyncio.to_thread(held.entered.wait, 60)
            closing_now.set()  # the body ends here: the checkpointer closes

    closing = asyncio.create_task(batch())
    await closing_now.wait()
    closing.cancel()
    asyncio.get_running_loop().call_soon(held.release.set)
    with pytest.raises(asyncio.CancelledError):
        await closing
    await asyncio.wait(writes)
    # Cancelled, not cut by a closed connection ("Cannot operate on a closed database").
    assert writes[0].cancelled()
    fresh = sqlite3.connect(checkpoint_path(sqlite_url), timeout=0, isolation_level=None)
    try:
        fresh.execute("BEGIN IMMEDIATE")
        fresh.execute("ROLLBACK")
        # Its INSERT was rolled back with the rest of the unfinished transaction.
        assert fresh.execute("SELECT COUNT(*) FROM writes").fetchone() == (0,)
    finally:
        fresh.close()


def stored_writes(sqlite_url: str) -> list[tuple[str, str]]:
    """Return the writes stored, read by another connection that takes the write lock first
    (the file is left unlocked)."""
    fresh = sqlite3.connect(checkpoint_path(sqlite_url), timeout=0, isolation_level=None)
    try:
        fresh.execute("BEGIN IMMEDIATE")
        fresh.execute("ROLLBACK")
        return fresh.execute("SELECT task_id, channel FROM writes ORDER BY task_id").fetchall()
    finally:
        fresh.close()


@pytest.mark.parametrize("ending", ENDINGS)
async def test_the_saver_waits_for_its_writes_however_the_batch_ends(
        sqlite_url: str, ending: str) -> None:
    # The saver's group outlives the batch's body, its error and its cancellation alike: a
    # write still running is awaited to its end, never cut, before the connection closes.
    held = HeldInsert()
    writes: list[asyncio.Task[None]] = []

    async def batch(end: End) -> None:
        async with open_checkpointer(sqlite_url) as saver:
            await saver.conn.set_authorizer(held)  # type: ignore[attr-defined]
            writes.append(asyncio.create_task(
                saver.aput_writes(CONFIG, [("value", 1)], "task-1")))
            assert await asyncio.to_thread(held.entered.wait, 60)
            # Still held when the body has ended (at once, or once cancelled as it waits).
            asyncio.get_running_loop().call_later(0.1, held.release.set)
            await end()

    assert not await run_to_its_end(ending, batch) - set(writes)  # the saver's own: none
    await asyncio.wait(writes)
    assert writes[0].exception() is None
    assert stored_writes(sqlite_url) == [("task-1", "value")]


async def test_a_write_that_fails_fails_its_caller_and_no_other_write(sqlite_url: str) -> None:
    # A call's error is its caller's: were it raised in the saver's group, the group would
    # cancel every other write (and the batch's body).
    flushes = 0

    async def flush_usage() -> None:  # the usage rows' flush before each write
        nonlocal flushes
        flushes += 1
        if flushes == 1:
            raise StorageOutage("usage rows not stored within the write budget")
        await asyncio.sleep(0.05)  # the other write is still going when the first fails

    async with open_checkpointer(sqlite_url, before_write=flush_usage) as saver:
        first = asyncio.create_task(saver.aput_writes(CONFIG, [("value", 1)], "task-1"))
        second = asyncio.create_task(saver.aput_writes(CONFIG, [("value", 2)], "task-2"))
        with pytest.raises(StorageOutage, match="usage rows not stored"):
            await first
        await second
    assert stored_writes(sqlite_url) == [("task-2", "value")]


def test_the_checkpoints_of_a_uri_url_sit_beside_its_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `sqlite:///file:/x/y.db?uri=true` (docs/reliability.md's read-only form, without its
    # mode): the checkpoint file was made under a folder named "file:" in the working folder.
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "home"
    url = f"sqlite:///file:{folder / 'y.db'}?uri=true"
    check_checkpoints(url)
    assert checkpoint_path(url) == str(folder / "y.checkpoints.db")
    assert (folder / "y.checkpoints.db").is_file() and not (tmp_path / "file:").exists()
