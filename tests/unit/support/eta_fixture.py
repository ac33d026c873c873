"""A recorded night for the ETA's replay: its rows and the progress readings taken live.

The fixture (JSON) holds what ``app.morning.eta.reading`` reads, for the night and for the finished
night before it (the prior, whose calls alone are read): the batch row's settings, its
ticker runs, its calls (times, tokens, status), its ``/metrics`` generation counters and the
budget's chain slots at each (a fixture exported before those were stored has none), and the
``progress_readings`` rows the live progress stored. ``load`` writes them into a database;
exporting one is

    python -m tests.unit.support.eta_fixture SQLITE_URL BATCH_ID OUT.json "where it came from"

and ``python -m tests.unit.support.eta_fixture table FIXTURE.json`` prints its replay as a
Markdown table (the docs/lab notes' tables): at each stored reading, the ETA replayed now
against the true time left, and the estimate the live reading stored. ``table FIXTURE.json
STEP`` replays it every STEP seconds instead (no live estimate to show), with how many of
those moments from a tenth of the night on were within 25% of the time left, and within 25%
or one reading interval (``app.batch.progress.LOG_EVERY_S``).
"""

from __future__ import annotations

import json
import sys
import tempfile
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, insert, select

from app.db.engine import get_engine
from app.db.models import Base, Batch, LLMCall, ProgressReading, ServerSample, TickerRun
from app.morning import eta
from app.recorder.progress import LOG_EVERY_S
from tests.unit.support import FIXTURES

CALL = ("ticker", "node", "sample", "status", "completion_tokens", "ready_at", "started_at",
        "ended_at")
# Fixtures exported before chain_slots was stored hold the first three: loaded as None.
SAMPLE = ("endpoint", "sampled_at", "generation_tokens_total", "chain_slots")
TICKER = ("ticker", "status", "started_at", "finished_at")
BATCH = ("kind", "as_of", "status", "created_at", "started_at", "finished_at",
         "tickers_total", "settings")
READING = tuple(c.name for c in ProgressReading.__table__.columns
                if c.name not in ("id", "batch_id"))
TIMES = {"ready_at", "started_at", "ended_at", "sampled_at", "finished_at", "created_at",
         "taken_at"}


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime | date) else value


def _batch(engine: Engine, batch_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(select(*(getattr(Batch, c) for c in BATCH))
                           .where(Batch.id == batch_id)).one()
        calls = conn.execute(select(*(getattr(LLMCall, c) for c in CALL))
                             .where(LLMCall.batch_id == batch_id).order_by(LLMCall.id)).all()
        samples = conn.execute(select(*(getattr(ServerSample, c) for c in SAMPLE))
                               .where(ServerSample.batch_id == batch_id)
                               .order_by(ServerSample.id)).all()
        tickers = conn.execute(select(*(getattr(TickerRun, c) for c in TICKER))
                               .where(TickerRun.batch_id == batch_id)).all()
        readings = conn.execute(select(*(getattr(ProgressReading, c) for c in READING))
                                .where(ProgressReading.batch_id == batch_id)
                                .order_by(ProgressReading.id)).all()
    return {"batch": {c: _plain(v) for c, v in zip(BATCH, row, strict=True)},
            "calls": [[_plain(v) for v in r] for r in calls],
            "samples": [[_plain(v) for v in r] for r in samples],
            "tickers": [[_plain(v) for v in r] for r in tickers],
            "readings": [[_plain(v) for v in r] for r in readings]}


def export(url: str, batch_id: int, source: str) -> dict[str, Any]:
    """Return the night ``batch_id`` and the finished night before it, as the fixture."""
    engine = get_engine(url)
    with engine.connect() as conn:
        before = conn.execute(select(Batch.id).where(
            Batch.id < batch_id, Batch.status.in_(("succeeded", "partial")))
            .order_by(Batch.id.desc()).limit(1)).scalar()
    # The prior reads only the night before's calls.
    prior = None if before is None else {**_batch(engine, before), "samples": [],
                                         "readings": []}
    return {"source": source, "night": _batch(engine, batch_id), "before": prior}


def _row(columns: tuple[str, ...], values: list[Any]) -> dict[str, Any]:
    """Return a row's columns; those an older fixture lacks (at the end) as None."""
    if len(values) > len(columns):
        raise ValueError(f"a fixture row of {len(values)} values for {len(columns)} columns")
    values = [*values, *[None] * (len(columns) - len(values))]
    return {c: (datetime.fromisoformat(v) if c in TIMES and v is not None else v)
            for c, v in zip(columns, values, strict=True)}


def _load_batch(engine: Engine, night: dict[str, Any]) -> int:
    row = dict(night["batch"])
    row["as_of"] = date.fromisoformat(row["as_of"])
    for c in ("created_at", "started_at", "finished_at"):
        row[c] = None if row[c] is None else datetime.fromisoformat(row[c])
    with engine.begin() as conn:
        key = conn.execute(insert(Batch).values(**row)).inserted_primary_key
        assert key is not None
        batch_id = int(key[0])
        for model, columns, key in ((LLMCall, CALL, "calls"), (ServerSample, SAMPLE, "samples"),
                                    (TickerRun, TICKER, "tickers")):
            rows = [{**_row(columns, v), "batch_id": batch_id} for v in night[key]]
            if model is LLMCall:
                rows = [{**r, "model": "recorded", "latency_s": 0.0} for r in rows]
            if model is ServerSample:
                rows = [{**r, "running": 0.0, "waiting": 0.0, "kv_cache_usage": 0.0,
                         "preemptions_total": 0.0, "prompt_tokens_total": 0.0} for r in rows]
            if rows:
                conn.execute(insert(model), rows)
    return batch_id


def load(engine: Engine, path: Path,
         before: bool = True) -> tuple[int, datetime, list[dict[str, Any]]]:
    """Write the fixture's nights into ``engine``; return the night's id, the end of its
    last call and its recorded readings (as dicts of ``progress_readings`` columns).
    ``before=False`` leaves the night before out: the night replayed as its database's
    first (no prior)."""
    fixture = json.loads(path.read_text())
    if before and fixture["before"] is not None:
        _load_batch(engine, fixture["before"])
    night = fixture["night"]
    batch_id = _load_batch(engine, night)
    end = max(datetime.fromisoformat(c[CALL.index("ended_at")]) for c in night["calls"])
    return batch_id, end, [_row(READING, r) for r in night["readings"]]


def _error(said: float | None, left: float) -> str:
    return "—" if said is None else f"{(said - left) / left:+.0%}"


def table(path: Path, step_s: float | None = None) -> str:
    """Return the fixture's replay as Markdown rows, and how often the interval held the
    true time left from a tenth of the night on; ``step_s``: at every ``step_s`` seconds of
    the night rather than at its stored readings, and how often the ETA was within 25% of
    the time left, or within 25% or one reading interval."""
    with tempfile.TemporaryDirectory() as scratch:
        engine = get_engine(f"sqlite:///{scratch}/replay.db")
        Base.metadata.create_all(engine)
        batch_id, _, readings = load(engine, path)
        with engine.connect() as conn:
            start, end = conn.execute(select(Batch.started_at, Batch.finished_at)
                                      .where(Batch.id == batch_id)).one()
        night_s = (end - start).total_seconds()
        if step_s is not None:
            count = int(night_s // step_s) + 1
            readings = [{"taken_at": start + timedelta(seconds=i * step_s), "eta_s": None}
                        for i in range(count)]
        rows = ["| into the night | left s | ETA s (interval) | error | live s | live error |",
                "|---:|---:|---|---:|---:|---:|"]
        held = counted = within = floored = 0
        for recorded in readings:
            left = (end - recorded["taken_at"]).total_seconds()
            if left <= 0:
                continue
            found = eta.reading(engine, batch_id, recorded["taken_at"])
            if 1 - left / night_s >= 0.10:
                counted += 1
                held += (found.eta_low_s is not None and found.eta_high_s is not None
                         and found.eta_low_s <= left <= found.eta_high_s)
                off = None if found.eta_s is None else abs(found.eta_s - left)
                within += off is not None and off <= 0.25 * left
                floored += off is not None and off <= max(0.25 * left, LOG_EVERY_S)
            shown = ("—" if found.eta_s is None else
                     f"{found.eta_s:.0f} ({found.eta_low_s:.0f}–{found.eta_high_s:.0f})")
            live = recorded["eta_s"]
            rows.append(f"| {1 - left / night_s:.0%} | {left:.0f} | {shown} | "
                        f"{_error(found.eta_s, left)} | "
                        f"{'—' if live is None else f'{live:.0f}'} | {_error(live, left)} |")
        engine.dispose()
    summary = [f"interval held the time left: {held} of {counted} readings from 10% on"]
    if step_s is not None:
        summary.append(f"within 25% of the time left: {within} of {counted}; within 25% or "
                       f"{LOG_EVERY_S:.0f} s: {floored} of {counted}")
    return "\n".join([*rows, "", *summary])


if __name__ == "__main__" and sys.argv[1] == "table":
    print(table(Path(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else None))
elif __name__ == "__main__":
    url, batch, out, source = sys.argv[1:5]
    Path(out).write_text(json.dumps(export(url, int(batch), source), separators=(",", ":"))
                         + "\n")


def fixture(name: str) -> Path:
    return FIXTURES / f"eta_night_{name}.json"
