"""Run a command that ends with the process that started it: a test session's servers.

``python tied.py PARENT_PID ARGV...``; or ``popen`` (``--watch``), below, for a process the
test itself signals and waits for. A server `nightdesk server start` starts is detached on
purpose (it outlives the command); one a test session starts must not outlive the session,
however it ends. pytest killed by SIGTERM or SIGKILL (a CI run cut mid-integration) runs no
fixture teardown, so this process watches its parent instead and, once it is gone, ends its
whole process group: the server and what the server started (vLLM's engine core), which a
signal to the server alone might leave behind. The group is this process's own (the
launcher starts it with ``start_new_session``), so the launcher's ``stop`` and a test's
``killpg`` of the pid it was given end it the same way.

The parent is watched, not left to ``PR_SET_PDEATHSIG``: that signal follows the thread that
started the process, and servers are started from a pool's threads that end long before the
session does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

WATCH_S = 0.5  # how often the parent is looked for
GRACE_S = 20.0  # vLLM shuts its engine down on SIGTERM within seconds; then SIGKILL


def _others(group: int | None = None) -> bool:
    """Tell whether any process of ``group`` (default: this one's) but this one still runs
    (zombies aside)."""
    group, me = group or os.getpgrp(), os.getpid()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # ended while read
            continue
        if int(stat.parent.name) != me and int(fields[2]) == group and fields[0] != "Z":
            return True
    return False


def _end_group(_signum: int = signal.SIGTERM, _frame: FrameType | None = None) -> None:
    """End the group: SIGTERM, the grace for the server to stop its engine, then SIGKILL."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM reaches us too
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(-1, os.WNOHANG)  # the server, once it has exited
        if not _others():
            sys.exit(0)
        time.sleep(0.1)
    os.killpg(0, signal.SIGKILL)  # what is left of the group, this process last


def popen(argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """Start ``argv`` as ``subprocess.Popen`` does, in a session of its own, and a watcher
    (``--watch``) that ends its whole group once this process is gone however it ended.

    The process is the test's own (its pid, signals and exit code are the command's, unlike
    a server under ``tied.py``, whose pid is this wrapper's); the watcher leaves once the
    group has ended.
    """
    process = subprocess.Popen(argv, start_new_session=True, **kwargs)
    subprocess.Popen([sys.executable, __file__, "--watch", str(os.getpid()), str(process.pid)],
                     start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return process


def _watch(parent: int, group: int) -> int:
    """Wait while ``group`` runs; once ``parent`` is gone, end it as ``_end_group`` does."""
    while _others(group):
        if os.getppid() != parent:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)
            deadline = time.monotonic() + GRACE_S
            while _others(group) and time.monotonic() < deadline:
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
            return 0
        time.sleep(WATCH_S)
    return 0


def main() -> int:
    if sys.argv[1] == "--watch":
        return _watch(int(sys.argv[2]), int(sys.argv[3]))
    parent, argv = int(sys.argv[1]), sys.argv[2:]
    signal.signal(signal.SIGTERM, _end_group)
    server = subprocess.Popen(argv)  # in this process's group
    while (code := server.poll()) is None:
        if os.getppid() != parent:  # the session is gone: so is its server
            _end_group()
        time.sleep(WATCH_S)
    return code


if __name__ == "__main__":
    sys.exit(main())
