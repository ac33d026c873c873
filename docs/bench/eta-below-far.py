"""The ETA on the recorded nights and on synthetic nights whose night before ran 1.5-3x apart.

For docs/lab/2026-12-07-eta-below-far.md; a diagnostic, not part of the package. ``replays``
replays ``app.morning.eta.reading`` at every stored reading of the fixtures that
tests/unit/morning/test_eta_replay.py replays (with the night before: its ``NIGHTS``; without:
those and ``FIRST_ONLY``) and prints, night by night, from a tenth of the night on: the
readings, those within 25% of the true time left, within 25% or 20 s, and those whose
interval held the time left; ``--json OUT`` also writes every reading. ``synthetic`` prints
the error at each moment of tests/unit/morning/test_eta_server_changed.py's nights whose
night before ran k times quicker (k < 1: slower), every node, the chain's or the analysts'
(``*`` a reading whose interval misses the time left, ``u`` a range called uncalibrated).
Usage, from a checkout: ``PYTHONPATH=$PWD .venv/bin/python docs/bench/eta-below-far.py
replays|synthetic [--json OUT]``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

from agents.nodes import ANALYSTS
from app.db.engine import get_engine
from app.db.models import Base
from app.morning import eta
from tests.unit.morning.test_eta_replay import FIRST_ONLY, NIGHTS, WITHIN, from_tenth
from tests.unit.support.eta_rows import CHAIN, LATENCY_S, T0, night

PACES = [1.5, 2, 3, 1 / 1.5, 1 / 2, 1 / 3]
SHAPES = ["uniform", "chain", "analysts"]
MOMENTS = [0.05, 0.1, 0.12, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.7, 0.9]


def replays(out: str | None) -> None:
    rows: list[dict[str, object]] = []
    for before, names in ((True, NIGHTS), (False, NIGHTS + FIRST_ONLY)):
        sums = [0, 0, 0, 0]
        for name in names:
            with tempfile.TemporaryDirectory() as scratch:
                night_s, found = from_tenth(Path(scratch), name, before)
            got = [0, 0, 0, 0]
            for left, r in found:
                said = r.eta_s
                near = bool(said and said > 0 and abs(said - left) <= WITHIN * left)
                near20 = bool(said and said > 0 and (near or abs(said - left) <= 20))
                held = bool(said and r.eta_low_s <= left <= r.eta_high_s)  # type: ignore[operator]
                got = [got[0] + 1, got[1] + near, got[2] + near20, got[3] + held]
                rows.append({"night": name, "prior": before, "into": 1 - left / night_s,
                             "left": left, "eta": said, "low": r.eta_low_s,
                             "high": r.eta_high_s, "level": r.level})
            sums = [a + b for a, b in zip(sums, got, strict=True)]
            print(f"{'prior' if before else 'first'} {name:24s} {got[0]:3d} {got[1]:3d} "
                  f"{got[2]:3d} {got[3]:3d}", flush=True)
        print(f"{'prior' if before else 'first'} {'all':24s} {sums[0]:3d} {sums[1]:3d} "
              f"{sums[2]:3d} {sums[3]:3d}", flush=True)
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=0)


def synthetic() -> None:
    tonight = {**dict.fromkeys(ANALYSTS, 2 * LATENCY_S), **dict.fromkeys(CHAIN, LATENCY_S)}
    night_s = 2 * LATENCY_S + len(CHAIN) * LATENCY_S
    print("| night before | " + " | ".join(f"{m:.0%}" for m in MOMENTS) + " |")
    for shape in SHAPES:
        for k in PACES:
            with tempfile.TemporaryDirectory() as scratch:
                engine = get_engine(f"sqlite:///{scratch}/s.db")
                Base.metadata.create_all(engine)
                before = {n: v / k if shape == "uniform" or (n in CHAIN) == (shape == "chain")
                          else v for n, v in tonight.items()}
                night(engine, 4, before, T0 - timedelta(days=1))
                batch_id, end = night(engine, 4, tonight, T0, status="running")
                cells = []
                for m in MOMENTS:
                    at = T0 + timedelta(seconds=m * night_s)
                    left = (end - at).total_seconds()
                    found = eta.reading(engine, batch_id, at)
                    if found.eta_s is None:
                        cells.append("est.")
                        continue
                    held = found.eta_low_s <= left <= found.eta_high_s  # type: ignore[operator]
                    cells.append(f"{(found.eta_s - left) / left:+.0%}"
                                 + ("" if held else "*") + ("u" if found.level is None else ""))
                engine.dispose()
            print(f"| {shape} {k:.3g}x | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[0] == "replays":
        replays(args[args.index("--json") + 1] if "--json" in args else None)
    else:
        synthetic()
