"""A second ``nightdesk scheduler`` on the same database is refused at its start, exit 4.

Two real daemon processes, on PostgreSQL (an advisory lock) and on SQLite (a flock): the
first holds the scheduler lock for its life; the second exits 4 with one line while the
first serves on; once the first has stopped, a new daemon starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.integration.tied import popen
from tests.integration.unattended import NIGHTDESK, ROOT


def daemon_env(database_url: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTDESK_")}
    env.update(NIGHTDESK_DATABASE_URL=database_url, NIGHTDESK_HOME=str(home),
               NIGHTDESK_LOG_FORMAT="json", NIGHTDESK_SCHEDULE_TIMEZONE="UTC",
               NIGHTDESK_HEARTBEAT_INTERVAL_S="1", NIGHTDESK_HEARTBEAT_STALE_S="5",
               PYTHONUNBUFFERED="1")
    return env


def start_daemon(env: dict[str, str]) -> subprocess.Popen[str]:
    """Start ``nightdesk scheduler``; return once it logged "scheduler started"."""
    daemon = popen([*NIGHTDESK, "scheduler"], cwd=ROOT, env=env,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, text=True)
    assert daemon.stderr is not None
    for line in daemon.stderr:
        try:
            event = json.loads(line)["event"]
        except ValueError:  # every line off a terminal is a JSON log line (app/cli/logs.py)
            raise AssertionError(f"the daemon wrote a line that is no JSON: {line!r}") from None
        if event == "scheduler started":
            return daemon
    raise AssertionError(f"the daemon ended before it started: exit {daemon.wait()}")


def stop_daemon(daemon: subprocess.Popen[str]) -> None:
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=60) == 0


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_a_second_scheduler_is_refused_at_its_start(backend: str, tmp_path: Path,
                                                   request: pytest.FixtureRequest) -> None:
    url = (request.getfixturevalue("pg_url") if backend == "postgresql"
           else f"sqlite:///{tmp_path}/nightdesk.db")
    env = daemon_env(url, tmp_path)
    subprocess.run([*NIGHTDESK, "db", "upgrade"], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=300)
    first = start_daemon(env)
    try:
        second = subprocess.run([*NIGHTDESK, "scheduler"], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=300)
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert second.returncode == 4, second.stderr
        assert len(lines) == 1, second.stderr
        assert "already running: another `nightdesk scheduler` serves this database" in lines[0]
        assert f"pid {first.pid}" in lines[0]  # from the first one's heartbeat
        assert first.poll() is None  # the first serves on
    finally:
        stop_daemon(first)
    # Its lock went with it: the next daemon starts.
    stop_daemon(start_daemon(env))
