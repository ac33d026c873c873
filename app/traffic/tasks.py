"""Wait on several things at once without leaving a task behind.

The project's rule: when a function returns, nothing it started is still running. Where a
TaskGroup does not fit (the first of a few events), these helpers wait for the tasks they
cancel to end before returning, however the wait ends: normally, on its timeout, or
because the waiting task is itself cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

Waitable = Coroutine[Any, Any, Any] | asyncio.Future[Any]


def first_error(group: BaseExceptionGroup[Any]) -> BaseException:
    """Return the error that ended a task group: the first one raised, not the group."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel the tasks and return once every one has ended.

    A cancellation of the caller meanwhile does not cut the wait short: it is raised once
    the tasks have ended. The tasks' own outcomes are left on them for the caller to read.
    """
    for task in tasks:
        task.cancel()
    cancelled = False
    pending = [task for task in tasks if not task.done()]
    while pending:
        try:
            await asyncio.wait(pending)
        except asyncio.CancelledError:
            cancelled = True
        pending = [task for task in pending if not task.done()]
    if cancelled:
        raise asyncio.CancelledError


async def wait_first(*waitables: Waitable, timeout: float | None = None) -> None:
    """Return once the first of ``waitables`` is done, or ``timeout`` seconds have passed.

    A coroutine is run in a task of its own, and that task is cancelled and awaited before
    this returns; an error it raised (not its cancellation) is raised here. A task or
    future passed in is the caller's: it is left as it is, running or done.
    """
    futures: list[asyncio.Future[Any]] = []
    owned: list[asyncio.Task[Any]] = []
    try:
        for waitable in waitables:
            if isinstance(waitable, asyncio.Future):
                futures.append(waitable)
            else:
                task = asyncio.create_task(waitable)
                owned.append(task)
                futures.append(task)
        await asyncio.wait(futures, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # The coroutines not yet made tasks (an error above) are closed unstarted.
        for waitable in waitables[len(futures):]:
            if asyncio.iscoroutine(waitable):
                waitable.close()
        await cancel_and_wait(*owned)
    for task in owned:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error
