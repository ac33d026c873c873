"""Kill the batch process inside LangGraph's checkpoint write window, then resume it (SQLite).

The kill is exact (tests/unit/support/killwindow.py): a separate process runs the batch and
ends with ``os._exit(137)`` at a chosen point of a chosen node's checkpoint writes; this
process then resumes the batch with ``resume_recorded``, as ``nightdesk run --resume N`` does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from tests.unit.support.killwindow import KILLS, check_resumed, kill_then_resume


@pytest.mark.slow
@pytest.mark.parametrize("kill", KILLS)
def test_a_kill_in_the_checkpoint_write_window_resumes_every_ticker(
        kill: str, sqlite_url: str, sqlite_engine: Engine, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    tickers = demo_tickers(2)
    resumed = kill_then_resume(sqlite_url, sqlite_engine, tmp_path / "data", tmp_path, tickers,
                               kill, monkeypatch)
    check_resumed(resumed, tickers, kill)
