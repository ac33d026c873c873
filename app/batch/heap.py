"""The cyclic garbage collector's settings while a batch runs: fewer, shorter passes."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

# Net container allocations between young collections (CPython's default: 700). A call's
# objects live for seconds; at 700 they reach the oldest generation first and only full
# collections free them.
YOUNG_THRESHOLD = 50_000

_held = 0  # batches inside (several may overlap in one process: tests, a bench)
_saved = gc.get_threshold()


@contextlib.contextmanager
def batch_collector() -> Iterator[None]:
    """Freeze every object alive on entry and collect the young generation less often.

    A batch starts with ~0.4M tracked objects (imported modules, settings, the work); each
    full collection walked them all with the event loop held (docs/lab/2026-12-03-fleet-
    loop-lag.md). Frozen objects are still freed by reference counting; cycles among them
    wait for the exit, where they rejoin the oldest generation. The last batch out restores
    the thresholds.
    """
    global _held, _saved
    if _held == 0:
        _saved = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(YOUNG_THRESHOLD, *_saved[1:])
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if _held == 0:
            gc.set_threshold(*_saved)
            gc.unfreeze()
