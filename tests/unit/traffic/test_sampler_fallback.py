"""An unreadable /metrics under adaptive: warned once, shown, recorded, and a server problem."""

from __future__ import annotations

from pathlib import Path

import structlog
from rich.console import Console
from sqlalchemy import Engine, select

from agents.data.demo import DEMO_AS_OF, demo_tickers
from agents.graph import node_names
from app.batch.engine import BatchPlan
from app.cli.report import render_table
from app.config import load_settings
from app.db.batchsettings import FallbackRecord
from app.db.models import Batch
from app.morning.accounting import batch_report
from app.morning.serverview import server_view
from app.recorder.progress import BatchProgress
from app.recorder.record import Recorder
from app.traffic.strategy import Strategy
from tests.fakevllm import FakeServer, Reply
from tests.unit.support.engines import make_engine
from tests.unit.support.servers import read_servers


async def test_unreadable_metrics_are_warned_once_paused_on_and_recorded(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    tickers = demo_tickers(2)
    settings = load_settings(check_context_length=False, retry_backoff_s=0,
                             metrics_interval_s=0.05, server_probe_interval_s=0.05)
    missed = 6
    server = FakeServer(nodes=node_names(settings.pipeline()), tickers=tickers)
    server.cue(Reply(status=503, error="metrics unavailable"), times=missed, path="/metrics")
    runner = make_engine(sqlite_engine, demo_dir, server, settings, sample_metrics=True)
    with structlog.testing.capture_logs() as logs:
        outcome = await runner.run(BatchPlan("nightly", DEMO_AS_OF, tickers),
                                   recording=Recorder(sqlite_engine))
    assert outcome.status == "succeeded"
    reads = sum(1 for r in server.requests if r.path == "/metrics")
    assert reads > missed  # it became readable again, and was read
    fallback_warnings = [e for e in logs if e["log_level"] == "warning"
                         and "adaptive admission" in e["event"]]
    assert len(fallback_warnings) == 1  # once, however many readings failed
    with sqlite_engine.connect() as conn:
        recorded = conn.execute(select(Batch.settings)).scalar_one()
    fallback = recorded["metrics_fallback"]
    assert fallback["readings_missed"] == missed
    assert fallback["limit"] == Strategy.parse("adaptive").admission_policy(64).initial
    assert fallback["seconds"] > 0
    # A server problem, not headroom: the watch held admission while it lasted.
    assert recorded.get("server_outages")
    report = batch_report(sqlite_engine, outcome.batch_id)
    assert report.metrics_fallback == FallbackRecord(**fallback)
    console = Console(record=True, width=200)
    render_table(report, server_view(sqlite_engine, outcome.batch_id), console)
    assert f"{missed} readings of /metrics missed" in console.export_text()


def test_progress_shows_the_fallback() -> None:
    servers = read_servers()
    servers.first.limits.blind_since = 0.0  # a spell without /metrics going on
    progress = BatchProgress(1, 2, servers, console=Console(record=True))
    assert progress.state().admission == "fallback: /metrics unreadable"
    console = Console(record=True, width=200)
    console.print(progress)
    assert "admitting 4 (fallback: /metrics unreadable)" in console.export_text()
