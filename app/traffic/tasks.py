"""What a task group leaves to its caller: the first error it met, and tasks ended for sure."""

from __future__ import annotations

import asyncio
from typing import Any


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
    while pending := [task for task in tasks if not task.done()]:
        try:
            await asyncio.wait(pending)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
