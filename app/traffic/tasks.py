"""Wait on several things at once without leaving a task behind, where a TaskGroup does
not fit: whatever these helpers start has ended when they return."""

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
    """Cancel the tasks and return once every one has ended (their outcomes left on them).

    A cancellation of the caller meanwhile is raised once the tasks have ended.
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

    Coroutines run in tasks that are cancelled and awaited before this returns, their error
    raised here; a future passed in is the caller's and left as it is.
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
