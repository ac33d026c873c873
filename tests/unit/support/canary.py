"""A night whose every secret is one canary string, and the database cells to search for it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import MetaData

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from agents.graph import node_names
from app.batch.engine import BatchEngine
from app.config import load_settings
from app.db.engine import get_engine
from app.web.reruns import RerunQueue
from tests.fakevllm import ChatRequest, FakeServer, FakeServers, Reply
from tests.unit.support.clirun import CliResult, run_cli
from tests.unit.support.webclient import AUTH, web_client
from tests.webhook import closed_port

CANARY = "Cnry-9f3e1c-pw"


def database_cells(url: str) -> Cells:
    """Return every cell of every table the database at ``url`` holds (any backend)."""
    engine = get_engine(url)
    meta = MetaData()
    meta.reflect(engine)
    cells: Cells = []
    with engine.connect() as conn:
        for table in meta.sorted_tables:
            for row in conn.execute(table.select()):
                cells += [(table.name, column, value)
                          for column, value in row._mapping.items()]
    return cells


def run_night_with_a_canary(monkeypatch: pytest.MonkeyPatch, home: Path, database_url: str,
                            cells: Callable[[], Cells], names: tuple[str, ...] = ("a", "b"),
                            ) -> None:
    """Run, fail, resume and read back a night whose URLs carry CANARY; find it nowhere.

    ``names`` name the endpoints (``fake-a.test``...): one server, or several that fail over.
    """
    tickers = demo_tickers(3)
    write_demo(home / "data", DEMO_AS_OF, 3)
    urls = [f"http://nd:{CANARY}@fake-{name}.test/v1" for name in names]
    servers: dict[str, FakeServer] = {}
    chats = 0

    def script(chat: ChatRequest) -> Reply | None:
        nonlocal chats
        chats += 1
        if chats == 10:
            # Both servers go away: refused calls, failed probes, an outage past its budget.
            for server in servers.values():
                server.crash()
        return None

    servers.update({url: FakeServer(script, nodes=NODES, tickers=tickers) for url in urls})
    fakes = FakeServers(servers)
    original = BatchEngine.__init__

    def with_fake(self: BatchEngine, *args: object, **kwargs: object) -> None:
        kwargs.update(http_client=fakes.client())
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(BatchEngine, "__init__", with_fake)
    env = {"NIGHTDESK_LLM_BASE_URL": ",".join(urls), "NIGHTDESK_DATABASE_URL": database_url,
           "NIGHTDESK_LOG_FORMAT": "json", "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false",
           "NIGHTDESK_RETRY_BACKOFF_S": "0.01", "NIGHTDESK_OUTAGE_BUDGET_S": "0.5",
           "NIGHTDESK_SERVER_PROBE_INTERVAL_S": "0.05", "NIGHTDESK_METRICS_INTERVAL_S": "0.1"}
    said: list[tuple[str, CliResult]] = []

    def cli(*argv: str, **extra: str) -> CliResult:
        result = run_cli(*argv, env={**env, **extra})
        said.append((" ".join(argv), result))
        assert "Traceback" not in result.stderr, result.stderr
        return result

    night = cli("run", "--tickers", ",".join(tickers), "--no-preflight")
    assert night.code == 5, night.stderr  # the outage outlasted its budget
    for server in servers.values():
        server.revive()
    resumed = cli("run", "--resume", "--no-preflight")
    assert resumed.code == 0, resumed.stderr
    # The preflight of a run, and `nightdesk preflight`, against a server that is not there.
    dead = f"http://nd:{CANARY}@127.0.0.1:{closed_port()}/v1"
    refused = cli("run", "--tickers", tickers[0], NIGHTDESK_LLM_BASE_URL=dead)
    assert refused.code == 2 and "cannot reach http://nd:***@127.0.0.1" in refused.stderr
    cli("preflight", NIGHTDESK_LLM_BASE_URL=dead)
    # A database that cannot be reached is named in its one line, without its password.
    unreachable = cli("report", NIGHTDESK_DATABASE_URL=f"postgresql://nd:{CANARY}@127.0.0.1:"
                                                     f"{closed_port()}/nightdesk")
    assert unreachable.code == 2 and "cannot reach database" in unreachable.stderr
    cli("report")
    report = cli("report", "--format", "json")
    assert report.code == 0 and "http://nd:***@fake-a.test/v1" in report.stdout, report.stdout
    cli("ranking", "--format", "json")
    for command, result in said:
        assert not holds_canary(result.stdout), f"`{command}` printed it:\n{result.stdout}"
        assert not holds_canary(result.stderr), f"`{command}` said it:\n{result.stderr}"
    # The URLs were there to leak: the night's lines name the endpoints, masked.
    assert f"nd:***@fake-{names[-1]}.test" in night.stderr

    stored = cells()
    leaked = sorted({(table, column) for table, column, value in stored if holds_canary(value)})
    assert not leaked, f"stored in {leaked}"
    # The calls' rows, the sampler's and the batch's settings name the endpoints, masked.
    # (A call refused after the crash names it in its error too; the held gate of a server
    # that is down keeps most back, so whether one was refused is the race's.)
    named = {(table, column) for table, column, value in stored
             if "nd:***@fake-a.test" in str(value)}
    expected = {("llm_calls", "endpoint"), ("server_samples", "endpoint"), ("batches", "settings")}
    assert expected <= named, named

    engine = get_engine(database_url)
    with web_client(engine, reruns=RerunQueue(command=lambda job: ["true"])) as client:
        batches = client.get("/api/batches", auth=AUTH).json()
        ids = [str(b["id"]) for b in batches]
        assert ids  # the night is listed
        for path in ["/", "/batches", "/api/batches", "/api/ranking", f"/ticker/{tickers[0]}",
                     f"/api/tickers/{tickers[0]}",
                     *(f"/batches/{i}" for i in ids), *(f"/api/batches/{i}" for i in ids)]:
            page = client.get(path, auth=AUTH)
            assert page.status_code == 200, path
            assert not holds_canary(page.text), path


NODES = node_names(load_settings().pipeline())


Cells = list[tuple[str, str, object]]  # (table, column, value)


def holds_canary(value: object) -> bool:
    if isinstance(value, bytes | bytearray | memoryview):
        return CANARY.encode() in bytes(value)
    return CANARY in str(value)
