"""End an ``async with`` body the three ways a batch's can end: it returns, it raises, or it is
cancelled while it waits; and say which tasks were left running."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

ENDINGS = ["returns", "raises", "is-cancelled"]
End = Callable[[], Awaitable[None]]


class BodyError(Exception):
    """The body's own error: what a context must let through as it is."""


async def run_to_its_end(ending: str, body: Callable[[End], Awaitable[None]]
                         ) -> set[asyncio.Task[Any]]:
    """Run ``body(end)`` in a task, where awaiting ``end()`` ends the body as ``ending`` says
    (returns; raises BodyError; waits until this cancels it); return the tasks still running
    once it has ended, and check it raised what its ending says."""
    waiting = asyncio.Event()

    async def end() -> None:
        if ending == "raises":
            raise BodyError("the body's own")
        if ending == "is-cancelled":
            waiting.set()
            await asyncio.Event().wait()

    before = asyncio.all_tasks()
    runner = asyncio.create_task(body(end))
    if ending == "is-cancelled":
        # A body that fails before it reaches end() fails the test here, not hangs it.
        waiter = asyncio.create_task(waiting.wait())
        await asyncio.wait({runner, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        if runner.done():
            await runner
        runner.cancel()
    expected = {"raises": pytest.raises(BodyError),
                "is-cancelled": pytest.raises(asyncio.CancelledError)}
    with expected.get(ending, contextlib.nullcontext()):
        await runner
    return {t for t in asyncio.all_tasks() - before if not t.done()}
