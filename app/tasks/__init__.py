"""Structured concurrency's helpers: the first error a task group met, loops that run beside
a body, and a blocking call in a thread that has ended once its caller has (or, cancelled,
has been waited for its ``patience``)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

import structlog

P = ParamSpec("P")
T = TypeVar("T")
log = structlog.get_logger(__name__)


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


# How long a cancelled caller waits for its thread before leaving it running: a database
# call hung for good (a server gone without a word) must not hold a halt for ever.
PATIENCE_S = 30.0
_patience: ContextVar[float] = ContextVar("thread_patience_s", default=PATIENCE_S)


@contextmanager
def patience(seconds: float) -> Iterator[None]:
    """Let ``in_thread``'s cancelled callers here wait ``seconds`` for their thread."""
    token = _patience.set(seconds)
    try:
        yield
    finally:
        _patience.reset(token)


def patience_s() -> float:
    """Return how long a cancelled ``in_thread`` caller here waits for its thread."""
    return _patience.get()


class _Workers:
    """Daemon threads that run ``in_thread``'s calls, kept for the next as an executor keeps
    its own, as many at most as asyncio's default executor. Unlike an executor's, a thread
    left running never holds the loop's or the process's end (an executor's are joined then),
    and it gives its place to a new one."""

    def __init__(self, size: int) -> None:
        self.reset(size)

    def reset(self, size: int) -> None:
        """Start with no thread: at first, and in a forked child (it has none of them)."""
        self.size, self.started = size, 0
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.idle = threading.Semaphore(0)
        self.lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        self.jobs.put(job)
        if self.idle.acquire(blocking=False):
            return  # a waiting thread takes it
        with self.lock:
            if self.started < self.size:
                self.started += 1
                threading.Thread(target=self._work, name=f"in_thread_{self.started}",
                                 daemon=True).start()

    def left_running(self) -> None:
        with self.lock:
            self.size += 1

    def _work(self) -> None:
        while True:
            self.jobs.get()()
            self.idle.release()


_WORKERS = min(32, (os.cpu_count() or 1) + 4)
_workers = _Workers(_WORKERS)
os.register_at_fork(after_in_child=lambda: _workers.reset(_WORKERS))


def _started(call: Callable[[], T]) -> asyncio.Future[T]:
    """Return the future of ``call()`` run by one of the ``_workers``."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            outcome: tuple[T | None, BaseException | None] = (call(), None)
        except BaseException as error:  # handed to the caller, as an executor does
            outcome = (None, error)
        with suppress(RuntimeError):  # the loop closed meanwhile: no one waits any more
            loop.call_soon_threadsafe(settle, *outcome)

    _workers.submit(run)
    return done


def _name(call: Callable[..., Any]) -> str:
    return str(getattr(call, "__qualname__", None) or type(call).__name__)


async def in_thread(call: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Return ``call(*args, **kwargs)`` run in a worker thread, in the caller's context.

    Unlike ``asyncio.to_thread``, no group exits while the call runs: a thread cannot be
    cancelled, so a cancellation meanwhile waits for the call to end and is raised then (the
    call's result or error dropped). That wait is bounded (``patience``, 30 s): past it the
    call is left running in its daemon thread, a warning says so, and the cancellation is
    raised; what the call writes later is idempotent or taken up by a resume.
    """
    bound = functools.partial(contextvars.copy_context().run, call, *args, **kwargs)
    done = _started(bound)
    loop = asyncio.get_running_loop()
    cancelled: asyncio.CancelledError | None = None
    until: float | None = None  # once cancelled: when the wait ends
    while not done.done():
        left = None if until is None else until - loop.time()
        if left is not None and left <= 0:
            log.warning("a blocking call outlived its caller's cancellation: left running",
                        call=_name(call), waited_s=round(patience_s(), 3))
            done.add_done_callback(_retrieved)
            _workers.left_running()
            break
        try:
            await asyncio.wait([done], timeout=left)  # cancelled, it leaves ``done`` to run on
        except asyncio.CancelledError as error:
            cancelled = error
            if until is None:
                until = loop.time() + patience_s()
    if cancelled is not None:
        if done.done():
            _retrieved(done)  # the cancellation is what the caller meets
        raise cancelled
    return done.result()


def _retrieved(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()
