"""`nightdesk run 2>&1 | head -3`: the reader of the night's log lines goes away after three
of them. The night is its database's, not its log's: it goes on to its end with every
ticker recorded, and the process ends quietly with 141, as every other command whose reader
went away (a stop's own code, past success, is kept). Before, the first log line after
`head` left killed the night where it stood: exit 141, its batch left `running` with 0 of
N tickers, for the next command to mark crashed.

Real processes (the console script's entry point, a real pipe), the server a fake in the
child (``tests.integration.slow_night``) or a dead port (127.0.0.1:9).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from agents.data.demo import demo_tickers
from app.db.models import Batch, TickerRun
from tests.unit.support.fault_night import QUICK_ENV

ROOT = Path(__file__).resolve().parents[3]
PIPE_CLOSED = 141  # app.cli.PIPE_CLOSED, spelt out: the shell's status for SIGPIPE
TICKERS = demo_tickers(2)

pytestmark = pytest.mark.slow


def _head_3(argv: list[str], env: dict[str, str]) -> tuple[int, list[str]]:
    """Run ``argv`` with stdout and stderr into one pipe; read three lines and close it, as
    `2>&1 | head -3` does; return the exit status and the lines read."""
    child = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL,
                             env={**os.environ, **QUICK_ENV, **env, "PYTHONPATH": str(ROOT),
                                  "NIGHTDESK_LLM_BASE_URL": "http://127.0.0.1:9/v1"})
    assert child.stdout is not None
    read = [child.stdout.readline().decode() for _ in range(3)]
    child.stdout.close()
    return child.wait(timeout=240), read


def _tickers(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(select(TickerRun.ticker, TickerRun.status)).all())


def test_a_night_whose_log_reader_went_away_runs_to_its_end_and_exits_141(
        sqlite_engine: Engine, sqlite_url: str, demo_dir: Path) -> None:
    code, read = _head_3([sys.executable, "-m", "tests.integration.slow_night", str(demo_dir),
                          ",".join(TICKERS), "0.05"], {"NIGHTDESK_DATABASE_URL": sqlite_url})
    assert all(line.strip() for line in read), read  # three log lines were read
    assert code == PIPE_CLOSED
    with sqlite_engine.connect() as conn:
        batch = conn.execute(select(Batch.status, Batch.tickers_succeeded)).one()
    assert tuple(batch) == ("succeeded", len(TICKERS))
    assert _tickers(sqlite_engine) == dict.fromkeys(TICKERS, "succeeded")


def test_a_night_stopped_by_a_dead_server_after_its_reader_went_stays_resumable(
        sqlite_engine: Engine, sqlite_url: str, demo_dir: Path) -> None:
    # The server on a dead port: the night waits out its outage budget with no reader, then
    # stops as it would with one: interrupted, resumable, its own exit code (5), not 141.
    code, _ = _head_3([sys.executable, "-c", "from app.cli import main; main()", "run",
                       "--tickers", ",".join(TICKERS), "--no-preflight"],
                      {"NIGHTDESK_DATABASE_URL": sqlite_url,
                       "NIGHTDESK_DATA_DIR": str(demo_dir), "NIGHTDESK_OUTAGE_BUDGET_S": "2"})
    assert code == 5
    with sqlite_engine.connect() as conn:
        status = conn.execute(select(Batch.status)).scalar_one()
    assert status == "interrupted"
    assert _tickers(sqlite_engine) == dict.fromkeys(TICKERS, "interrupted")
