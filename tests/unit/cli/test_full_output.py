"""stdout or stderr on a full disk (``/dev/full``: every write refused with ENOSPC, as a
full disk's file is). stdout is a command's product: it stops with one line on stderr and
exit 74, never a traceback. stderr (a night's log lines) is a view of the work: the night
goes on to its end with every ticker recorded, then exits 74 (a stop's own code, past
success, is kept). Before, the first case ended in a traceback, exit 1 (a failed batch's
code); the second ended exit 1 too, nothing said (the night's rows were not read then).

Real processes (the console script's entry point, a real file), the server a fake in the
child (``tests.integration.slow_night``).
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
OUTPUT_FULL = 74  # app.cli.OUTPUT_FULL, spelt out
TICKERS = demo_tickers(2)

pytestmark = pytest.mark.slow


def _run(argv: list[str], env: dict[str, str], *, full: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with the stream ``full`` ("stdout" or "stderr") on /dev/full."""
    with open("/dev/full", "w") as disk:
        streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, full: disk}
        return subprocess.run(argv, cwd=ROOT, text=True, stdin=subprocess.DEVNULL, timeout=240,
                              env={**os.environ, **QUICK_ENV, **env, "PYTHONPATH": str(ROOT),
                                   "NIGHTDESK_LLM_BASE_URL": "http://127.0.0.1:9/v1"},
                              **streams)  # type: ignore[call-overload]


@pytest.mark.parametrize("argv", [["batches"], ["--help"], ["run", "--help"]],
                         ids=" ".join)
def test_a_commands_output_on_a_full_disk_is_one_line_and_exit_74(
        sqlite_engine: Engine, sqlite_url: str, argv: list[str]) -> None:
    done = _run([sys.executable, "-c", "from app.cli import main; main()", *argv],
                {"NIGHTDESK_DATABASE_URL": sqlite_url}, full="stdout")
    assert done.returncode == OUTPUT_FULL, done.stderr
    assert done.stderr.splitlines() == [
        "error: cannot write the output: No space left on device (its disk is full); "
        "nothing the command records was lost"], done.stderr


def test_a_night_whose_log_is_on_a_full_disk_runs_to_its_end_and_exits_74(
        sqlite_engine: Engine, sqlite_url: str, demo_dir: Path) -> None:
    done = _run([sys.executable, "-m", "tests.integration.slow_night", str(demo_dir),
                 ",".join(TICKERS), "0.05"], {"NIGHTDESK_DATABASE_URL": sqlite_url},
                full="stderr")
    assert done.returncode == OUTPUT_FULL, done.stdout
    with sqlite_engine.connect() as conn:
        batch = conn.execute(select(Batch.status, Batch.tickers_succeeded)).one()
        tickers = dict(conn.execute(select(TickerRun.ticker, TickerRun.status)).all())
    assert tuple(batch) == ("succeeded", len(TICKERS))
    assert tickers == dict.fromkeys(TICKERS, "succeeded")
