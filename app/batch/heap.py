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
    """Freeze every object alive on entry and collect the young generation less often; the
    last batch out unfreezes them (cycles among them wait until then), thresholds restored."""
    # A full collection walks every tracked object with the loop held, and a batch starts
    # with several hundred thousand; frozen, they leave the walk.
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
