"""A night through a real vllm-router (``--policy consistent_hash``) in front of two servers.

Real processes: ``vllm-router`` (the ``nightdesk[router]`` extra), two fault servers
(tests/integration/faultserver.py, each logging the requests it finished) and ``nightdesk
run`` pointed at the router. The router is also given a rate limit, so that it answers some
requests 429 with ``Retry-After`` itself. What must hold (issue 44):

- each server serves at least a quarter of the night's calls;
- at least 90% of each ticker's calls land on one server (the key nightdesk sends);
- the ``llm_calls`` rows that succeeded are exactly the requests the servers logged, each
  matched to its server by the request id the server gave it;
- the router's 429s are waited out as back-pressure: no ticker fails for them.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from agents.data.demo import DEMO_AS_OF, write_demo
from app.db.engine import get_engine, upgrade
from app.db.models import LLMCall, TickerRun
from tests.integration.tied import popen
from tests.integration.unattended import (
    FaultServer,
    batch_env,
    fault_server,
    free_port,
    run_args,
    run_nightdesk,
    start_batch,
    wait_for,
)
from tests.unit.support.router import ROUTER

pytestmark = pytest.mark.integration

# Enough tickers that a consistent hash over two servers gives each a quarter: the ports,
# hashed with the keys, change per run, and 32 keys split worse than 24/8 about once in 500.
TICKERS = 32


@contextmanager
def vllm_router(folder: Path, workers: list[str], *extra: str) -> Iterator[str]:
    """Run vllm-router in front of ``workers``; yield its root URL; stop it after."""
    assert ROUTER is not None
    port, metrics_port = free_port(), free_port()
    root = f"http://127.0.0.1:{port}"
    process = popen(
        [ROUTER, "--host", "127.0.0.1", "--port", str(port), "--policy", "consistent_hash",
         "--worker-urls", *workers, "--prometheus-host", "127.0.0.1",
         "--prometheus-port", str(metrics_port), *extra],
        stdout=subprocess.DEVNULL, stderr=(folder / "router.log").open("wb"))
    try:
        def listing() -> bool:
            try:
                answer = httpx.get(root + "/workers", timeout=1)
            except httpx.HTTPError:
                return False
            return answer.status_code == 200 and answer.json().get("total") == len(workers)

        wait_for(listing, 30, "vllm-router to list its workers")
        yield root
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.skipif(ROUTER is None, reason="the vllm-router binary is not installed "
                    "(pip install 'nightdesk[router]'; `make setup` does)")
def test_a_night_through_vllm_router_spreads_tickers_and_keeps_each_on_one_server(
        tmp_path: Path) -> None:
    write_demo(tmp_path / "data", DEMO_AS_OF, TICKERS)
    with ExitStack() as stack:
        servers: list[FaultServer] = []
        for index in range(2):
            folder = tmp_path / f"gpu{index}"
            folder.mkdir()
            servers.append(stack.enter_context(fault_server(folder, chunk_delay_s=0.01)))
        # At most 2 requests in flight, refilled 1 a second, no queue: the rest get 429.
        router = stack.enter_context(vllm_router(
            tmp_path, [s.root for s in servers], "--max-concurrent-requests", "2",
            "--rate-limit-tokens-per-second", "1", "--queue-size", "0"))
        env = batch_env(tmp_path, servers[0], max_concurrency=12)
        env["NIGHTDESK_LLM_BASE_URL"] = router + "/v1"
        upgrade(env["NIGHTDESK_DATABASE_URL"])
        done = run_nightdesk(tmp_path, env, *run_args(tmp_path), name="night", timeout_s=540)
        assert done.returncode == 0, done.stderr[-3000:]
        logs = [s.finished() for s in servers]

    db = get_engine(env["NIGHTDESK_DATABASE_URL"])
    with db.connect() as conn:
        rows = conn.execute(select(LLMCall.ticker, LLMCall.request_id, LLMCall.status,
                                   LLMCall.http_status, LLMCall.endpoint)).all()
        statuses = Counter(conn.execute(select(TickerRun.status)).scalars())
    assert statuses == {"succeeded": TICKERS}

    # The rows that succeeded are the servers' logs, request for request.
    served_by = {entry["id"]: index for index, log in enumerate(logs) for entry in log}
    assert sum(len(log) for log in logs) == len(served_by)  # no id logged twice
    ok = [row for row in rows if row.status == "ok"]
    assert sorted(row.request_id for row in ok) == sorted(served_by)
    # Each row names the router: vllm-router 0.1.17 sends no header naming the server.
    assert {row.endpoint for row in rows} == {router + "/v1"}

    # Spread: each server a quarter of the calls at least.
    per_server = Counter(served_by[row.request_id] for row in ok)
    assert min(per_server[0], per_server[1]) >= 0.25 * len(ok), per_server
    # Affinity: 90% of each ticker's calls on one server.
    for ticker in {row.ticker for row in ok}:
        where = Counter(served_by[row.request_id] for row in ok if row.ticker == ticker)
        assert max(where.values()) >= 0.9 * sum(where.values()), (ticker, where)

    # The router's own refusals were met and waited out, never a ticker's failure.
    refused = [row for row in rows if row.status == "error"]
    assert refused and {row.http_status for row in refused} == {429}

    # Both servers behind the router were found (its /workers) and read; fault servers
    # publish no cache config, so the fleet's KV capacity is unknown.
    (finished,) = [json.loads(line) for line in (tmp_path / "night.log").read_text().splitlines()
                   if line.startswith("{") and '"batch finished"' in line]
    assert finished["admission"]["behind_router"] == {"servers": 2, "read": 2,
                                                      "kv_tokens": None}


@pytest.mark.skipif(ROUTER is None, reason="the vllm-router binary is not installed "
                    "(pip install 'nightdesk[router]'; `make setup` does)")
def test_a_server_killed_behind_vllm_router_mid_night_loses_no_ticker(tmp_path: Path) -> None:
    tickers = 8
    write_demo(tmp_path / "data", DEMO_AS_OF, tickers)
    with ExitStack() as stack:
        servers: list[FaultServer] = []
        for index in range(2):
            folder = tmp_path / f"gpu{index}"
            folder.mkdir()
            servers.append(stack.enter_context(fault_server(folder, chunk_delay_s=0.05)))
        router = stack.enter_context(vllm_router(
            tmp_path, [s.root for s in servers], "--health-check-interval-secs", "1",
            "--health-failure-threshold", "1"))
        env = batch_env(tmp_path, servers[0])
        env["NIGHTDESK_LLM_BASE_URL"] = router + "/v1"
        upgrade(env["NIGHTDESK_DATABASE_URL"])
        batch = start_batch(tmp_path, env, *run_args(tmp_path))
        try:
            wait_for(lambda: all(len(s.finished()) >= 5 for s in servers), 240,
                     "both servers to answer 5 requests")
            servers[1].kill()
            assert batch.wait(540) == 0, (tmp_path / "batch.log").read_text()[-3000:]
        finally:
            if batch.poll() is None:
                batch.kill()
                batch.wait(10)
        logs = [s.finished() for s in servers]
    db = get_engine(env["NIGHTDESK_DATABASE_URL"])
    with db.connect() as conn:
        statuses = Counter(conn.execute(select(TickerRun.status)).scalars())
        ok = conn.execute(select(LLMCall.ticker, LLMCall.request_id, LLMCall.call_id)
                          .where(LLMCall.status == "ok")).all()
    assert statuses == {"succeeded": tickers}
    # The tickers the killed server had begun were finished on the other one.
    served_by = {entry["id"]: index for index, log in enumerate(logs) for entry in log}
    # The fault server logs an answer after its last byte: SIGKILL in between leaves an
    # answer the client took whole (an ok row) that the killed server never logged. Such
    # rows are the killed server's own (its ids carry its boot), never the survivor's, and
    # no answer is counted twice; every logged answer has its row.
    ids = [row.request_id for row in ok]
    killed_boot = {entry["boot"] for entry in logs[1]}
    assert len(killed_boot) == 1 and len(ids) == len(set(ids)), (killed_boot, ids)
    calls = [row.call_id for row in ok]
    assert len(calls) == len(set(calls)), "a call answered twice"
    unlogged = set(ids) - set(served_by)
    assert set(served_by) <= set(ids), set(served_by) - set(ids)
    assert all(i.startswith(f"chatcmpl-{next(iter(killed_boot))}-") for i in unlogged), unlogged
    served_by |= dict.fromkeys(unlogged, 1)
    begun = {row.ticker for row in ok if served_by[row.request_id] == 1}
    moved = {row.ticker for row in ok if served_by[row.request_id] == 0} & begun
    assert begun and moved == begun, (begun, moved)
