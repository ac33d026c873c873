"""At each stored reading of a night recorded with chain slots: the chains open, the slots.

For docs/lab/2026-12-06-eta-slots.md; a diagnostic, not part of the package. For each
progress reading of the fixture (before the night's end) it prints, as Markdown rows: how far
into the night; the tickers started and not finished; the chain slots of the newest server
sample (``server_samples.chain_slots``); the tickers with a call issued and not yet answered
at that moment; and the tickers with a call answered in the 15 s after it (the chains that
progress, held or not). Usage, from a checkout:
``PYTHONPATH=$PWD .venv/bin/python docs/bench/eta-slots-open.py gpu_sim_gated60_slots``.
"""

from __future__ import annotations

import sys
import tempfile
from datetime import timedelta

from sqlalchemy import select

from app.db.engine import get_engine
from app.db.models import Base, Batch, LLMCall, ServerSample, TickerRun
from tests.unit.support.eta_fixture import fixture, load

AHEAD = timedelta(seconds=15)


def main(name: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        engine = get_engine(f"sqlite:///{scratch}/replay.db")
        Base.metadata.create_all(engine)
        batch_id, _, readings = load(engine, fixture(name))
        with engine.connect() as conn:
            start, end = conn.execute(select(Batch.started_at, Batch.finished_at)
                                      .where(Batch.id == batch_id)).one()
            calls = conn.execute(select(LLMCall.ticker, LLMCall.started_at, LLMCall.ended_at)
                                 .where(LLMCall.batch_id == batch_id,
                                        LLMCall.status == "ok")).all()
            runs = conn.execute(select(TickerRun.started_at, TickerRun.finished_at)
                                .where(TickerRun.batch_id == batch_id)).all()
            samples = conn.execute(select(ServerSample.sampled_at, ServerSample.chain_slots)
                                   .where(ServerSample.batch_id == batch_id)
                                   .order_by(ServerSample.sampled_at)).all()
        engine.dispose()
    night_s = (end - start).total_seconds()
    print("| into | left s | open (started) | chain slots | tickers with a call running "
          "| tickers answered in the next 15 s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in readings:
        t = r["taken_at"]
        if t >= end:
            continue
        started = sum(1 for a, f in runs if a is not None and a <= t and (f is None or f > t))
        open_ = sum(1 for _, f in runs if f is None or f > t)
        slots = [s for at, s in samples if at <= t][-1:] or [None]
        running = len({k for k, a, e in calls if a <= t < e})
        ahead = len({k for k, _, e in calls if t < e <= t + AHEAD})
        print(f"| {(t - start).total_seconds() / night_s:.0%} | {(end - t).total_seconds():.0f} "
              f"| {open_} ({started}) | {slots[0]} | {running} | {ahead} |")


if __name__ == "__main__":
    main(sys.argv[1])
