"""Carry the one request to stop a batch: from a signal, a server outage or a fatal error.

Whatever asks first names how the batch ends (its status, its one-line reason, the exit code)
and how long calls already at the server may take to finish (``grace_s``). A second, more
urgent request (a second Ctrl-C, an outage while draining) can only shorten that grace.
The engine waits on ``requested`` beside the scheduler and does the stopping itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from app.errors import BatchStopped
from app.traffic.tasks import cancel_and_wait, wait_first

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class HaltReason:
    """Why a batch stopped early and how it is recorded."""

    status: str  # the batch's final status: interrupted | failed
    message: str  # the one line the operator reads
    exit_code: int
    grace_s: float = 0.0  # how long calls in flight may still finish

    def error(self, batch_id: int) -> BatchStopped:
        """Return the one-line error the command that ran the batch ends with."""
        stopped = BatchStopped(f"batch {batch_id} {self.status}: {self.message}")
        # The reason's own code: 130 for a signal, 5 for an outage, 2 for a refused key.
        stopped.exit_code = self.exit_code
        return stopped


class Halt:
    """Let any part of a running batch ask for it to stop; the first reason wins."""

    def __init__(self) -> None:
        self.reason: HaltReason | None = None
        self.requested = asyncio.Event()
        self.hurried = asyncio.Event()  # set when the grace was cut to zero

    def request(self, reason: HaltReason) -> None:
        """Ask the batch to stop; a later request can only cut the grace, not change why."""
        if self.reason is None:
            self.reason = reason
            log.warning("batch stopping", why=reason.message, grace_s=reason.grace_s)
            self.requested.set()
            if reason.grace_s <= 0:
                self.hurried.set()
        elif reason.grace_s < self.reason.grace_s:
            log.warning("batch stopping now", why=reason.message)
            self.reason = HaltReason(self.reason.status, self.reason.message,
                                     self.reason.exit_code, 0.0)
            self.hurried.set()

    @property
    def stopping(self) -> bool:
        return self.reason is not None


class Stoppable(Protocol):
    """What ``drive`` needs of the scheduler (app.traffic.scheduler.Scheduler)."""

    def stop(self) -> None: ...

    async def drained(self) -> None: ...

    def close(self, error: BaseException) -> None: ...


async def drive(scheduler: Stoppable, work: Coroutine[Any, Any, None], halt: Halt) -> None:
    """Await the scheduler's ``work``; when a halt is asked for, stop the batch its way.

    Stopping: no ticker starts and no request is let through; requests at the server may
    finish for the reason's grace, each finished node is checkpointed as usual (its next
    request is what waits at the gate); then the waiting requests are refused with
    BatchStopped, which ends their tickers unfinished. Past the grace, or when the halt is
    hurried, whatever is still running is cancelled.
    """
    running = asyncio.create_task(work)
    try:
        await wait_first(running, halt.requested.wait())
        if running.done() or halt.reason is None:
            await running
            return
        reason = halt.reason
        scheduler.stop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + reason.grace_s
        await wait_first(scheduler.drained(), halt.hurried.wait(), running,
                         timeout=reason.grace_s)
        if not halt.hurried.is_set():
            scheduler.close(BatchStopped(reason.message))
            await wait_first(running, halt.hurried.wait(),
                             timeout=max(0.0, deadline - loop.time()))
        if not running.done():
            log.warning("cancelling what is still running", why=reason.message)
        await cancel_and_wait(running)
        if not running.cancelled():
            running.result()  # its own error, if it ended with one
    finally:
        await cancel_and_wait(running)
