"""Each recorded night's readings within 25% of the time left from a tenth of the night on.

For docs/lab/2026-12-06-eta-late-low.md; a diagnostic, not part of the package. It replays
``app.morning.eta.reading`` at every stored reading of the fixtures that
tests/unit/morning/test_eta_replay.py replays (its ``NIGHTS``) and prints, night by night,
how many readings from 10% on are within 25% of the true time left, and each one's error
(the test's own count: a reading that is None or 0 is a miss). Usage, from a checkout:
``PYTHONPATH=$PWD .venv/bin/python docs/bench/eta-replay-counts.py [--no-prior] [NAME ...]``;
``--no-prior`` replays each night without the night before (its database's first night:
docs/lab/2026-12-06-eta-first-night.md).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests.unit.morning.test_eta_replay import NIGHTS, WITHIN, from_tenth


def main(names: list[str], before: bool = True) -> None:
    total = counted = 0
    for name in names or NIGHTS:
        with tempfile.TemporaryDirectory() as scratch:
            night_s, found = from_tenth(Path(scratch), name, before)
        rows = [(1 - left / night_s, left, r.eta_s) for left, r in found]
        good = sum(1 for _, left, said in rows
                   if said and said > 0 and abs(said - left) <= WITHIN * left)
        total, counted = total + good, counted + len(rows)
        errors = " ".join(f"{into:.0%}:{(said - left) / left:+.0%}" if said else f"{into:.0%}:—"
                          for into, left, said in rows)
        print(f"{name:20s} {good:2d} of {len(rows):2d}  {errors}", flush=True)
    print(f"all {total} of {counted}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main([a for a in args if a != "--no-prior"], "--no-prior" not in args)
