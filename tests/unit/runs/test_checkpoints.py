"""The checkpointer outlives every write it was handed: closing it never cuts one."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest

from app.runs.checkpoints import checkpoint_path, open_checkpointer

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
