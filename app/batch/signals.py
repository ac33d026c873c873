"""Run a batch so that SIGTERM, Ctrl-C or SIGHUP ends it as interrupted (resumable): the
first signal halts it with ``shutdown_grace_s`` of grace, a second cuts the grace, a third
cancels.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

from app.errors import NightdeskError
from app.traffic.halt import Halt, HaltReason

T = TypeVar("T")

# SIGHUP too: the terminal a night was started from closing (an ssh session dropped) would
# otherwise kill it outright, losing the rows of calls answered but not yet written.
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# What a stop by signal keeps; the engine's ``_with_resume`` says NONE_KEPT where none finished.
KEPT, NONE_KEPT = ": finished tickers are kept", " before any ticker finished"


class BatchInterrupted(NightdeskError):
    """The batch was stopped by a signal; its rows say how far it got."""

    exit_code = 130


async def _stop_on_signals(work: Coroutine[Any, Any, T], halt: Halt | None,
                           grace_s: float) -> T:
    # In this task, not one of its own: nothing is left running when this returns.
    main = asyncio.current_task()
    assert main is not None
    loop = asyncio.get_running_loop()

    def on_signal(name: str) -> None:
        if halt is None or halt.hurried.is_set():
            main.cancel()
            return
        # Without this, SIGTERM kills the process outright and the batch stays "running".
        halt.request(HaltReason("interrupted", f"stopped by {name}{KEPT}",
                                BatchInterrupted.exit_code, 0.0 if halt.reason else grace_s))

    for sig in SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig.name)
    try:
        return await work
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)


def run_batch(work: Coroutine[Any, Any, T], halt: Halt | None = None,
              grace_s: float = 0.0) -> T:
    """Run ``work`` to the end; SIGTERM/SIGINT stop it through ``halt``, or without one
    cancel it at once and raise BatchInterrupted."""
    try:
        return asyncio.run(_stop_on_signals(work, halt, grace_s))
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise BatchInterrupted("interrupted: the batch is recorded as interrupted") from None
