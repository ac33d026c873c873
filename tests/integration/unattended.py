"""Run ``nightdesk`` and the fault-injecting server as real processes, to kill them on cue.

A night nobody watches is about processes dying: the LLM server, the batch itself. These
helpers start both as subprocesses (the server: tests/integration/faultserver.py), so a test
can SIGKILL or SIGTERM either one and then read what each side recorded: the server's log of
requests it finished, the batch's rows in its database.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agents.data.demo import DEMO_AS_OF
from tests.integration.tied import popen

ROOT = Path(__file__).resolve().parents[2]
FAULT_SERVER = Path(__file__).with_name("faultserver.py")
NIGHTDESK = [sys.executable, "-c", "from app.cli import main; main()"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(check: Any, timeout_s: float, what: str, every_s: float = 0.1) -> Any:
    """Poll ``check()`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@dataclass
class FaultServer:
    """The fault-injecting server on one port; ``kill`` and ``start`` it as often as needed."""

    folder: Path
    chunk_delay_s: float = 0.05
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.folder / "server-requests.jsonl"

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = popen(
            [sys.executable, str(FAULT_SERVER), "--port", str(self.port),
             "--log", str(self.log_path), "--chunk-delay", str(self.chunk_delay_s)],
            stdout=subprocess.DEVNULL, stderr=(self.folder / "server.err").open("ab"))
        wait_for(self.healthy, 30, "the fault server to answer /health")

    def healthy(self) -> bool:
        try:
            return httpx.get(self.root + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL: requests in flight are cut, nothing is flushed or said goodbye to."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.process = None

    def hold(self, on: bool, *, drop: bool = False) -> None:
        """Hold new chat requests before their first byte (or let them go, or drop them)."""
        httpx.post(self.root + "/_hold", json={"hold": on, "drop": drop},
                   timeout=5).raise_for_status()

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = httpx.get(self.root + "/_state", timeout=5).json()
        return data

    def finished(self) -> list[dict[str, Any]]:
        """Return the server's own record: one entry per request it answered to the end."""
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line]

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None


@contextmanager
def fault_server(folder: Path, **kwargs: Any) -> Iterator[FaultServer]:
    server = FaultServer(folder, **kwargs)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def batch_env(folder: Path, server: FaultServer, database_url: str | None = None,
              **settings: object) -> dict[str, str]:
    """Return a batch process's environment: this test's database, data and server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTDESK_")}
    env.update({
        "NIGHTDESK_DATABASE_URL": database_url or f"sqlite:///{folder}/nightdesk.db",
        "NIGHTDESK_DATA_DIR": str(folder / "data"),
        "NIGHTDESK_LLM_BASE_URL": server.root + "/v1",
        "NIGHTDESK_LLM_MODEL": "fault-model",
        "NIGHTDESK_LOG_FORMAT": "json",
        "NIGHTDESK_METRICS_INTERVAL_S": "0.5",
        "NIGHTDESK_SERVER_PROBE_INTERVAL_S": "0.5",
        "NIGHTDESK_RETRY_BACKOFF_S": "0.2",
        "NIGHTDESK_HEARTBEAT_INTERVAL_S": "1",
        "NIGHTDESK_HEARTBEAT_STALE_S": "3",
        "NIGHTDESK_OUTAGE_BUDGET_S": "120",
        "PYTHONUNBUFFERED": "1",
    })
    env.update({f"NIGHTDESK_{k.upper()}": str(v) for k, v in settings.items()})
    return env


def run_args(folder: Path) -> list[str]:
    """Return ``run`` over the demo universe written under ``folder/data``."""
    universe = folder / "data" / DEMO_AS_OF.isoformat() / "universe.txt"
    return ["run", "--universe", str(universe), "--as-of", DEMO_AS_OF.isoformat()]


def start_batch(folder: Path, env: dict[str, str], *args: str,
                name: str = "batch") -> subprocess.Popen[bytes]:
    """Start ``nightdesk ARGS`` in the background; its output goes to ``folder/name.log``."""
    return popen([*NIGHTDESK, *args], cwd=ROOT, env=env,
                 stdout=(folder / f"{name}.out").open("wb"),
                 stderr=(folder / f"{name}.log").open("wb"))


def run_nightdesk(folder: Path, env: dict[str, str], *args: str, name: str,
                  timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*NIGHTDESK, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout_s)
    (folder / f"{name}.log").write_text(done.stderr)
    return done
