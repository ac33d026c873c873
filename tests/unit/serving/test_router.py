"""vllm-router as serving.router starts it: a dead server behind it is marked unhealthy soon."""

from __future__ import annotations

import subprocess
import time

import httpx
import pytest

from serving import router
from tests.unit.support.health_server import health_server
from tests.unit.support.router import ROUTER
from tests.webhook import closed_port

# HEALTH_FLAGS give two failed checks 5 s apart, ~10 s; vllm-router's defaults (60 s, three
# failures) take 120-180 s, so a bound between the two tells them apart with room for a
# loaded host.
MARKED_WITHIN_S = 30.0


def _health(front: int) -> dict[str, bool | None]:
    listed = httpx.get(f"http://127.0.0.1:{front}/workers", timeout=2).json()
    return {w["url"]: w.get("is_healthy") for w in listed.get("workers", [])}


@pytest.mark.slow
@pytest.mark.skipif(ROUTER is None, reason="the vllm-router binary is not installed "
                    "(pip install 'nightdesk[router]'; `make setup` does)")
def test_the_router_marks_a_killed_server_unhealthy_within_seconds() -> None:
    ports, front = [closed_port(), closed_port()], closed_port()
    roots = [f"http://127.0.0.1:{port}" for port in ports]
    servers = [subprocess.Popen(health_server(port).argv, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL) for port in ports]
    # Its Prometheus port a free one: the default may be another router's on a shared host.
    command = router.router_command(router.find_binary(), "127.0.0.1", front, roots,
                                    extra=["--prometheus-host", "127.0.0.1",
                                           "--prometheus-port", str(closed_port())])
    front_process = subprocess.Popen(command.argv, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        health: dict[str, bool | None] = {}
        while time.monotonic() < deadline:
            try:
                health = _health(front)
            except (httpx.HTTPError, ValueError):
                health = {}
            if health == dict.fromkeys(roots, True):
                break
            time.sleep(0.2)
        assert health == dict.fromkeys(roots, True), health
        servers[1].kill()
        servers[1].wait()
        killed = time.monotonic()
        while time.monotonic() - killed < MARKED_WITHIN_S:
            health = _health(front)
            if health.get(roots[1]) is False:
                break
            time.sleep(0.5)
        assert health == {roots[0]: True, roots[1]: False}, (
            f"{roots[1]} still listed healthy {MARKED_WITHIN_S:.0f} s after it was killed: "
            f"{health}")
    finally:
        front_process.terminate()
        front_process.wait(timeout=15)
        for server in servers:
            server.kill()
            server.wait()
