"""One server per GPU: the plan, the rendered commands, and the pid files of start/status/stop."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from app.cli import app as cli
from app.config import load_settings
from serving import launcher, replicas
from serving.errors import ProfileError
from serving.profiles import ServerCommand, load_profile
from tests.unit.support.clirun import nightdesk
from tests.unit.support.health_server import health_server
from tests.unit.support.router import ROUTER

GPU_PROFILE = load_profile("qwen-dense-27b")


def test_gpus_are_read_from_a_comma_list() -> None:
    assert replicas.parse_gpus("0, 1,3") == ["0", "1", "3"]
    for bad in ("", "0,,1", "gpu0", "0,0", "-1"):
        with pytest.raises(ValueError, match="--gpus"):
            replicas.parse_gpus(bad)


def test_one_replica_per_gpu_on_consecutive_ports() -> None:
    planned = replicas.plan(GPU_PROFILE, ["0", "1"], 8000)
    assert [(r.gpu, r.port, r.key) for r in planned] == [
        ("0", 8000, "qwen-dense-27b-gpu0"), ("1", 8001, "qwen-dense-27b-gpu1")]
    assert replicas.base_urls("127.0.0.1", planned) == (
        "http://127.0.0.1:8000/v1,http://127.0.0.1:8001/v1")
    # The list it prints is one the settings accept as several endpoints.
    settings = load_settings(llm_base_url=replicas.base_urls("127.0.0.1", planned))
    assert settings.llm.urls == ["http://127.0.0.1:8000/v1", "http://127.0.0.1:8001/v1"]
    with pytest.raises(ProfileError, match="past 65535"):
        replicas.plan(GPU_PROFILE, ["0", "1"], 65535)


def test_the_cpu_profile_refuses_gpus() -> None:
    with pytest.raises(ProfileError, match="cpu-tiny runs on the CPU"):
        replicas.plan(load_profile("cpu-tiny"), ["0"], 8000)


def test_cli_start_with_gpus_on_the_cpu_profile_is_one_line_and_exit_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = nightdesk(monkeypatch, capsys, "server", "start", "--profile",
                               "cpu-tiny", "--gpus", "0,1")
    assert code == 2
    assert "--gpus needs a GPU profile" in err and len(err.strip().splitlines()) == 1
    code, _, err = nightdesk(monkeypatch, capsys, "server", "start", "--profile",
                             "qwen-dense-27b", "--gpus", "zero")
    assert code == 2 and "--gpus takes GPU indices" in err


def test_cli_command_renders_one_line_per_gpu() -> None:
    result = CliRunner().invoke(cli, ["server", "command", "--profile", "qwen-dense-27b",
                                      "--port", "9000", "--gpus", "2,3"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("CUDA_VISIBLE_DEVICES=2 ") and "--port 9000" in lines[0]
    assert lines[1].startswith("CUDA_VISIBLE_DEVICES=3 ") and "--port 9001" in lines[1]
    assert all("--served-model-name qwen-dense-27b" in line for line in lines)


def _two_free_ports() -> int:
    for _ in range(50):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two consecutive free ports")


@pytest.mark.slow
def test_cli_start_status_stop_handle_every_replica(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    # The real CLI with a stand-in for vLLM: a health server on the port it was given,
    # announcing the GPU it was shown.
    def fake_render(profile: Any, paths: Any, *, port: int, model: Any = None) -> ServerCommand:
        return health_server(port, 'print("gpu", os.environ["CUDA_VISIBLE_DEVICES"], '
                                    'flush=True)')

    monkeypatch.setattr("app.cli.server.render", fake_render)
    base = _two_free_ports()
    server_dir = load_settings().paths.server_dir
    runner = CliRunner()
    args = ["--profile", "qwen-dense-27b"]
    try:
        started = runner.invoke(cli, ["server", "start", *args, "--port", str(base),
                                      "--gpus", "0,1", "--timeout", "30"])
        assert started.exit_code == 0, started.output
        assert (f"NIGHTDESK_LLM_BASE_URL=http://127.0.0.1:{base}/v1,"
                f"http://127.0.0.1:{base + 1}/v1") in started.output
        for gpu in ("0", "1"):
            key = f"qwen-dense-27b-gpu{gpu}"
            assert (server_dir / f"{key}.pid").read_text().strip().isdigit()
            assert f"gpu {gpu}" in (server_dir / f"{key}.log").read_text()
            assert (server_dir / f"{key}.facts.json").exists()
        assert [r.port for r in replicas.read_manifest("qwen-dense-27b", server_dir)] == [
            base, base + 1]
        status = runner.invoke(cli, ["server", "status", *args])
        assert status.exit_code == 0, status.output
        assert status.output.count("healthy") == 2
        assert "qwen-dense-27b-gpu0: running" in status.output
        assert "qwen-dense-27b-gpu1: running" in status.output
    finally:
        stopped = runner.invoke(cli, ["server", "stop", *args, "--timeout", "10"])
    assert stopped.exit_code == 0, stopped.output
    assert "qwen-dense-27b-gpu0 stopped" in stopped.output
    assert "qwen-dense-27b-gpu1 stopped" in stopped.output
    assert not list(server_dir.glob("*.pid"))
    assert replicas.read_manifest("qwen-dense-27b", server_dir) == []


def test_cli_router_without_gpus_is_one_line_and_exit_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = nightdesk(monkeypatch, capsys, "server", "start", "--profile",
                             "qwen-dense-27b", "--router")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--router starts vllm-router in front of one server per GPU: give --gpus" in err


def test_cli_router_without_the_binary_starts_nothing(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    monkeypatch.setattr("serving.router.shutil.which", lambda *a, **k: None)
    monkeypatch.setenv("NIGHTDESK_LLM_MODEL", "qwen-dense-27b")  # no model warning
    code, _, err = nightdesk(monkeypatch, capsys, "server", "start", "--profile",
                             "qwen-dense-27b", "--gpus", "0,1", "--router")
    assert code != 0 and len(err.strip().splitlines()) == 1
    assert "vllm-router is not installed: pip install 'nightdesk[router]'" in err
    assert not list(load_settings().paths.server_dir.glob("*.pid"))


@pytest.mark.slow
@pytest.mark.skipif(ROUTER is None, reason="the vllm-router binary is not installed "
                    "(pip install 'nightdesk[router]'; `make setup` does)")
def test_cli_start_with_router_puts_vllm_router_in_front_and_stop_stops_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The stand-ins answer /health (all vllm-router checks of a worker); the router is real.
    def fake_render(profile: Any, paths: Any, *, port: int, model: Any = None) -> ServerCommand:
        return health_server(port)

    monkeypatch.setattr("app.cli.server.render", fake_render)
    base = _two_free_ports()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        front = int(sock.getsockname()[1])
    server_dir = load_settings().paths.server_dir
    runner = CliRunner()
    args = ["--profile", "qwen-dense-27b"]
    try:
        started = runner.invoke(cli, ["server", "start", *args, "--port", str(base),
                                      "--gpus", "0,1", "--timeout", "30", "--router",
                                      "--router-port", str(front)])
        assert started.exit_code == 0, started.output
        assert f"NIGHTDESK_LLM_BASE_URL=http://127.0.0.1:{front}/v1" in started.output
        assert f"NIGHTDESK_LLM_BASE_URL=http://127.0.0.1:{base}" not in started.output
        listed = httpx.get(f"http://127.0.0.1:{front}/workers", timeout=5).json()
        assert sorted(w["url"] for w in listed["workers"]) == [
            f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
        assert (server_dir / "qwen-dense-27b-router.pid").read_text().strip().isdigit()
        # status lists the router and, from its /workers, the servers with both verdicts.
        status = runner.invoke(cli, ["server", "status", *args])
        assert status.exit_code == 0, status.output
        assert "qwen-dense-27b-router: running (pid" in status.output
        assert f"http://127.0.0.1:{front}/health: healthy" in status.output
        assert "servers behind it (from its /workers): 2" in status.output
        for port in (base, base + 1):
            assert (f"  http://127.0.0.1:{port}: router says healthy; /health healthy"
                    in status.output), status.output
        # A server gone behind it: said, and the exit is 1.
        gone = int((server_dir / "qwen-dense-27b-gpu1.pid").read_text())
        os.kill(gone, signal.SIGKILL)
        wait_gone = time.monotonic() + 10
        while launcher.healthy(f"http://127.0.0.1:{base + 1}") and time.monotonic() < wait_gone:
            time.sleep(0.1)
        status = runner.invoke(cli, ["server", "status", *args])
        assert status.exit_code == 1, status.output
        # The router's verdict is its own health check's, whichever it is by now.
        assert re.search(rf"  http://127.0.0.1:{base + 1}: router says (un)?healthy; "
                         "/health not answering", status.output), status.output
        assert f"  http://127.0.0.1:{base}: router says healthy; /health healthy" in \
            status.output
    finally:
        stopped = runner.invoke(cli, ["server", "stop", *args, "--timeout", "10"])
    assert stopped.exit_code == 0, stopped.output
    assert "qwen-dense-27b-router stopped" in stopped.output
    assert "qwen-dense-27b-gpu0 stopped" in stopped.output
    assert "qwen-dense-27b-gpu1 was not running" in stopped.output  # killed above
    assert not list(server_dir.glob("*.pid"))
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{front}/workers", timeout=2)


def _stand_in(port: int) -> subprocess.Popen[bytes]:
    """Run a process answering /health 200 (404 elsewhere: no router's /workers) on port."""
    command = health_server(port)
    return subprocess.Popen(command.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def test_status_lists_a_router_run_elsewhere_and_the_servers_the_setting_names(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    front, up, down = _free_ports(3)  # nothing listens on ``down``
    processes = [_stand_in(front), _stand_in(up)]
    try:
        for port in (front, up):
            launcher.wait_until_healthy(f"http://127.0.0.1:{port}", 10, 0.05)
        monkeypatch.setenv("NIGHTDESK_LLM_BASE_URL", f"http://127.0.0.1:{front}/v1")
        monkeypatch.setenv("NIGHTDESK_LLM_ROUTER_SERVERS",
                           f"http://127.0.0.1:{up},http://127.0.0.1:{down}")
        code, out, err = nightdesk(monkeypatch, capsys, "server", "status")
    finally:
        for process in processes:
            process.kill()
            process.wait()
    assert f"router http://127.0.0.1:{front} (NIGHTDESK_LLM_BASE_URL)" in out, out
    assert f"http://127.0.0.1:{front}/health: healthy" in out
    assert "servers behind it (from NIGHTDESK_LLM_ROUTER_SERVERS): 2" in out
    # The stand-in has no /workers: no router's verdict, only each server's /health.
    assert f"  http://127.0.0.1:{up}: /health healthy" in out
    assert f"  http://127.0.0.1:{down}: /health not answering" in out
    assert code == 1 and f"http://127.0.0.1:{down}: /health does not answer" in err


def test_status_of_a_plain_server_lists_no_router(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (port,) = _free_ports(1)
    process = _stand_in(port)
    try:
        launcher.wait_until_healthy(f"http://127.0.0.1:{port}", 10, 0.05)
        monkeypatch.setenv("NIGHTDESK_LLM_BASE_URL", f"http://127.0.0.1:{port}/v1")
        code, out, _ = nightdesk(monkeypatch, capsys, "server", "status")
    finally:
        process.kill()
        process.wait()
    assert code == 0 and f"http://127.0.0.1:{port}/health: healthy" in out
    assert "router" not in out and "behind it" not in out, out
