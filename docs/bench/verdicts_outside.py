"""Outside check of issue 43's verdicts: cases the project's own bench and tests do not use.

    flock /work/notes/bench.lock .venv/bin/python docs/bench/verdicts_outside.py \
        --out docs/bench/verdicts-outside.json [--part verdict|forward|monitor|all] [--quick]

Every rate is measured through the product's functions, seeded, and printed with its Wilson
95% interval. The verdict cases build each night's grades (``BatchGrades``) and read its
closes through ``PriceCache`` from an in-memory provider over a Monday–Friday calendar, then
judge with ``track._night_returns``, ``track.one_per_session`` and ``track.horizon_record``
(what ``quality track`` runs after its database read); the per-night p-value is
``forward``'s ``ic_test``; the monitor's nights are judged by ``monitor.findings`` (seed 0, as
``check_batch`` calls it) against references chosen by ``monitor.reference_window``.
No world has skill or change unless its name says so: every figure is a false-positive rate.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import time
from collections.abc import Callable, Sequence
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from agents.data.base import Closes
from agents.decision import RATINGS
from app.config import Settings, load_settings
from app.errors import DataError
from app.quality import track
from app.quality.forward import PriceCache
from app.quality.grades import BatchGrades, Grade
from app.quality.monitor import NightRecord, findings, reference_window
from app.quality.simulation import monitor_rates
from app.quality.statistics import ic_test
from app.quality.track import NightReturns, _night_returns, horizon_record, ic_verdict

DAILY_SD = 0.02
MONDAY = date(2025, 1, 6)


def wilson(hits: int, runs: int, z: float = 1.96) -> tuple[float, float]:
    """Return the Wilson score interval of a binomial proportion."""
    p = hits / runs
    centre = (p + z * z / (2 * runs)) / (1 + z * z / runs)
    half = z * math.sqrt(p * (1 - p) / runs + z * z / (4 * runs * runs)) / (1 + z * z / runs)
    return max(0.0, centre - half), min(1.0, centre + half)


class MemoryProvider:
    """Closes of a simulated market: sessions Monday to Friday, one price path per ticker."""

    name = "memory"

    def __init__(self, sessions: list[date], prices: np.ndarray, tickers: list[str]) -> None:
        self.sessions, self.prices = sessions, prices
        self.column = {t: i for i, t in enumerate(tickers)}

    def closes(self, ticker: str, as_of: date, days: int) -> Closes:
        i = bisect.bisect_right(self.sessions, as_of) - 1
        if i < 0:
            raise DataError(f"{ticker}: no prices up to {as_of}")
        col = self.column[ticker]
        ahead = [(self.sessions[j], float(self.prices[j, col]))
                 for j in range(i + 1, min(i + 1 + days, len(self.sessions)))]
        return Closes(self.sessions[i], float(self.prices[i, col]), ahead)


def weekdays(start: date, count: int) -> list[date]:
    out, day = [], start
    while len(out) < count:
        if day.weekday() < 5:
            out.append(day)
        day += timedelta(days=1)
    return out


def verdict_run(rng: np.random.Generator, *, tickers: int, nights: int, horizons: Sequence[int],
                persistence: float = 0.95, score_sd: float = 0.45, step: float = 0.0,
                calendar: str = "weekdays", drop_night: float = 0.0,
                drop_ticker: float = 0.0, regime_at: int | None = None,
                ) -> tuple[dict[int, list[NightReturns]], int]:
    """Simulate one desk under no skill; return each horizon's scored nights (product path).

    ``calendar``: "weekdays" (one night per session) or "daily" (the default schedule's
    ``10 0 * * *`` with live data: as-of every calendar day, weekends included). ``step``
    rounds scores (0.05: ties, as a model writes them). ``regime_at``: from that night on the
    scores' persistence and spread change (still no skill).
    """
    names = [f"T{i:03d}" for i in range(tickers)]
    days = [MONDAY + timedelta(days=i) for i in range(int(nights * 1.5) + 10)]
    if calendar == "weekdays":
        days = [d for d in days if d.weekday() < 5]
    days = days[:nights]
    sessions = weekdays(MONDAY, len(days) + max(horizons) + 5)
    daily = DAILY_SD * rng.standard_normal((len(sessions), tickers))
    prices = 100 * np.exp(np.cumsum(daily, axis=0))
    provider = MemoryProvider(sessions, prices, names)
    cache = PriceCache(provider, max(horizons))  # type: ignore[arg-type]
    z = rng.standard_normal(tickers)
    out: dict[int, list[NightReturns]] = {h: [] for h in horizons}
    judged = 0
    for i, as_of in enumerate(days):
        rho, sd = persistence, score_sd
        if regime_at is not None and i >= regime_at:
            rho, sd = 1.0 - (1.0 - persistence) * 0.2, score_sd * 0.4
        z = rho * z + math.sqrt(1 - rho * rho) * rng.standard_normal(tickers)
        if rng.random() < drop_night:
            continue  # the batch did not run that night
        judged += 1
        scores = np.clip(sd * z, -1, 1)
        if step:
            scores = np.round(scores / step) * step
        grades = BatchGrades(i, "nightly", as_of, "succeeded", {})
        for name, score in zip(names, scores, strict=True):
            if drop_ticker and rng.random() < drop_ticker:
                grades.without_decision.append(name)
                continue
            grades.tickers[name] = [Grade(0, "Hold", float(score), False)]
        for h in horizons:
            night, _ = _night_returns(grades, cache, h, None)
            if night is not None:
                out[h].append(night)
    if hasattr(track, "one_per_session"):  # as track_report does (absent before 2026-12-06)
        out = {h: track.one_per_session(nights)[0] for h, nights in out.items()}
    return out, judged


VERDICT_CASES: list[tuple[str, dict[str, Any]]] = [
    ("baseline: 20 tickers, weekdays, persist 0.95", {}),
    ("ties: scores in steps of 0.05", {"step": 0.05}),
    ("ties + skewed: Hold ~75% (score sd 0.13), steps of 0.05",
     {"step": 0.05, "score_sd": 0.13}),
    ("tiny nights: 4 tickers", {"tickers": 4}),
    ("uneven nights: 12 tickers, each missing 40% of nights", {"tickers": 12,
                                                              "drop_ticker": 0.4}),
    ("huge nights: 400 tickers", {"tickers": 400, "runs": 0.25}),
    ("missing days: 30% of nights not run", {"drop_night": 0.3}),
    ("regime change at night 100 (persist 0.99, sd x0.4)", {"regime_at": 100}),
    ("fresh scores every night (persist 0)", {"persistence": 0.0}),
    ("daily schedule (weekends as-of, live data)", {"calendar": "daily"}),
    ("daily schedule, 100 tickers", {"calendar": "daily", "tickers": 100, "runs": 0.5}),
]
HORIZONS = [1, 5, 20]
PREFIXES = [60, 120, 250]


def verdict_part(runs: int, seed: int, only: str = "", shard: tuple[int, int] = (0, 1),
                 ) -> list[dict[str, Any]]:
    """Return the false-positive rate of each case at each horizon and night count, plus
    peeking (a look every night) and any of the three horizons (the default report)."""
    rows = []
    for c, (name, kwargs) in enumerate(VERDICT_CASES):
        if only not in name or c % shard[1] != shard[0]:
            continue
        rng = np.random.default_rng(seed + c)
        args: dict[str, Any] = {"tickers": 20, "nights": max(PREFIXES), **kwargs}
        runs_here = max(10, int(runs * args.pop("runs", 1.0)))  # the costly cases run fewer
        hits: dict[tuple[int, int], int] = {}
        judged: dict[tuple[int, int], int] = {}
        family, peek = {n: 0 for n in PREFIXES}, dict.fromkeys(HORIZONS, 0)
        started = time.monotonic()
        for _ in range(runs_here):
            by_h, _ = verdict_run(rng, horizons=HORIZONS, **args)
            # Each night's IC once, through horizon_record (night_ic); the verdict of the
            # first n nights is ic_verdict over their ICs, as horizon_record computes it.
            ics = {h: [(x.batch_id, x.ic) for x in horizon_record(by_h[h], h).nights
                       if x.ic is not None] for h in HORIZONS}
            for n in PREFIXES:
                any_h = False
                for h in HORIZONS:
                    test = ic_verdict([ic for i, ic in ics[h] if i < n], h)
                    judged[(h, n)] = judged.get((h, n), 0) + (not test.withheld)
                    hits[(h, n)] = hits.get((h, n), 0) + test.significant
                    any_h |= test.significant
                family[n] += any_h
            for h in HORIZONS:  # an operator who reads the verdict every night up to 250
                values = [ic for _, ic in ics[h]]
                peek[h] += any(ic_verdict(values[:k], h).significant
                               for k in range(1, len(values) + 1))
        for (h, n), count in sorted(hits.items()):
            rows.append(row(name, f"{h}d, {n} nights", count, runs_here, judged=judged[(h, n)]))
        for n in PREFIXES:
            rows.append(row(name, f"any of 1d/5d/20d, {n} nights", family[n], runs_here))
        for h in HORIZONS:
            rows.append(row(name, f"{h}d, a look every night to 250", peek[h], runs_here))
        print(f"  ({time.monotonic() - started:.0f} s)", flush=True)
    return rows



def row(case: str, cell: str, hits: int, runs: int, **extra: Any) -> dict[str, Any]:
    low, high = wilson(hits, runs)
    out = {"case": case, "cell": cell, "hits": hits, "runs": runs, "rate": hits / runs,
           "ci95": [low, high], **extra}
    print(f"{case:58} {cell:34} {hits / runs:6.1%} [{low:.1%}, {high:.1%}] of {runs}",
          flush=True)
    return out


def forward_part(runs: int, seed: int) -> list[dict[str, Any]]:
    """Return how often one night's IC p-value (``quality forward``) is below 5% under no
    relation, at small n, with and without ties."""
    rows = []
    rng = np.random.default_rng(seed)
    for n in (5, 6, 8, 9, 10, 20):
        for ties in (False, True):
            hits = 0
            for _ in range(runs):
                scores = np.clip(0.45 * rng.standard_normal(n), -1, 1)
                if ties:
                    scores = np.round(scores / 0.25) * 0.25
                p = ic_test(scores.tolist(), rng.standard_normal(n).tolist())[1]
                hits += p is not None and p < 0.05
            rows.append(row(f"forward p-value, {n} tickers" + (", ties" if ties else ""),
                            "p < 0.05", hits, runs))
    return rows


HOLD_60 = [0.05, 0.15, 0.60, 0.15, 0.05]
HOLD_70 = [0.025, 0.125, 0.70, 0.125, 0.025]
HOLD_80 = [0.025, 0.075, 0.80, 0.075, 0.025]
SKEWED = [0.01, 0.03, 0.66, 0.28, 0.02]  # bearish tilt, two grades nearly empty
SPREAD = [0.10, 0.20, 0.40, 0.20, 0.10]
SHIFTED = [0.35, 0.20, 0.15, 0.20, 0.10]


def with_rate(settings: Settings, rate: float) -> Settings:
    quality = settings.quality.model_copy(update={"false_alarm_rate": rate})
    return settings.model_copy(update={"quality": quality})


def night_counts(rng: np.random.Generator, shares: Sequence[float], n: int) -> dict[str, int]:
    return {r: int(c) for r, c in zip(RATINGS, rng.multinomial(n, shares), strict=True)}


def monitor_nights(rng: np.random.Generator, settings: Settings, mix: Callable[[int], Any],
                   sizes: Callable[[int], int], nights: int) -> list[set[str]]:
    """Judge a run of nights as ``check_batch`` does (references by ``reference_window``,
    seed 0); ``mix(i)`` gives night i's shares or its counts."""
    history: list[NightRecord] = []
    kinds = []
    for i in range(nights):
        drawn = mix(i)
        tonight = drawn if isinstance(drawn, dict) else night_counts(rng, drawn, sizes(i))
        window = reference_window(history, settings)
        found = findings(tonight, [r.distribution or {} for r in window.nights], settings,
                         moved_run=window.moved_run, batch_id=i)
        history.append(NightRecord.judged(i, tonight, found))
        kinds.append({f.kind for f in found})
    return kinds


def persistent_desk(rng: np.random.Generator, tickers: int, rho: float, sd: float,
                    ) -> Callable[[int], dict[str, int]]:
    """A fixed universe whose scores persist night to night (an AR(1) per ticker)."""
    from agents.decision import rating_for_score
    z = rng.standard_normal(tickers)

    def mix(_: int) -> dict[str, int]:
        nonlocal z
        z = rho * z + math.sqrt(1 - rho * rho) * rng.standard_normal(tickers)
        grades = [rating_for_score(float(s)) for s in np.clip(sd * z, -1, 1)]
        return {r: grades.count(r) for r in RATINGS}
    return mix


def monitor_part(runs: int, seed: int) -> list[dict[str, Any]]:
    """Return per-night warning rates of unchanged desks (after 5 warm-up nights), and what
    follows a lasting change."""
    base = load_settings()
    rows = []
    warm, judged_nights = 5, 20
    cases: list[tuple[str, float, Callable[[np.random.Generator], Callable[[int], Any]],
                      Callable[[int], int]]] = [
        ("Hold 60%, 20 tickers, rate 0.05", 0.05, lambda r: lambda i: HOLD_60, lambda i: 20),
        ("Hold 70% (limit), 30 tickers, rate 0.20", 0.20, lambda r: lambda i: HOLD_70,
         lambda i: 30),
        ("Hold 60%, 40 tickers, rate 0.001", 0.001, lambda r: lambda i: HOLD_60, lambda i: 40),
        ("skewed mix (two grades ~1-2%), 20 tickers", 0.01, lambda r: lambda i: SKEWED,
         lambda i: 20),
        ("tiny nights: 5 tickers (the minimum)", 0.01, lambda r: lambda i: SPREAD,
         lambda i: 5),
        ("huge nights: 1000 tickers", 0.01, lambda r: lambda i: SPREAD, lambda i: 1000),
        ("sizes vary night to night (5 to 200)", 0.01, lambda r: lambda i: SPREAD,
         lambda i: int(np.random.default_rng(i).integers(5, 201))),
        ("fixed universe, scores persist (rho 0.95), 40 tickers", 0.01,
         lambda r: persistent_desk(r, 40, 0.95, 0.45), lambda i: 40),
    ]
    for c, (name, rate, make_mix, sizes) in enumerate(cases):
        settings = with_rate(base, rate)
        rng = np.random.default_rng(seed + c)
        fired: dict[str, int] = {}
        for _ in range(runs):
            kinds = monitor_nights(rng, settings, make_mix(rng), sizes, warm + judged_nights)
            for night in kinds[warm:]:
                for kind in night | ({"any"} if night else set()):
                    fired[kind] = fired.get(kind, 0) + 1
        total = runs * judged_nights
        rows.append(row(f"monitor null: {name}", f"any warning (stated {rate:.1%})",
                        fired.get("any", 0), total, stated=rate, kinds=fired))
    # Power at a low rate: the first night of a Hold pile-up, five unchanged nights before.
    for rate in (0.01, 0.001):
        count = runs * 5
        rates = monitor_rates(100, HOLD_60, HOLD_80, count, with_rate(base, rate), seed=seed)
        rows.append(row(f"monitor power at rate {rate:g}: Hold 60% -> 80%, 100 tickers",
                        "moved (jump or concentration)", round(rates.get("moved", 0) * count),
                        count, stated=rate, kinds=rates))
    # A lasting change, then the new mix for good: warnings on the new mix's nights after a
    # new normal was declared (they should be unchanged nights again).
    for tickers, shift in ((20, SHIFTED), (40, SHIFTED), (40, HOLD_70)):
        settings = base
        rng = np.random.default_rng(seed + tickers)
        after, after_nights, declared = 0, 0, 0
        for _ in range(runs):
            kinds = monitor_nights(rng, settings,
                                   lambda i, s=shift: SPREAD if i < 10 else s,
                                   lambda i, n=tickers: n, 40)
            first = next((i for i, k in enumerate(kinds) if "new_normal" in k), None)
            if first is None:
                continue
            declared += 1
            for night in kinds[first + 1:]:
                after_nights += 1
                after += bool(night)
        rows.append(row(f"monitor after a new normal: {tickers} tickers, spread -> "
                        f"{'TVD 0.25 Hold->Buy' if shift is SHIFTED else 'Hold 70%'}",
                        "any warning after it (stated 1%)", after, max(1, after_nights),
                        declared_runs=declared, runs_total=runs))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--part", choices=["verdict", "forward", "monitor", "all"],
                        default="all")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--commit")
    parser.add_argument("--only", default="", help="verdict cases whose name contains this")
    parser.add_argument("--shard", default="0/1", help="i/n: the verdict cases i, i + n, …")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    started = time.monotonic()
    result: dict[str, Any] = {"commit": args.commit}
    if args.part in ("verdict", "all"):
        result["verdict"] = verdict_part(max(20, 200 // scale), seed=43, only=args.only,
                                         shard=(int(args.shard.split("/")[0]),
                                                int(args.shard.split("/")[1])))
    if args.part in ("forward", "all"):
        result["forward"] = forward_part(max(200, 4000 // scale), seed=44)
    if args.part in ("monitor", "all"):
        result["monitor"] = monitor_part(max(10, 500 // scale), seed=45)
    result["seconds"] = round(time.monotonic() - started)
    print(f"{result['seconds']} s", flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
