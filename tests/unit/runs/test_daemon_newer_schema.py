"""A daemon or web server started before another host migrated the shared database to a
revision this install does not know is refused at its next fire or request, in the one line
every command gives (``SchemaTooNew``), never a traceback, and writes nothing of a night.

Before, both were checked only at their start: the next fire ran tonight's batch into the
newer schema, and the pages kept reading it (docs/lab/2026-12-07-left-alone-4.md).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import structlog
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from agents.data.demo import demo_tickers
from app.config import load_settings
from app.morning.prometheus import NightCollector
from app.runs.nightly import run_nightly
from app.web import server
from tests.unit.support.daemon_clock import NIGHT, batch_settings, daemon_for, running, tick
from tests.unit.support.engines import fake_llm
from tests.unit.support.newer_schema import contents, said_truthfully, stamp_future
from tests.unit.support.webclient import AUTH

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
    monkeypatch.setattr(server, "SCHEMA_CHECK_S", 0.0, raising=False)  # that time passed
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
