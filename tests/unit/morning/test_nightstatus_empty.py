"""A database with no night at all says so plainly, on every surface, and what to run.

A new install (or a NIGHTDESK_HOME pointing at another database) has no nightly batch. Every
surface said something else: the page's banner "Not the latest night." over "stale: …",
`nightdesk ranking`, `changes`, `report` and `batches` "run `nightdesk run` first" (which
refuses without a snapshot), `run --resume` "every interrupted … batch has finished all its
tickers" of none. Now each says "no night has run yet" and gives the first-night advice,
and that advice, run in order, is accepted and makes the first night.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from agents.data.demo import demo_tickers
from app.config import get_settings
from app.morning.nightstatus import night_status
from tests.fakevllm import FakeServer
from tests.unit.support.clirun import run_cli
from tests.unit.support.fault_night import NODES, QUICK_ENV, serve_cli_from
from tests.unit.support.webclient import AUTH

UTC_ENV = {"NIGHTDESK_SCHEDULE_TIMEZONE": "UTC"}
NO_NIGHT = "no night has run yet"


def said_nothing_untrue(text: str) -> None:
    assert "Not the latest night" not in text and "not the latest night" not in text, text
    assert "stale" not in text and "has finished all its tickers" not in text, text


@pytest.fixture
def env(sqlite_url: str, sqlite_engine: Engine) -> dict[str, str]:
    """The CLI's settings on this test's migrated (empty) database, no snapshot yet."""
    return {**QUICK_ENV, **UTC_ENV, "NIGHTDESK_DATABASE_URL": sqlite_url}


def test_every_cli_surface_says_no_night_and_its_advice_runs(
        env: dict[str, str], sqlite_engine: Engine, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for argv in (["ranking"], ["changes"], ["report"], ["run", "--resume"],
                 ["quality", "track"]):
        result = run_cli(*argv, env=env)
        assert result.code == 2, (argv, result.stderr)
        [line] = result.error_lines
        assert f"; {NO_NIGHT}; next: `nightdesk data demo` (" in line, (argv, line)
        said_nothing_untrue(line)
    fresh = run_cli("ranking", "--require-fresh", env=env)
    assert fresh.code == 6 and fresh.stderr.splitlines()[0] == f"no night yet: {NO_NIGHT}"
    said_nothing_untrue(fresh.stderr)
    listed = run_cli("batches", env=env)
    assert listed.code == 0 and f"no batches recorded yet; {NO_NIGHT}" in listed.stderr
    # The advice, each command run as given: the snapshot, then the first night.
    with monkeypatch.context() as patch:
        patch.setenv("NIGHTDESK_DATABASE_URL", env["NIGHTDESK_DATABASE_URL"])
        get_settings.cache_clear()
        steps = [step.command for step in
                 night_status(sqlite_engine, get_settings(), None).advice]
        get_settings.cache_clear()
    assert steps == ["nightdesk data demo", "nightdesk run"]
    assert run_cli(*steps[0].split()[1:], env=env).code == 0
    serve_cli_from(monkeypatch, FakeServer(nodes=NODES, tickers=demo_tickers()),
                   tmp_path / "data")
    first = run_cli(*steps[1].split()[1:], "--no-preflight", env=env)
    assert first.code == 0, first.stderr
    ranked = run_cli("ranking", "--require-fresh", env=env)
    assert ranked.code == 0 and "night: nightly batch #1" in ranked.stderr, ranked.stderr


def test_with_a_snapshot_the_advice_is_the_first_night_alone(
        env: dict[str, str], demo_dir: Path) -> None:
    result = run_cli("ranking", env=env)
    assert result.error_lines[0].endswith(
        f"; {NO_NIGHT}; next: `nightdesk run` (runs the first night)"), result.stderr


def test_every_page_says_no_night_and_its_advice(client: TestClient) -> None:
    page = client.get("/", auth=AUTH).text
    assert "<strong>No night yet.</strong> no night has run yet" in page
    assert "<code>nightdesk data demo</code>" in page and "<code>nightdesk run</code>" in page
    assert "`" not in page.split('id="banner"')[1].split("</div>")[0]  # no literal backticks
    said_nothing_untrue(page.split("<main")[1])
    batches = client.get("/batches", auth=AUTH).text
    assert "No batches recorded yet: no night has run yet." in batches
    assert "<code>nightdesk data demo</code>" in batches
    night = client.get("/api/ranking", auth=AUTH).json()["night"]
    assert (night["status"], night["reason"], night["fresh"]) == ("none", NO_NIGHT, False)
    assert [a["command"] for a in night["advice"]] == ["nightdesk data demo", "nightdesk run"]
    assert client.get("/api/batches", auth=AUTH).json() == []
    metrics = client.get("/metrics", auth=AUTH).text
    assert 'nightdesk_night_last_status{status="none"} 1.0' in metrics
    assert 'nightdesk_night_last_status{status="stale"} 0.0' in metrics


def test_a_first_night_refused_is_named_beside_no_night(
        env: dict[str, str], sqlite_engine: Engine) -> None:
    # No snapshot: the first `run --continue-night` is refused; the morning names why.
    assert run_cli("run", "--continue-night", env=env).code == 2
    result = run_cli("ranking", "--require-fresh", env=env)
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"no night yet: {NO_NIGHT}; the night REFUSED at its start"), first
    assert "no snapshot under" in first
