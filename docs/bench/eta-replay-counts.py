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

from sqlalchemy import select

from app.db.engine import get_engine
from app.db.models import Base, Batch
from app.morning import eta
from tests.unit.morning.test_eta_replay import FROM, NIGHTS, WITHIN
from tests.unit.support.eta_fixture import fixture, load


def main(names: list[str], before: bool = True) -> None:
    total = counted = 0
    for name in names or NIGHTS:
        with tempfile.TemporaryDirectory() as scratch:
            engine = get_engine(f"sqlite:///{scratch}/replay.db")
            Base.metadata.create_all(engine)
            batch_id, _, readings = load(engine, fixture(name), before)
            with engine.connect() as conn:
                start, end = conn.execute(select(Batch.started_at, Batch.finished_at)
                                          .where(Batch.id == batch_id)).one()
            night_s = (end - start).total_seconds()
            rows = []
            for r in readings:
                left = (end - r["taken_at"]).total_seconds()
                if left <= 0 or (r["taken_at"] - start).total_seconds() < FROM * night_s:
                    continue
                rows.append((1 - left / night_s, left, eta.reading(engine, batch_id,
                                                                   r["taken_at"]).eta_s))
            engine.dispose()
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
