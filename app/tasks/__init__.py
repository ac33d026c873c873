"""Structured concurrency's helpers: the first error a task group met, loops that run beside
a body, and a blocking call in a thread that has ended once its caller has."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


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



async def in_thread(call: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Return ``call(*args, **kwargs)`` run in a worker thread, in the caller's context.

    Unlike ``asyncio.to_thread``, the thread has ended when this returns or raises: a thread
    cannot be cancelled, so a cancellation meanwhile waits for the call to end and is raised
    then (the call's result or error dropped), and no group exits while it still runs.
    """
    bound = functools.partial(contextvars.copy_context().run, call, *args, **kwargs)
    done = asyncio.get_running_loop().run_in_executor(None, bound)
    cancelled: asyncio.CancelledError | None = None
    while not done.done():
        try:
            await asyncio.wait([done])  # cancelled, it leaves ``done`` to run on
        except asyncio.CancelledError as error:
            cancelled = error
    if cancelled is not None:
        if not done.cancelled():
            done.exception()  # retrieved: the cancellation is what the caller meets
        raise cancelled
    return done.result()
