"""A ticker's failure is told under its ticker once: its reason does not name the ticker again
(the decision's error began with it, so every view read ``T: T: portfolio manager …``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from agents.data.demo import demo_tickers
from app.db.models import Batch, TickerRun
from tests.fakevllm import ChatRequest, FakeServer, Reply
from tests.unit.support.clirun import run_cli
from tests.unit.support.fault_night import NODES, serve_cli_from

TICKERS = demo_tickers(3)


def no_decision_for_the_second(chat: ChatRequest) -> Reply | None:
    if chat.ticker == TICKERS[1] and chat.structured:
        return Reply("not json at all")
    return None


def test_a_failed_tickers_reason_does_not_name_it_again(
        cli_env: None, sqlite_engine: Engine, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    serve_cli_from(monkeypatch, FakeServer(no_decision_for_the_second, nodes=NODES,
                                           tickers=TICKERS), demo_dir)
    result = run_cli("run", "--tickers", ",".join(TICKERS), "--no-preflight")
    assert result.code == 3, result.stderr
    failed = TICKERS[1]
    [line] = [line for line in result.stderr.splitlines() if line.startswith(f"  {failed}")]
    assert line.startswith(f"  {failed}: portfolio manager gave no valid decision"), line
    with sqlite_engine.connect() as conn:
        stored = conn.execute(select(TickerRun.error)
                              .where(TickerRun.ticker == failed)).scalar_one()
        batch_error = conn.execute(select(Batch.error)).scalar_one()
    assert stored.startswith("portfolio manager gave no valid decision"), stored
    assert batch_error is None or f"{failed}: {failed}" not in batch_error
    report = run_cli("report", "1")
    assert f"{failed}: {failed}" not in report.stdout + report.stderr
