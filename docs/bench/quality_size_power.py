"""Size and power of the quality verdicts, by simulation through the product's own functions.

    .venv/bin/python docs/bench/quality_size_power.py --out docs/bench/quality-size-power.json

Prints and writes, for the track verdict (every rule measured, the chosen one marked
``chosen``) and for every monitor warning, how often it fires in worlds without skill or
change (its false-positive rate) and in worlds with them (its power), each with its Monte
Carlo standard error √(p(1 − p)/runs). The worlds are those of app/quality/simulation.py.
``--quick`` runs a tenth of the runs (a smoke check, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from app.config import load_settings
from app.quality.simulation import World, monitor_rates, rebaseline_run, verdict_rates

HORIZONS = [1, 5, 20]
NIGHTS = [20, 60, 120, 250]
# (name, world, runs): the verdict's worlds. 2000 runs give a Monte Carlo error of 0.5 points
# at a 5% rate, 1000 runs 0.7 points.
VERDICT_WORLDS = [
    ("null, scores persist (rho 0.95), 20 tickers", World(20, 250, 0.95), 2000),
    ("null, scores fixed (rho 1), 20 tickers", World(20, 250, 1.0), 2000),
    ("null, fresh scores (rho 0), 20 tickers", World(20, 250, 0.0), 1000),
    ("null, scores persist (rho 0.95), 6 tickers", World(6, 250, 0.95), 1000),
    ("null, scores persist (rho 0.95), 100 tickers", World(100, 250, 0.95), 1000),
    ("skill 0.05, scores persist (rho 0.95), 20 tickers", World(20, 250, 0.95, 0.05), 500),
    ("skill 0.05, scores persist (rho 0.95), 100 tickers", World(100, 250, 0.95, 0.05), 500),
]
# Grade shares, Buy … Sell.
SPREAD = [0.10, 0.20, 0.40, 0.20, 0.10]
HOLD_60 = [0.05, 0.15, 0.60, 0.15, 0.05]
HOLD_70 = [0.025, 0.125, 0.70, 0.125, 0.025]  # at the share test's limit: its worst case
HOLD_80 = [0.025, 0.075, 0.80, 0.075, 0.025]
SHIFTED = [0.35, 0.20, 0.15, 0.20, 0.10]  # a quarter of the grades moved Hold → Buy: TVD 0.25
TICKERS = [6, 10, 20, 30, 40, 100]
MONITOR_RUNS = 2000  # 0.22 points of Monte Carlo error at a 1% rate
POWER_RUNS = 500


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--commit", help="the commit measured, written into the JSON")
    parser.add_argument("--part", choices=["verdict", "monitor", "all"], default="all")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    settings = load_settings()
    started = time.monotonic()
    result: dict[str, object] = {"verdict": [], "monitor": [], "rebaseline": []}
    verdict_worlds = VERDICT_WORLDS if args.part in ("verdict", "all") else []
    for name, world, runs in verdict_worlds:
        rows = verdict_rates(world, HORIZONS, NIGHTS, max(20, runs // scale), seed=len(name))
        for row in rows:
            row["world"] = name
            if row["rule"] == "chosen":
                print(f"{name:52} {row['horizon_days']:>2}d {row['nights']:>3} nights: "
                      f"{row['rate']:6.1%} ± {row['mc_error']:.1%}"
                      f" (withheld {row['withheld']:.0%})", flush=True)
        result["verdict"].extend(rows)  # type: ignore[attr-defined]
    monitor_worlds = () if args.part == "verdict" else (
        ("null, spread mix", SPREAD, None, MONITOR_RUNS),
        ("null, Hold 60%", HOLD_60, None, MONITOR_RUNS),
        ("null, Hold 70% (the share limit)", HOLD_70, None, MONITOR_RUNS),
        ("power, Hold 60% -> 80%", HOLD_60, HOLD_80, POWER_RUNS),
        ("power, TVD 0.25 Hold -> Buy", SPREAD, SHIFTED, POWER_RUNS))
    for name, null, moved, runs in monitor_worlds:
        for tickers in TICKERS:
            count = max(50, runs // scale)
            rates = monitor_rates(tickers, null, moved, count, settings, seed=tickers)
            row = {"world": name, "tickers": tickers, "runs": count, "rates": rates,
                   "mc_error": {k: math.sqrt(v * (1 - v) / count) for k, v in rates.items()}}
            print(f"{name:36} {tickers:>3} tickers: " + ", ".join(
                f"{k} {v:.2%}" for k, v in rates.items()), flush=True)
            result["monitor"].append(row)  # type: ignore[attr-defined]
    runs = max(20, 200 // scale) if args.part != "verdict" else 0
    flagged_after, declared, later = 0, 0, 0
    for seed in range(runs):
        nights = rebaseline_run(40, SPREAD, SHIFTED, 10, 20, settings, seed)
        moved = [any(f.kind in ("distribution_jump", "concentration") for f in n)
                 for n in nights[10:]]
        new = [i for i, n in enumerate(nights[10:]) if any(f.kind == "new_normal" for f in n)]
        flagged_after += sum(moved)
        declared += bool(new)
        later += sum(moved[new[0] + 1:]) if new else 0
    result["rebaseline"] = {} if not runs else {
        "tickers": 40, "nights_before": 10, "nights_after": 20, "runs": runs,
        "new_normal_after": settings.quality.new_normal_after,
        "mean_moved_nights_after_change": flagged_after / runs,
        "runs_declaring_new_normal": declared / runs,
        "mean_moved_nights_after_declaring": later / runs}
    print(json.dumps(result["rebaseline"]), flush=True)
    result["seconds"] = round(time.monotonic() - started, 1)
    result["commit"] = args.commit
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
