"""Carry the one request to stop a batch: from a signal, a server outage or a fatal error.

The first request names how the batch ends and the grace for calls at the server; a later
one can only cut that grace. The batch's TaskGroup does the stopping (app.batch.engine).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

import structlog

from app.errors import BatchStopped

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
        self.cut: asyncio.Timeout | None = None  # what cancels the batch's work at the grace's end

    def request(self, reason: HaltReason) -> None:
        """Ask the batch to stop; a later request can only cut the grace, not change why."""
        if self.reason is None:
            self.reason = reason
            log.warning("batch stopping", why=reason.message, grace_s=reason.grace_s)
            self.requested.set()
        elif reason.grace_s < self.reason.grace_s:
            log.warning("batch stopping now", why=reason.message)
            self.reason = replace(self.reason, grace_s=0.0)
        else:
            return
        if self.reason.grace_s <= 0:
            self.hurried.set()
        self.arm(self.cut)

    def arm(self, cut: asyncio.Timeout | None) -> None:
        """Let ``cut`` cancel the batch's work at the grace's end, once a stop is asked."""
        self.cut = cut
        if cut is not None and self.reason is not None:
            cut.reschedule(asyncio.get_running_loop().time() + self.reason.grace_s)
