"""A process a test session starts with ``tied.popen`` ends with the session, however the
session ends: pytest killed by SIGKILL runs no teardown, and before, the web server, the
scheduler daemon, the fault server and the batches the integration tests start lived on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
# A stand-in for the session: it starts a long sleep through popen, says its pid, waits.
SESSION = ("import sys, time\n"
           "from tests.integration.tied import popen\n"
           "child = popen(['sleep', '300'])\n"
           "print(child.pid, flush=True)\n"
           "time.sleep(300)\n")


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_process_started_with_popen_ends_when_its_session_is_killed() -> None:
    session = subprocess.Popen([sys.executable, "-c", SESSION], cwd=ROOT, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)},
                               stdout=subprocess.PIPE)
    assert session.stdout is not None
    child = int(session.stdout.readline())
    try:
        time.sleep(1.0)  # the watcher is up
        assert _running(child)
        session.send_signal(signal.SIGKILL)  # no teardown runs
        session.wait(10)
        deadline = time.monotonic() + 15
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(child), "the process outlived its session"
    finally:
        if _running(child):
            os.kill(child, signal.SIGKILL)
