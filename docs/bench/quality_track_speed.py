"""Time ``quality track``'s report over many nights and tickers (a benchmark, not a test).

    .venv/bin/python docs/bench/quality_track_speed.py --nights 250 --tickers 100

Builds, in a temporary folder, a SQLite database upgraded to the newest migration with one
finished one-sample nightly batch per night, and a snapshot per night (every ticker's
prices: 30 sessions up to the night and 25 after it), then times ``track_report`` at
1d,5d,20d — the work behind ``nightdesk quality track`` and the Track record page. Writing
the data is not timed. Prints the wall and CPU seconds and the provider reads made (of
closes, and of full bundles: none expected). ``--profile FILE`` writes cProfile's stats of
the timed part (read them with ``python -m pstats FILE``).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd

from agents.data.base import Closes, MarketBundle
from agents.data.freeze import write_manifest, write_ticker
from agents.data.snapshot import Manifest, SnapshotProvider
from agents.decision import rating_for_score
from app.batch import store
from app.db.engine import get_engine, upgrade
from app.quality.track import track_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=250)
    parser.add_argument("--tickers", type=int, default=100)
    parser.add_argument("--profile", type=Path)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    days = pd.bdate_range("2025-01-02", periods=args.nights + 60)
    tickers = [f"T{i:03d}" for i in range(args.tickers)]
    closes = 100 * np.exp(np.cumsum(rng.normal(0, 0.02, (len(days), args.tickers)), axis=0))
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        url = f"sqlite:///{root / 'nightdesk.db'}"
        upgrade(url)
        engine = get_engine(url)
        ids = []
        built = time.monotonic()
        for night in range(args.nights):
            at = 30 + night
            as_of: date = days[at].date()
            window = days[at - 29:at + 26]
            for i, ticker in enumerate(tickers):
                values = closes[at - 29:at + 26, i]
                frame = pd.DataFrame({c: values for c in ("open", "high", "low", "close")}
                                     | {"volume": 1.0}, index=pd.DatetimeIndex(window,
                                                                               name="date"))
                write_ticker(root / "data", as_of, ticker, frame, {}, [], [])
            write_manifest(root / "data", as_of, Manifest("snapshot", "x", False, tickers))
            batch = store.create_batch(engine, kind="nightly", as_of=as_of, tickers=tickers,
                                       samples=1, settings={"samples": 1,
                                                            "data_provider": "snapshot"},
                                       server_facts=None)
            for ticker in tickers:
                score = float(np.clip(rng.normal(0, 0.45), -1, 1))
                store.ticker_finished(engine, batch, ticker, [store.DecisionRow(
                    ticker, 0, rating_for_score(score), score, 0.5, "bench")], None)
            store.finish_batch(engine, batch, "succeeded")
            ids.append(batch)
        built = time.monotonic() - built
        provider = SnapshotProvider(root / "data")
        reads = {"closes": 0, "load": 0}
        read, load = provider.closes, provider.load

        def counted_closes(ticker: str, as_of: date, days: int) -> Closes:
            reads["closes"] += 1
            return read(ticker, as_of, days)

        def counted_load(ticker: str, as_of: date) -> MarketBundle:
            reads["load"] += 1
            return load(ticker, as_of)

        provider.closes = counted_closes  # type: ignore[method-assign]
        provider.load = counted_load  # type: ignore[method-assign]
        profile = cProfile.Profile() if args.profile else None
        started, cpu = time.monotonic(), time.process_time()
        if profile:
            profile.enable()
        report = track_report(engine, ids, [1, 5, 20], lambda _: provider)
        seconds, cpu = time.monotonic() - started, time.process_time() - cpu
        if profile:
            profile.disable()
            profile.dump_stats(args.profile)
        print(json.dumps({"nights": args.nights, "tickers": args.tickers,
                          "track_seconds": round(seconds, 2), "track_cpu_seconds": round(cpu, 2),
                          "provider_reads": reads,
                          "data_written_seconds": round(built, 1),
                          "judged": [h.judged for h in report.horizons]}))


if __name__ == "__main__":
    main()
