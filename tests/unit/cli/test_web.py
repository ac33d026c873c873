"""Start ``nightdesk web`` as an operator would: refusals in one line, then a real server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.webhook import closed_port


def nightdesk(*args: str, env: dict[str, str] | None = None, **kwargs: object
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})},
                          **kwargs)  # type: ignore[call-overload]


@pytest.mark.slow
def test_refuses_to_start_without_a_password() -> None:
    result = nightdesk("web")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "NIGHTDESK_WEB_PASSWORD is not set" in lines[0]
    assert "--local-only" in lines[0]


@pytest.mark.slow
def test_refuses_the_example_environment_files_password() -> None:
    # deploy/nightdesk.env.example installed and not edited: a password the repository shows.
    example = Path(__file__).resolve().parents[3] / "deploy" / "nightdesk.env.example"
    [line] = [x for x in example.read_text().splitlines()
              if x.startswith("NIGHTDESK_WEB_PASSWORD=")]
    result = nightdesk("web", env={"NIGHTDESK_WEB_PASSWORD": line.split("=", 1)[1]})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "example environment file" in lines[0], lines


@pytest.mark.slow
def test_local_only_refuses_a_public_address() -> None:
    result = nightdesk("web", "--local-only", "--host", "0.0.0.0")
    assert result.returncode == 2
    assert "only on a loopback address" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_serves_with_basic_auth_and_stops_cleanly() -> None:
    port = closed_port()
    args = [sys.executable, "-m", "app.cli", "web", "--port", str(port)]
    env = {**os.environ, "NIGHTDESK_WEB_USER": "op", "NIGHTDESK_WEB_PASSWORD": "pw"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(f"{base}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "nightdesk web did not come up"
                time.sleep(0.2)
        assert health.json() == {"status": "ok", "database": "ok"}
        assert httpx.get(f"{base}/api/ranking", timeout=10).status_code == 401
        assert httpx.get(f"{base}/api/ranking", auth=("op", "pw"),
                         timeout=10).status_code == 200
        assert httpx.get(f"{base}/static/table.js", timeout=10).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    # uvicorn shuts down cleanly (the lifespan, and so the rerun queue, included), then
    # re-raises the signal, so the exit status says "ended by SIGTERM" as systemd expects.
    assert proc.returncode == -signal.SIGTERM
    assert "Application shutdown complete." in output


def test_a_port_already_taken_is_one_line_and_exit_2(sqlite_engine: object) -> None:
    # uvicorn alone logs its own lines and exits 3, which nightdesk's codes read as "partial".
    from tests.unit.support.clirun import run_cli

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("web", "--local-only", "--port", str(port))
    assert result.code == 2, (result.code, result.stderr)
    [line] = result.error_lines
    assert line.startswith(f"error: --port {port}: cannot listen on 127.0.0.1:{port} ("), line


@pytest.mark.slow
def test_the_web_journal_is_nightdesks_lines_without_uvicorns_prefix() -> None:
    # uvicorn's own logging config printed `INFO:     127.0.0.1:… - "GET / HTTP/1.1" 200`
    # beside nightdesk's JSON lines: a library prefix in the web unit's journal.
    port = closed_port()
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "web", "--local-only",
                             "--port", str(port)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).is_success
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    # The command's own lines (a note, where it serves), then the log's, each JSON.
    logged = [line for line in stderr.splitlines()
              if not line.startswith(("note: ", "nightdesk web on "))]
    lines = [json.loads(line) for line in logged]
    assert any(line.get("logger") == "uvicorn.access" and "GET /healthz" in line["event"]
               for line in lines), lines
