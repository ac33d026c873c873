"""A daemon or web server started before another host migrated the shared database to a
revision this install does not know is refused at its next fire or request, in the one line
every command gives (``SchemaTooNew``), never a traceback, and writes nothing of a night.

Before, both were checked only at their start: the next fire ran tonight's batch into the
newer schema, and the pages kept reading it (docs/lab/2026-12-07-left-alone-4.md).
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
import structlog
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from sqlalchemy import Engine, select

from agents.data.demo import demo_tickers
from app.config import load_settings
from app.db import engine
from app.db.engine import SchemaWatch
from app.db.models import SchedulerBeat
from app.morning.prometheus import NightCollector, night_registry
from app.runs.daemon import Heartbeat
from app.runs.nightly import run_nightly
from tests.unit.support.daemon_clock import NIGHT, batch_settings, daemon_for, running, tick
from tests.unit.support.engines import fake_llm
from tests.unit.support.newer_schema import contents, said_truthfully, stamp_future
from tests.unit.support.webclient import AUTH, web_client

pytestmark = pytest.mark.demo_tickers(2)
# What a serving daemon writes of itself (its schedule, its heartbeat), not of a night.
DAEMONS_OWN = ("apscheduler_jobs", "scheduler_heartbeats")


def test_a_daemon_whose_database_was_migrated_since_its_start_refuses_the_next_fire(
        sqlite_engine: Engine, sqlite_url: str, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.webhook import webhook

    server_ = fake_llm(monkeypatch, None, demo_tickers(2))
    with webhook() as hook, structlog.testing.capture_logs() as logs, \
            running(daemon_for(sqlite_engine, run_nightly, notify=hook.url(),
                               **batch_settings(demo_dir)),
                    NIGHT - timedelta(hours=1)) as daemon:
        # Started on a current schema; then another host's newer nightdesk migrates it.
        stamp_future(sqlite_url)
        before = contents(sqlite_url)
        tick(daemon, NIGHT)
        after = contents(sqlite_url)
    assert {t: rows for t, rows in after.items() if t not in DAEMONS_OWN} == \
        {t: rows for t, rows in before.items() if t not in DAEMONS_OWN}  # no batch, no refusal
    assert server_.chats == []
    [failed] = [e for e in logs if e["log_level"] in ("error", "critical")]
    assert failed["event"] == "nightly run failed" and "exc_info" not in failed, failed
    assert said_truthfully(failed["error"]), failed
    # The morning hears of it as of any refused night, in the same line (its first 400
    # characters, as every refusal's digest gives it).
    [post] = hook.posts
    assert post["type"] == "failure" and failed["error"][:390] in post["message"], post


def test_a_web_server_whose_database_was_migrated_since_its_start_answers_503_in_one_line(
        client: TestClient, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert client.get("/api/batches", auth=AUTH).status_code == 200
    stamp_future(sqlite_url)
    # Read at most every SCHEMA_CHECK_S: the next request within it is served as before.
    assert client.get("/api/batches", auth=AUTH).status_code == 200
    monkeypatch.setattr(engine, "SCHEMA_CHECK_S", 0.0)  # that time passed
    api = client.get("/api/batches", auth=AUTH)
    assert api.status_code == 503 and said_truthfully(api.json()["detail"]), api.text
    page = client.get("/", auth=AUTH)
    assert page.status_code == 503 and api.json()["detail"] in page.text, page.text
    assert "Traceback" not in page.text
    for path in ("/healthz", "/metrics"):
        answer = client.get(path, auth=AUTH)
        assert answer.status_code == 503, (path, answer.text)
        assert answer.json()["detail"] == api.json()["detail"]


def test_the_metrics_port_reads_no_night_of_a_schema_migrated_since(
        sqlite_engine: Engine, sqlite_url: str) -> None:
    # The loopback --metrics-port has no pages in front of it: its collector checks.
    collector = NightCollector(sqlite_engine, load_settings())
    stamp_future(sqlite_url)
    with structlog.testing.capture_logs() as logs:
        families = {f.name: f for f in collector.collect()}
    assert list(families) == ["nightdesk_metrics_database_up"]
    assert families["nightdesk_metrics_database_up"].samples[0].value == 0
    [error] = [e for e in logs if e["event"] == "metrics not read"]
    assert said_truthfully(error["error"]), error


def _beats(sqlite_engine: Engine) -> list[object]:
    with sqlite_engine.connect() as conn:
        return [row.beat_at for row in conn.execute(select(SchedulerBeat))]


def test_a_daemons_heartbeat_stops_while_its_fires_are_refused_for_the_schema(
        sqlite_engine: Engine, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # It beat on into a schema it refused every night on: its beat read "heartbeat current"
    # on a newer install's pages and /metrics, a daemon serving nights it would refuse, and
    # it wrote into tables no longer this code's.
    monkeypatch.setattr(engine, "SCHEMA_CHECK_S", 0.0)
    beat = Heartbeat(sqlite_engine, 0.01, lambda: None, "10 0 * * *")
    with structlog.testing.capture_logs() as logs:
        with beat:
            while not _beats(sqlite_engine):
                time.sleep(0.01)
            stamp_future(sqlite_url)
            time.sleep(0.05)  # the beat under way, if one was, has ended
            stopped = contents(sqlite_url)
            time.sleep(0.1)  # ten beats' time
            assert contents(sqlite_url) == stopped
        assert contents(sqlite_url) == stopped  # its close deletes no row either
    [said] = [e for e in logs if e["log_level"] == "error"]
    assert said["event"] == "scheduler heartbeat stopped: every night is refused"
    assert said_truthfully(said["error"]), said


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the reads of the schema's revision."""
    counted: list[int] = []
    real = engine.current_revision
    monkeypatch.setattr(engine, "current_revision",
                        lambda e: counted.append(1) or real(e))
    return counted


def test_the_pages_metrics_read_the_revision_once_per_interval(
        sqlite_engine: Engine, reads: list[int]) -> None:
    # Its collector read the revision at every scrape, behind the pages' 30 s check.
    with web_client(sqlite_engine, settings=load_settings()) as client:
        for _ in range(3):
            assert client.get("/metrics", auth=AUTH).status_code == 200
            assert client.get("/api/batches", auth=AUTH).status_code == 200
    assert len(reads) == 1


def test_the_pages_and_the_metrics_port_share_one_read_of_the_revision_per_interval(
        sqlite_engine: Engine, reads: list[int]) -> None:
    # One watch per process (`nightdesk web --metrics-port`): the port's scrapes too.
    schema = SchemaWatch(sqlite_engine)
    registry = night_registry(sqlite_engine, load_settings(), schema)
    with web_client(sqlite_engine, settings=load_settings(), schema=schema) as client:
        for _ in range(3):
            assert client.get("/metrics", auth=AUTH).status_code == 200
            assert b"nightdesk_metrics_database_up 1.0" in generate_latest(registry)
    assert len(reads) == 1
