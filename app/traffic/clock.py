"""The clock server health is judged by: the event loop's, unless a test gives its own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

Clock = Callable[[], float]
"""Seconds on a monotonic scale; only differences between two readings mean anything."""


def loop_clock() -> float:
    """Return the running event loop's time (what its timers and sleeps count in)."""
    return asyncio.get_running_loop().time()
