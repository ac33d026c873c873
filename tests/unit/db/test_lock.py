"""Check the nightly single-instance lock: one nightly run at a time, across threads and processes.

The helpers here take an engine, so tests/integration/test_lock_postgres.py runs the same
checks against PostgreSQL's advisory lock.
"""

from __future__ import annotations

import os
import subprocess
import time
from datetime import date
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select
from typer.testing import CliRunner

from agents.data.demo import demo_tickers
from app.batch import store
from app.cli import app as cli
from app.config import load_settings
from app.db.batchsettings import BatchSettings
from app.db.lock import lock_file_path, nightly_lock
from app.db.models import Batch, LLMCall
from app.db.runner import Runner, _stat
from tests.unit.support.engines import batch_count, fake_llm
from tests.unit.support.lock_checks import (
    NIGHTDESK,
    check_lock_dies_with_its_holder,
    check_race,
    check_second_start_during_a_batch,
)


def test_three_starts_at_once_one_gets_the_lock(sqlite_engine: Engine) -> None:
    check_race(sqlite_engine)


def test_lock_file_sits_beside_the_database(sqlite_url: str) -> None:
    database = Path(sqlite_url.removeprefix("sqlite:///"))
    assert lock_file_path(sqlite_url) == database.with_name(database.name + ".nightly.lock")


def test_lock_file_of_a_uri_url_sits_beside_its_file(tmp_path: Path) -> None:
    # `sqlite:///file:/x/y.db?mode=ro&uri=true` (docs/reliability.md's read-only database):
    # the lock was made under a folder named "file:" in the working directory.
    database = tmp_path / "y.db"
    url = f"sqlite:///file:{database}?mode=ro&uri=true"
    assert lock_file_path(url, "scheduler") == tmp_path / "y.db.scheduler.lock"


def test_a_crashed_holder_leaves_no_stale_lock(sqlite_engine: Engine) -> None:
    check_lock_dies_with_its_holder(sqlite_engine)


def test_second_start_during_a_batch_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                sqlite_engine: Engine, demo_dir: Path) -> None:
    settings = load_settings(check_context_length=False, retry_backoff_s=0, data_dir=demo_dir)
    check_second_start_during_a_batch(monkeypatch, sqlite_engine, settings)


@pytest.mark.slow
def test_cli_run_exits_4_with_one_line_while_another_process_holds_the_lock(
        sqlite_engine: Engine, sqlite_url: str, tmp_path: Path) -> None:
    running = store.create_batch(sqlite_engine, kind="nightly", as_of=date(2026, 11, 27),
                                 tickers=["AAA"], samples=1, settings=BatchSettings(),
                                 server_facts=None)
    env = {**os.environ, "NIGHTDESK_DATABASE_URL": sqlite_url,
           # Nothing listens here: had the run got past the lock, its ticker would fail
           # and write rows, which the counts below would show.
           "NIGHTDESK_LLM_BASE_URL": "http://127.0.0.1:9/v1", "NIGHTDESK_LOG_FORMAT": "json"}
    with nightly_lock(sqlite_engine):  # another process's flock: a separate open file
        result = subprocess.run([str(NIGHTDESK), "run", "--tickers", "AAA,BBB",
                                 "--as-of", "2026-11-27"], env=env, capture_output=True,
                                text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 4, result.stderr
    assert result.stderr.strip().splitlines() == [f"error: already running: batch {running}"]
    assert batch_count(sqlite_engine) == 1
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(LLMCall)).scalar() == 0


def test_rerun_does_not_take_the_nightly_lock(monkeypatch: pytest.MonkeyPatch,
                                              sqlite_engine: Engine, demo_dir: Path) -> None:
    ticker = demo_tickers(1)[0]
    server = fake_llm(monkeypatch, tickers=[ticker])
    monkeypatch.setenv("NIGHTDESK_CHECK_CONTEXT_LENGTH", "false")
    with nightly_lock(sqlite_engine):
        result = CliRunner().invoke(cli, ["rerun", ticker, "--no-preflight"])
    assert result.exit_code == 0, result.output
    with sqlite_engine.connect() as conn:
        kinds = conn.execute(select(Batch.kind, Batch.status)).all()
    assert [tuple(k) for k in kinds] == [("rerun", "succeeded")]
    assert len(server.chats) == 17


def test_a_runner_is_gone_once_its_pid_is_another_process_or_a_zombie() -> None:
    # A batch row names its runner by pid and start time: a pid reused by a later process is
    # not the runner (without the start time, a reboot's or a long night's reuse reads alive),
    # and a process that died unreaped is dead.
    me = Runner.current()
    child = subprocess.Popen(["sleep", "60"])
    try:
        stat = _stat(child.pid)
        assert stat is not None and me.pidns is not None
        runner = Runner(host=me.host, pid=child.pid, started=stat[1], pidns=me.pidns)
        assert runner.alive() is True
        assert runner.model_copy(update={"started": stat[1] + 1}).alive() is False
        child.kill()  # not reaped yet: a zombie with the same pid and start time
        for _ in range(500):
            if (_stat(child.pid) or ("", 0))[0] == "Z":
                break
            time.sleep(0.01)
        assert runner.alive() is False
    finally:
        child.kill()
        child.wait()
