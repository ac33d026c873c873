"""A night cancelled outright (Ctrl-C pressed until it stops at once) ends with a line that
names its batch and the command that continues it, and that command works; one cancelled
before its batch existed says nothing was recorded. The real CLI on SQLite, the fake server."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from agents.data.demo import demo_tickers
from app.db.models import Batch
from app.runs import nightly
from tests.fakevllm import ChatRequest, FakeServer, Reply
from tests.unit.support.clirun import run_cli
from tests.unit.support.fault_night import NODES, serve_cli_from
from tests.webhook import webhook

TICKERS = demo_tickers(3)


def ctrl_c_three_times(chat: ChatRequest) -> Reply | None:
    """A server script: at the first bull_r1, Ctrl-C three times (the first stops the night
    with its grace, the second cuts the grace, the third cancels it at once)."""
    if chat.node == "bull_r1" and not getattr(ctrl_c_three_times, "sent", False):
        ctrl_c_three_times.sent = True  # type: ignore[attr-defined]
        for _ in range(3):
            os.kill(os.getpid(), signal.SIGINT)
        return Reply("late", delay_s=5)
    return None


def test_a_night_cancelled_outright_names_its_batch_and_the_resume_that_works(
        cli_env: None, sqlite_engine: Engine, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctrl_c_three_times, "sent", False, raising=False)
    serve_cli_from(monkeypatch, FakeServer(ctrl_c_three_times, nodes=NODES, tickers=TICKERS),
                   demo_dir)
    with webhook() as hook:
        cut = run_cli("run", "--tickers", ",".join(TICKERS), "--no-preflight",
                      env={"NIGHTDESK_NOTIFY": hook.url()})
    assert cut.code == 130, cut.stderr
    # Not a silent night: its digest is pushed, with the same advice.
    [post] = hook.posts
    assert "INTERRUPTED" in post["title"], post
    assert "Next: nightdesk run --resume 1 (continues its 3 tickers not finished)" in \
        post["message"].splitlines(), post["message"]
    assert cut.error_lines[-1] == (
        "error: batch 1 interrupted: cancelled at once by the operator before any ticker "
        "finished; `nightdesk run --resume 1` continues its 3 tickers not finished"), cut.stderr
    # The advised command, as given, finishes the night.
    serve_cli_from(monkeypatch, FakeServer(nodes=NODES, tickers=TICKERS), demo_dir)
    resumed = run_cli("run", "--resume", "1", "--no-preflight")
    assert resumed.code == 0, resumed.stderr
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.status)).scalar_one() == "succeeded"


def test_a_night_cancelled_before_its_batch_existed_says_nothing_was_recorded(
        cli_env: None, sqlite_engine: Engine, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    def ctrl_c_in_the_preflight(*args: Any, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # the default handler: KeyboardInterrupt

    monkeypatch.setattr(nightly, "check_start", ctrl_c_in_the_preflight)
    server = FakeServer(nodes=NODES, tickers=TICKERS)
    serve_cli_from(monkeypatch, server, demo_dir)
    cut = run_cli("run", "--tickers", ",".join(TICKERS))
    assert cut.code == 130, cut.stderr
    assert cut.error_lines[-1] == ("error: interrupted before a batch was created or "
                                   "continued: nothing was recorded"), cut.stderr
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Batch)).scalar_one() == 0
    assert server.chats == []


def test_a_replay_cancelled_outright_names_its_batch_and_what_works_for_it(
        cli_env: None, sqlite_engine: Engine, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    serve_cli_from(monkeypatch, FakeServer(nodes=NODES, tickers=TICKERS), demo_dir)
    assert run_cli("run", "--tickers", ",".join(TICKERS), "--no-preflight").code == 0
    monkeypatch.setattr(ctrl_c_three_times, "sent", False, raising=False)
    serve_cli_from(monkeypatch, FakeServer(ctrl_c_three_times, nodes=NODES, tickers=TICKERS),
                   demo_dir)
    cut = run_cli("replay", "--batch", "1", "--no-preflight")
    assert cut.code == 130, cut.stderr
    assert cut.error_lines[-1] == (
        "error: replay batch 2 interrupted: cancelled at once by the operator; a replay does "
        "not resume: `nightdesk report 2` shows what it played, and the same `nightdesk "
        "replay` command plays it again"), cut.stderr
    # Both work as said.
    assert run_cli("report", "2").code == 0
    serve_cli_from(monkeypatch, FakeServer(nodes=NODES, tickers=TICKERS), demo_dir)
    again = run_cli("replay", "--batch", "1", "--no-preflight")
    assert again.code == 0, again.stderr
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.status).where(Batch.id == 3)).scalar_one() \
            == "succeeded"
