"""Check a batch's stored settings: one model, versioned, that reads every older row as it
was written and writes it back keeping what it said (app/db/batchsettings.py)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, insert, select

from app.batch import store
from app.db.batchsettings import SCHEMA_VERSION, BatchSettings, FallbackRecord
from app.db.models import Batch, LLMCall, TickerRun
from app.morning.accounting import batch_report
from app.morning.summary import batch_summary
from app.runs.resumable import find_resumable

# A row as nightdesk wrote it on 2026-11-30 (1f0713fd: Settings.snapshot(), then samples and
# strategy at the start, demo_data at the end): no version, no runner, no cap, no home.
NOVEMBER = {
    "model": "Qwen/Qwen3.6-27B", "base_url": "http://gpu:8000/v1",
    "server_profile": "qwen-dense-27b",
    "sampling": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "presence_penalty": 1.5,
                 "enable_thinking": False},
    "debate_rounds": 1, "risk_rounds": 1, "node_max_tokens": {"trader": 512},
    "data_provider": "snapshot", "request_seeds": True, "samples": 3,
    "strategy": "fixed-8", "demo_data": True,
}
# A row as the last unversioned nightdesk wrote it (main at 2f8642af: the snapshot, the
# engine's keys, a resume's, the end's), resumed once, one outage, /metrics missed a while.
DECEMBER = {
    **{key: NOVEMBER[key] for key in ("model", "base_url", "server_profile", "sampling",
                                      "debate_rounds", "risk_rounds", "node_max_tokens",
                                      "data_provider")},
    "request_seeds": False, "max_concurrency": 64, "heartbeat_interval_s": 15.0,
    "demo_data": False, "samples": 1, "universe_notes": ["ZZZ: not in the snapshot"],
    "strategy": "adaptive",
    "runner": {"host": "night", "pid": 4242, "started": 123456, "pidns": "pid:[4026531836]",
               "booted": 1796000000.25},
    "home": "/var/lib/nightdesk",
    "resumes": ["2026-12-07T01:40:00.123456+00:00"],
    "server_outages": [{"endpoint": "http://gpu:8000/v1", "seconds": 21.4,
                        "start": "2026-12-07T01:10:00.500000+00:00"}],
    "served_weights": {"http://gpu:8000/v1": "/models/qwen3.6-27b"},
    "metrics_fallback": {"readings_missed": 4, "seconds": 62.0, "limit": 8},
}


def _row(engine: Engine, settings: dict[str, Any], status: str = "interrupted") -> int:
    """Insert a batch row as an older nightdesk left it, its settings JSON as given."""
    start = datetime(2026, 12, 7, 1, 0, tzinfo=UTC)
    with engine.begin() as conn:
        batch_id = int(conn.execute(insert(Batch).values(
            kind="nightly", as_of=date(2026, 12, 4), status=status, created_at=start,
            started_at=start, heartbeat_at=start + timedelta(minutes=50),
            finished_at=start + timedelta(minutes=50), settings=settings, tickers_total=1,
        ).returning(Batch.id)).scalar_one())
        conn.execute(insert(TickerRun).values(batch_id=batch_id, ticker="AAA",
                                              status="interrupted"))
        return batch_id


def _stored(engine: Engine, batch_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        return dict(conn.execute(select(Batch.settings).where(Batch.id == batch_id)).scalar_one())


def test_a_november_row_reads_as_it_was_written() -> None:
    read = BatchSettings.read(NOVEMBER)
    assert read.schema_version == 1  # unversioned: written before the version was stored
    assert (read.model, read.samples, read.strategy, read.demo_data, read.request_seeds) == (
        "Qwen/Qwen3.6-27B", 3, "fixed-8", True, True)
    assert read.sampling == NOVEMBER["sampling"] and read.node_max_tokens == {"trader": 512}
    # What it never recorded reads as not recorded, not as a default that claims something.
    assert (read.max_concurrency, read.heartbeat_interval_s, read.runner, read.home) == (
        None, None, None, None)
    assert (read.resumes, read.server_outages, read.served_weights, read.universe_notes,
            read.metrics_fallback) == ([], [], {}, [], None)


def test_a_december_row_reads_typed_and_writes_back_what_it_said() -> None:
    read = BatchSettings.read(DECEMBER)
    assert read.runner is not None and (read.runner.pid, read.runner.booted) == (
        4242, 1796000000.25)
    assert read.resumes == [datetime(2026, 12, 7, 1, 40, 0, 123456, tzinfo=UTC)]
    assert read.server_outages[0].seconds == 21.4
    assert read.metrics_fallback == FallbackRecord(readings_missed=4, seconds=62.0, limit=8)
    # Every key as it was (a rollback's reader reads it as its own), the version added.
    assert read.stored() == {**DECEMBER, "schema_version": SCHEMA_VERSION}
    assert BatchSettings.read(NOVEMBER).stored() == {**NOVEMBER, "schema_version": 2}


def test_what_a_version_does_not_know_is_kept_and_a_garbled_runner_names_no_process() -> None:
    newer = {**NOVEMBER, "schema_version": 3, "admission": {"kind": "adaptive"},
             "runner": {"host": "night"}}  # no pid: names no process, as Runner.of read it
    read = BatchSettings.read(newer)
    assert read.runner is None
    assert read.stored()["admission"] == {"kind": "adaptive"}
    assert BatchSettings.read(None) == BatchSettings()  # NULL: nothing recorded


def test_older_rows_read_on_every_surface_and_their_end_writes_version_2(
        sqlite_engine: Engine) -> None:
    november, december = _row(sqlite_engine, NOVEMBER), _row(sqlite_engine, DECEMBER)
    seen = batch_summary(sqlite_engine, november, stale_s=120)
    assert (seen.model, seen.samples, seen.strategy, seen.demo) == (
        "Qwen/Qwen3.6-27B", 3, "fixed-8", True)
    assert batch_summary(sqlite_engine, december, stale_s=120).notes == DECEMBER[
        "universe_notes"]
    with sqlite_engine.begin() as conn:  # one call each side of the resume
        conn.execute(insert(LLMCall), [{
            "batch_id": december, "ticker": "AAA", "node": "market_analyst", "sample": 0,
            "attempt": 1, "status": "ok", "endpoint": "http://gpu:8000/v1", "model": "m",
            "completion_tokens": 10, "latency_s": 1.0,
            "started_at": datetime(2026, 12, 7, 1, m, tzinfo=UTC),
            "ended_at": datetime(2026, 12, 7, 1, m, 1, tzinfo=UTC)} for m in (5, 45)])
    report = batch_report(sqlite_engine, december)
    assert report.metrics_fallback == FallbackRecord(readings_missed=4, seconds=62.0, limit=8)
    assert report.pauses == 1  # the stored resume's moment split the calls
    point = find_resumable(sqlite_engine, november, stale_s=120)
    assert (point.plan().samples, point.plan().strategy) == (3, "fixed-8")
    store.finish_batch(sqlite_engine, december, "succeeded",
                       extra_settings={"served_weights": {"http://gpu:8001/v1": "/w"}})
    assert _stored(sqlite_engine, december) == {
        **DECEMBER, "served_weights": {"http://gpu:8001/v1": "/w"}, "schema_version": 2}
