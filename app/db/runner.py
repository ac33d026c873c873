"""The process that runs a batch, and whether it still lives: what a batch row records of
its runner (``batches.settings.runner``) and what a start or a view asks of it."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from pydantic import BaseModel


class Runner(BaseModel, frozen=True):
    """The process that runs a batch, as its batch row records it (``BatchSettings.runner``,
    app/db/batchsettings.py)."""

    host: str
    pid: int
    started: int | None  # the process's start time in clock ticks since boot (Linux)
    # Its pid namespace (/proc/self/ns/pid): a pid names the same process only inside it (a
    # container of the same host name, a unit with PrivatePIDs, would see another or none).
    pidns: str | None = None
    # The host's boot as its wall clock read it when the runner recorded itself (``booted``):
    # a later reading on this host that is later still is the wall clock stepped forward.
    booted: float | None = None

    @classmethod
    def current(cls) -> Runner:
        stat = _stat(os.getpid())
        return cls(host=socket.gethostname(), pid=os.getpid(), started=stat and stat[1],
                   pidns=_pid_namespace(), booted=booted())

    def same(self, other: Runner) -> bool:
        """Return whether both name one process (``booted``, a reading, left out)."""
        return self.model_copy(update={"booted": None}) == other.model_copy(
            update={"booted": None})

    def stepped_s(self) -> float:
        """Return how far this host's wall clock has been stepped forward since the runner
        recorded itself, while it lives here (a heartbeat written before the step is that
        much younger than the wall clock says); 0 when not known."""
        if self.booted is None or self.alive() is not True:
            return 0.0
        return max(0.0, booted() - self.booted)

    def lock_name(self, what: str = "nightly") -> str:
        """Return the ``application_name`` of the connection on which this process holds
        the lock ``what`` (PostgreSQL): how a reader of ``pg_locks`` knows the lock's holder
        is the runner a batch row records (``NightlyLockView.holder_active_at``)."""
        return f"nightdesk {what} {self.pid}@{self.host}"[:63]  # NAMEDATALEN - 1

    def alive(self) -> bool | None:
        """Return whether this process still runs; None when it is on another host or in
        another pid namespace (its pid cannot be looked up from here)."""
        if self.host != socket.gethostname() or (self.pidns is not None
                                                 and self.pidns != _pid_namespace()):
            return None
        if self.pid == os.getpid():
            return True
        stat = _stat(self.pid)
        if stat is None:
            if Path("/proc/self/stat").exists():
                return False  # /proc is there and the pid is not: gone
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        state, started = stat
        # A zombie is dead; another start time is another process that reuses the pid.
        return state != "Z" and (self.started is None or started == self.started)


def _stat(pid: int) -> tuple[str, int] | None:
    """Return (state, start time in ticks) of a process from /proc, None when it has none."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = raw[raw.rfind(")") + 2:].split()
    return fields[0], int(fields[19])


def booted() -> float:
    """Return the host's boot as the wall clock reads it now (the boot clock counts on
    through a wall clock's step, and through a suspend)."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
