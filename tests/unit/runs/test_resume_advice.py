"""The advice a stopped night gives names the command that continues it, and that command
works: a night stopped by an HTTP 404 (the model gone from the server), resumed with the
real CLI on SQLite against the fake server."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from app.db.models import Batch, TickerRun
from tests.fakevllm import FakeServer
from tests.fakevllm.chat import ChatRequest, Reply
from tests.unit.support.clirun import run_cli
from tests.unit.support.fault_night import NODES, QUICK_ENV, serve_cli_from


@pytest.fixture
def demo_dir(tmp_path: Path) -> Path:
    write_demo(tmp_path / "data", DEMO_AS_OF, 3)
    return tmp_path / "data"


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, sqlite_url: str, sqlite_engine: Engine,
            demo_dir: Path) -> None:
    for key, value in {**QUICK_ENV, "NIGHTDESK_DATABASE_URL": sqlite_url,
                       "NIGHTDESK_DATA_DIR": str(demo_dir)}.items():
        monkeypatch.setenv(key, value)


def model_gone_after(answers: int) -> object:
    """A server script: ``answers`` chat answers, then 404 as a server that no longer serves
    the model says."""
    seen = [0]

    def script(chat: ChatRequest) -> Reply | None:
        seen[0] += 1
        if seen[0] > answers:
            return Reply(status=404, error="The model `fake-model` does not exist.")
        return None

    return script


def test_a_night_stopped_by_a_404_names_its_resume_and_the_resume_finishes_it(
        cli_env: None, sqlite_engine: Engine, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    tickers = demo_tickers(3)
    first = FakeServer(model_gone_after(20), nodes=NODES, tickers=tickers)
    serve_cli_from(monkeypatch, first, demo_dir)
    stopped = run_cli("run", "--tickers", ",".join(tickers), "--no-preflight")
    assert stopped.code == 2, stopped.stderr
    said = stopped.error_lines[-1]
    assert said.startswith("error: batch 1 failed: "), stopped.stderr
    assert "does not exist" in said and "`nightdesk run --resume 1`" in said, said
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.status)).scalar_one() == "failed"
        assert "interrupted" in set(conn.execute(select(TickerRun.status)).scalars())

    # The advised command, once the server serves the model again, finishes the night.
    serve_cli_from(monkeypatch, FakeServer(nodes=NODES, tickers=tickers), demo_dir)
    resumed = run_cli("run", "--resume", "1", "--no-preflight")
    assert resumed.code == 0, resumed.stderr
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.status)).scalar_one() == "succeeded"
