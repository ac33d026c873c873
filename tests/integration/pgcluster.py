"""Start a private PostgreSQL cluster for one test, to restart it while a night runs.

Restarting the machine's own server would break every other test using it, so a test that
needs a real restart (every backend gone, every advisory lock let go, the server's start
time new) gets a cluster of its own: ``initdb`` in a temporary folder, one port, trust auth,
stopped when the test ends. As root the server runs as the ``postgres`` user (it refuses
root).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.unattended import free_port


def _bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(
        f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        pytest.fail(f"{name} (PostgreSQL's server binaries) is required for this test")
    return found


@dataclass
class Cluster:
    """A running private cluster: ``url`` for nightdesk, ``restart`` on cue."""

    folder: Path
    port: int

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        command = [_bin("pg_ctl"), "-D", str(self.data), "-w", "-t", "60", *args]
        subprocess.run(_as_owner(command), check=True, capture_output=True, timeout=90)

    def start(self) -> None:
        self._ctl("-l", str(self.folder / "server.log"), "-o",
                  f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1", "start")

    def restart(self) -> None:
        """Stop the server fast (every backend ends, every lock goes) and start it again."""
        self._ctl("-m", "fast", "stop")
        self.start()

    def stop(self) -> None:
        self._ctl("-m", "immediate", "stop")


def _as_owner(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextmanager
def private_cluster() -> Iterator[Cluster]:
    """Create, start and finally remove a cluster in a folder of its own."""
    # Not under pytest's tmp_path: its parents are private to root, and the server runs as
    # the postgres user.
    folder = Path(tempfile.mkdtemp(prefix="nightdesk-pg-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
        os.chmod(folder, 0o755)
    cluster = Cluster(folder, free_port())
    subprocess.run(_as_owner([_bin("initdb"), "-D", str(cluster.data), "-U", "postgres",
                              "--auth=trust", "--no-sync"]),
                   check=True, capture_output=True, timeout=120)
    cluster.start()
    try:
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
