"""Drive the launcher with fake server commands: a crash at start-up, a deadline, a clean stop,
and a test session's server ending with the session however it is killed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from serving import launcher
from serving.errors import ServerError
from serving.facts import read_server_facts
from serving.profiles import ServerCommand, load_profile
from tests.unit.support.health_server import health_server, python_command
from tests.webhook import closed_port

PROFILE = load_profile("cpu-tiny")


def test_server_that_dies_during_startup_raises_with_its_last_log_lines(tmp_path: Path) -> None:
    fake = python_command("""
        import sys
        for i in range(40):
            print(f"INFO loading step {i}")
        print("RuntimeError: Engine core initialization failed", file=sys.stderr)
        sys.exit(3)
    """)
    with pytest.raises(ServerError) as caught:
        launcher.start(PROFILE, port=closed_port(), state_dir=tmp_path, command=fake,
                       timeout_s=30)
    message = str(caught.value)
    assert "exited with code 3" in message
    assert "Engine core initialization failed" in message
    assert "loading step 39" in message
    assert "loading step 0\n" not in message  # only the tail
    assert not (tmp_path / "cpu-tiny.pid").exists()


@pytest.mark.slow
def test_server_that_never_gets_healthy_is_stopped_at_the_deadline(tmp_path: Path) -> None:
    fake = python_command("""
        import time
        print("INFO still warming up", flush=True)
        time.sleep(600)
    """)
    seen: list[str] = []
    with pytest.raises(ServerError, match="not healthy after 2s") as caught:
        launcher.start(PROFILE, port=closed_port(), state_dir=tmp_path, command=fake,
                       timeout_s=2, progress=lambda _s, line: seen.append(line))
    assert "still warming up" in str(caught.value)
    assert "INFO still warming up" in seen
    assert not launcher.status(PROFILE, state_dir=tmp_path).alive


def test_fake_server_starts_records_facts_and_stops(tmp_path: Path) -> None:
    port = closed_port()
    fake = health_server(port, 'print("INFO Model loading took 0.25 GiB and 1.5 seconds", '
                               'flush=True); print("INFO Maximum concurrency for 8,192 tokens '
                               'per request: 5.69x", flush=True)')
    facts = launcher.start(PROFILE, port=port, state_dir=tmp_path, command=fake, timeout_s=30)
    try:
        assert facts["weights_gib"] == 0.25
        assert facts["max_concurrency"] == 5.69
        assert facts["max_concurrency_at_tokens"] == 8192
        assert read_server_facts("cpu-tiny", tmp_path)["pid"] == facts["pid"]
        state = launcher.status(PROFILE, port=port, state_dir=tmp_path)
        assert state.alive and state.healthy
        again = launcher.start(PROFILE, port=port, state_dir=tmp_path, command=fake)
        assert again["already_running"] is True
    finally:
        assert launcher.stop(PROFILE, state_dir=tmp_path, timeout_s=10) is True
    state = launcher.status(PROFILE, port=port, state_dir=tmp_path)
    assert not state.alive and not state.healthy
    assert launcher.stop(PROFILE, state_dir=tmp_path) is False


def test_stop_kills_a_server_that_ignores_sigterm(tmp_path: Path) -> None:
    port = closed_port()
    fake = python_command(f"""
        import http.server, signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

        class Health(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        http.server.HTTPServer(("127.0.0.1", {port}), Health).serve_forever()
    """)
    launcher.start(PROFILE, port=port, state_dir=tmp_path, command=fake, timeout_s=30)
    assert launcher.stop(PROFILE, state_dir=tmp_path, timeout_s=1) is True
    assert not launcher.status(PROFILE, port=port, state_dir=tmp_path).alive


def test_missing_executable_is_a_server_error(tmp_path: Path) -> None:
    fake = ServerCommand(argv=[str(tmp_path / "no-such-python")], env={})
    with pytest.raises(ServerError, match="cannot run"):
        launcher.start(PROFILE, port=closed_port(), state_dir=tmp_path, command=fake)


def test_api_key_rides_in_the_environment_not_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "stale")
    command = ServerCommand(argv=["x"], env={"VLLM_CPU_KVCACHE_SPACE": "2"})
    env = launcher._child_env(command, "s3cret")
    assert env["VLLM_API_KEY"] == "s3cret"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert "VLLM_API_KEY" not in launcher._child_env(command, "EMPTY")


def test_foreground_becomes_the_server_process_for_a_supervisor() -> None:
    # systemd (Type=exec) watches the pid it started: that pid must be the server itself.
    port = closed_port()
    fake = health_server(port, 'print("key", os.environ.get("VLLM_API_KEY"), flush=True)')
    code = ("from serving import launcher\n"
            "from serving.profiles import ServerCommand, load_profile\n"
            f"launcher.exec_foreground(load_profile('cpu-tiny'), api_key='s3cret',\n"
            f"    command=ServerCommand(argv={fake.argv!r}, env={{}}))\n")
    supervised = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  text=True, cwd=Path(__file__).resolve().parents[3])
    try:
        assert supervised.stdout is not None
        assert supervised.stdout.readline().split() == ["key", "s3cret"]
        waited = launcher.wait_until_healthy(launcher.root_url("127.0.0.1", port), 30, 0.1)
        assert waited < 30
        cmdline = Path(f"/proc/{supervised.pid}/cmdline").read_bytes().split(b"\0")
        assert b"http.server" in cmdline[2]  # the same pid now runs the server's code
    finally:
        supervised.kill()
        supervised.wait()


def test_wait_until_healthy_gives_up_at_its_deadline() -> None:
    root = launcher.root_url("127.0.0.1", closed_port())  # nothing listens
    with pytest.raises(ServerError, match="did not answer within 1s"):
        launcher.wait_until_healthy(root, 1, 0.1)


def test_cli_server_wait_exits_once_healthy() -> None:
    from typer.testing import CliRunner

    from app.cli import app as cli

    port = closed_port()
    server = subprocess.Popen(health_server(port).argv)
    try:
        result = CliRunner().invoke(cli, ["server", "wait", "--port", str(port),
                                          "--timeout", "30"])
        assert result.exit_code == 0, result.output
        assert f"http://127.0.0.1:{port}/health: healthy" in result.output
    finally:
        server.kill()
        server.wait()
    result = CliRunner().invoke(cli, ["server", "wait", "--port", str(port), "--timeout", "1"])
    assert isinstance(result.exception, ServerError)


# --- a test session's server ends with the session (tests/integration/tied.py) --------------
# The integration fixture starts the CPU server detached, as `nightdesk server start` does;
# pytest killed by SIGTERM or SIGKILL runs no teardown, and the server (minutes of CPU, a
# port) was left running. Here a session stand-in starts a fake server through the
# fixture's own ``started`` and is killed; the server and what it started must end.

SESSION = """
import pathlib, sys, time
from serving.profiles import load_profile
from tests.integration.vllm_server import started
from tests.unit.support.health_server import health_server

state, engine, ready = map(pathlib.Path, sys.argv[1:4])
spawn = ("import subprocess, sys; open(%r, 'w').write(str(subprocess.Popen("
         "[sys.executable, '-c', 'import time; time.sleep(600)']).pid))" % str(engine))
with started(load_profile("cpu-tiny"), state, lambda port: health_server(port, spawn)) as up:
    ready.write_text(str(up.facts["pid"]))
    time.sleep(600)
"""


def _running(pid: int) -> bool:
    """Tell whether ``pid`` runs (a zombie no parent reaps has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _wait(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT],
                         ids=["SIGTERM", "SIGKILL", "SIGINT"])
def test_a_test_sessions_server_ends_with_the_session_however_it_is_killed(
        sig: signal.Signals, tmp_path: Path) -> None:
    engine, ready = tmp_path / "engine.pid", tmp_path / "ready"
    session = subprocess.Popen(
        [sys.executable, "-c", SESSION, str(tmp_path / "state"), str(engine), str(ready)],
        cwd=Path(__file__).resolve().parents[3], start_new_session=True)
    server: int | None = None
    try:
        assert _wait(lambda: ready.exists() and engine.exists() and ready.read_text() != ""
                     and engine.read_text() != "", 60), "the fake server did not start"
        server, child = int(ready.read_text()), int(engine.read_text())
        assert _running(server) and _running(child)
        session.send_signal(sig)
        session.wait(30)
        assert _wait(lambda: not _running(server) and not _running(child), 30), (
            f"left running after the session's {sig.name}: "
            f"{[pid for pid in (server, child) if _running(pid)]}")
    finally:
        for pid in (session.pid, server):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        session.wait(10)
