"""Run a batch so that SIGTERM (a systemd stop) ends it like Ctrl-C: recorded as interrupted."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

from app.errors import NightdeskError

T = TypeVar("T")


class BatchInterrupted(NightdeskError):
    """The batch was stopped by a signal; its rows say how far it got."""

    exit_code = 130


async def _cancel_on_sigterm(work: Coroutine[Any, Any, T]) -> T:
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    # Without this, SIGTERM kills the process outright and the batch stays "running".
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def run_batch(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` to the end; SIGTERM or Ctrl-C cancel it cleanly and raise BatchInterrupted."""
    try:
        return asyncio.run(_cancel_on_sigterm(work))
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise BatchInterrupted("interrupted: the batch is recorded as interrupted; "
                               "finished tickers are kept") from None
