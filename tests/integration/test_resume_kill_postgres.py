"""Kill the batch process inside LangGraph's checkpoint write window, then resume it, on the
real PostgreSQL (checkpoints in the saver's tables of the batch's own database)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from app.db.engine import get_engine
from tests.integration.conftest import private_database
from tests.unit.support.killwindow import KILLS, check_resumed, kill_then_resume

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("kill", KILLS)
def test_a_kill_in_the_checkpoint_write_window_resumes_every_ticker_on_postgres(
        kill: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A database of its own per kill: the resume finds the one batch the killed run left.
    name = f"nightdesk_kill_{os.getpid()}_{kill.replace(':', '_')}"
    with private_database(name, upgraded=True) as url:
        write_demo(tmp_path / "data", DEMO_AS_OF, 2)
        tickers = demo_tickers(2)
        resumed = kill_then_resume(url, get_engine(url), tmp_path / "data", tmp_path, tickers,
                                   kill, monkeypatch)
        check_resumed(resumed, tickers, kill)
