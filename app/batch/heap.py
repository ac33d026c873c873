"""Keep the cyclic garbage collector's full passes off what was alive before the batch."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Move every object alive on entry out of the cyclic collector's reach until exit.

    A batch starts with ~0.4M tracked objects (imported modules, settings, the work); each
    full collection would walk them all with the event loop held (0.3-0.8 s on a 2-core
    host: docs/lab/2026-12-03-fleet-loop-lag.md). Frozen objects are still freed by
    reference counting; cycles among them wait for the exit, where they rejoin the oldest
    generation.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
