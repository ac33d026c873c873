"""A night on PostgreSQL pushes its digest to a real JSON webhook, and /metrics reads it back.

The night runs as an operator starts it (`nightdesk run`, in this process), its LLM faked at
the HTTP edge: GOOD succeeds (the fake's decision: Overweight +0.40), BAD fails (every call
answered 400 "prompt rejected"). The night before, stored as rows: GOOD Hold +0.00, BAD Buy
+0.70. The digest goes through Apprise's ``json://`` to an ``http.server`` listener on
127.0.0.1 started by the test; every expected value below follows from those inputs.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from app.config import load_settings
from app.db.engine import get_engine
from app.db.models import Batch
from app.web.auth import Guard
from app.web.reruns import RerunQueue
from app.web.server import create_app
from tests.fakevllm import ChatRequest, Reply
from tests.integration.conftest import private_database
from tests.unit.support.clirun import run_cli
from tests.unit.support.engines import fake_llm
from tests.unit.support.night_rows import Rated, add_night, at
from tests.webhook import webhook

pytestmark = pytest.mark.integration


@pytest.fixture
def pg_digest_url() -> Iterator[str]:
    with private_database(f"nightdesk_digest_{os.getpid()}", upgraded=True) as url:
        yield url


def test_a_partial_night_sends_its_digest_to_a_json_webhook(
        pg_digest_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = get_engine(pg_digest_url)
    good, bad = demo_tickers(2)
    before = DEMO_AS_OF - timedelta(days=1)
    previous = add_night(engine, before, at(DEMO_AS_OF, 0, 10),
                         {good: Rated("Hold", 0.0), bad: Rated("Buy", 0.7)})
    write_demo(tmp_path / "data", DEMO_AS_OF, 2)

    def script(chat: ChatRequest) -> Reply | None:
        return Reply(status=400, error="prompt rejected") if chat.ticker == bad else None

    fake_llm(monkeypatch, script, [good, bad])
    env = {"NIGHTDESK_DATABASE_URL": pg_digest_url, "NIGHTDESK_DATA_DIR": str(tmp_path / "data"),
           "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false",
           "NIGHTDESK_WEB_BASE_URL": "https://desk.example.org"}
    with webhook() as hook:
        result = run_cli("run", "--tickers", f"{good},{bad}", "--as-of", str(DEMO_AS_OF),
                         "--no-preflight", env={**env, "NIGHTDESK_NOTIFY": hook.url("morning")})
    assert result.code == 3, result.stderr  # partial
    with engine.connect() as conn:
        night = conn.execute(select(Batch).where(Batch.id != previous)).one()
    assert night.status == "partial"

    [post] = hook.posts
    assert hook.paths == ["/morning"]
    assert post["type"] == "warning"
    assert post["title"] == (f"DEMO DATA — nightdesk: nightly batch #{night.id} "
                             f"(as of {DEMO_AS_OF}) PARTIAL, 1/2 tickers")
    lines = post["message"].splitlines()
    assert lines[0] == "Status: partial: 1 of 2 tickers succeeded, 1 failed"
    # The night's rate as `nightdesk report` computes it: output over the time its calls ran.
    report = json.loads(run_cli("report", str(night.id), "--format", "json", env=env).stdout)
    # Calls that ran under a second in all (a fast fake server) give no rate, as the report
    # says (``brief``); longer ones give the report's rate.
    duration = re.fullmatch(r"Duration: (.+); output (?:([\d.]+) tok/s \()?(\d+) tokens "
                            r"over (.*) of calls(\)|, too brief for a rate); "
                            r"(\d+) calls \((\d+) attempts, (\d+) failed\)", lines[1])
    assert duration is not None, lines[1]
    if report["brief"]:
        assert duration.group(2) is None and duration.group(4) == "<1 s", lines[1]
    else:
        assert float(duration.group(2)) == round(report["output_tokens_per_s"], 1)
    assert int(duration.group(3)) == report["completion_tokens"] > 0
    # Answered calls apart from the HTTP attempts, as the report counts them.
    assert [int(duration.group(i)) for i in (6, 7, 8)] == [
        report["calls"], report["attempts"], report["failed_attempts"]]
    assert f"Top 1: 1. {good} Overweight +0.40" in lines
    assert f"Rating changes since {before} (batch #{previous}): 2" in lines
    assert f"  {good}: Hold → Overweight (+0.00 → +0.40, +0.40) upgrade; " \
           "node outputs not stored for one of the nights" in lines
    assert any(line.startswith(f"  {bad}: dropped, was Buy") for line in lines)
    assert "Failed (1):" in lines
    # One line per distinct reason, its ticker named (the "Failed" heading gives the status).
    [failure] = [line for line in lines if line.startswith(f"  {bad}: ") and "dropped" not in line]
    assert "prompt rejected" in failure
    assert lines[-1] == ("Page: https://desk.example.org/ "
                         f"(this batch: https://desk.example.org/batches/{night.id})")

    # The same night, scraped: /metrics reads what the night stored.
    settings = load_settings(database_url=pg_digest_url, schedule_timezone="UTC")
    with TestClient(create_app(engine, Guard("u", "p"), RerunQueue(), stale_after_s=120.0,
                               settings=settings)) as client:
        text = client.get("/metrics", auth=("u", "p")).text
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for family in text_string_to_metric_families(text) for s in family.samples}
    assert got[("nightdesk_night_tickers", (("status", "succeeded"),))] == 1
    assert got[("nightdesk_night_tickers", (("status", "failed"),))] == 1
    # The rate gauge is left out where the report finds the calls too brief for one.
    assert got.get(("nightdesk_night_output_tokens_per_second", ())) == (
        None if report["brief"] else pytest.approx(report["output_tokens_per_s"]))
    # Night 1 (the rows) succeeded; tonight was partial.
    with engine.connect() as conn:
        first_end = conn.execute(select(Batch.finished_at).where(Batch.id == previous)).scalar()
    assert got[("nightdesk_night_last_success_timestamp_seconds", ())] == first_end.timestamp()
