"""Tasks in a group: the first error a task group met, and loops that run beside a body."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any


def first_error(group: BaseExceptionGroup[Any]) -> BaseException:
    """Return the error that ended a task group: the first one raised, not the group."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


@asynccontextmanager
async def beside(*stops: Callable[[], object]) -> AsyncIterator[asyncio.TaskGroup]:
    """Yield a TaskGroup for tasks that run beside the body; none runs once this exits.

    On exit, the body's error or not, each of ``stops`` is called and the tasks are awaited
    to their end, never cut half-way; a cancellation meanwhile cancels them and is raised once
    they have ended. A task's first error is raised (not a group), else the body's own.
    """
    held: BaseException | None = None
    try:
        async with asyncio.TaskGroup() as group:
            try:
                yield group
            except BaseException as error:  # raised below: a group would cut the tasks
                held = error
            for stop in stops:
                stop()
    except BaseExceptionGroup as errors:
        raise first_error(errors) from None
    if held is not None:
        raise held
