"""A blocking call for the thread tests: it holds its worker thread until released, and says
when it has started and when it has ended."""

from __future__ import annotations

import asyncio
import threading

HELD_S = 10.0  # longer than any test waits: a call never released fails, it does not hang


class Blocking:
    """Call it (in a thread) to block on ``release``; ``ended`` is set once it has returned."""

    def __init__(self) -> None:
        self.started, self.release, self.ended = (threading.Event(), threading.Event(),
                                                  threading.Event())

    def __call__(self, *_: object) -> str:
        self.started.set()
        try:
            assert self.release.wait(HELD_S), "the blocking call was never released"
            return "done"
        finally:
            self.ended.set()

    async def entered(self) -> None:
        """Return once the call is blocking in its thread."""
        while not self.started.is_set():
            await asyncio.sleep(0.001)

    def release_in(self, delay_s: float) -> None:
        """Release the call ``delay_s`` from now, from the event loop."""
        asyncio.get_running_loop().call_later(delay_s, self.release.set)
