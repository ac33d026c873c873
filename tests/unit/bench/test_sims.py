"""The benches against the fakes run from a checkout as ``python -m tests.bench.*``.

Their flags are fixed (scripts and the notes in docs/lab/ use them), the installed
``nightdesk bench`` has none of them, and each writes its JSON: checked end to end on
SQLite at a tiny size (figures are not judged: not timed tests).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from sqlalchemy import Engine, create_engine, func, select

from app.bench.schedulers import run_bench
from app.bench.workloads import synthetic_workload
from app.cli.bench import app as nightdesk_bench
from app.config import load_settings
from app.db.models import Batch, LLMCall, LLMRequest
from tests.bench import fleet, tracker
from tests.fakevllm import FakeServer, Reply
from tests.unit.support.sims import ROOT, bench


def arm_makespan(result: dict[str, Any]) -> float:
    makespan: float = result["arm"]["makespan_s"]
    return makespan


def options(app: typer.Typer) -> set[str]:
    return {p.name for p in typer.main.get_command(app).params if p.name != "help"}


def test_the_benches_keep_their_flags_and_left_the_installed_command() -> None:
    assert options(tracker.app) == {"calls", "concurrency", "database", "pg_url", "repeats",
                                    "json_out"}
    assert options(fleet.app) == {"tickers", "endpoints", "speedup", "scale", "output_scale",
                                  "kv_tokens", "max_num_seqs", "stream_interval", "strategy",
                                  "database", "pg_url", "port", "server_cpus", "json_out",
                                  "keep_sqlite", "nights", "router_policy", "router_arg",
                                  "program_context", "kill_at", "max_concurrency", "servers",
                                  "vllm_cpu", "before_tickers"}
    installed = {c.name for c in typer.main.get_group(nightdesk_bench).commands.values()}
    assert installed == {"schedulers", "combine", "durability"}


@pytest.mark.slow
def test_the_tracker_bench_writes_its_figures(tmp_path: Path) -> None:
    result = bench("tests.bench.tracker", "--calls", "4", "--concurrency", "2",
                   "--database", "sqlite", "--repeats", "1", tmp_path=tmp_path)
    assert set(result) == {"calls", "concurrency", "repeats", "machine", "date", "arms",
                           "target_ms_per_call"}
    assert set(result["arms"]) == {"baseline", "sqlite"} and result["arms"]["sqlite"]["rows_ok"]


@pytest.mark.slow
def test_the_fleet_bench_serves_its_endpoints_and_writes_its_figures(tmp_path: Path) -> None:
    # The endpoints on free ports the system gives (the default): none taken by another run.
    result = bench("tests.bench.fleet", "--tickers", "2", "--endpoints", "2", "--speedup", "20",
                   "--output-scale", "0.05", "--database", "sqlite", tmp_path=tmp_path)
    assert set(result) == {"tickers", "endpoints", "gpu", "workload", "arm", "loop_lag",
                           "process", "rows_per_s", "capacity", "machine", "timing", "front",
                           "servers", "kill", "before"}
    # The endpoint list, each server's /metrics read after the night: the chain's calls
    # share their ticker's context, so each server found some of it in its prefix cache.
    assert result["front"] == {"kind": "endpoint list"} and result["kill"] is None
    assert result["before"] is None
    servers = result["servers"]
    assert (servers["read"], servers["of"], servers["tickers_not_succeeded"]) == (2, 2, [])
    assert 0 < servers["prefix_cache_hit_rate"] < 1 and servers["preemptions"] == 0
    # Where the makespan went: two tickers, each started once, 14 chain calls after analysts.
    spent = result["timing"]
    assert 0 <= spent["ticker_first_call_s"]["p50"] <= spent["ticker_first_call_s"]["max"]
    assert spent["ticker_end_s"]["max"] <= arm_makespan(result) + 1e-6
    assert spent["chain_turnaround_s"]["max"] >= 0
    arm = result["arm"]
    assert arm["calls"] == 2 * 17 and arm["failed_attempts"] == 0
    # Both endpoints served: the client spread the two tickers over them.
    served = {e["endpoint"] for e in arm["endpoints"]}
    assert len(served) == 2 and all(u.startswith("http://127.0.0.1:") for u in served)
    assert result["machine"]["database"] == "sqlite"
    # The host's load around the run: on a shared host the figures say it was shared.
    for key in ("load_average_1_5_15_before", "load_average_1_5_15_after"):
        assert len(result["machine"][key]) == 3 and min(result["machine"][key]) >= 0


@pytest.mark.slow
def test_the_fleet_bench_keeps_its_nights_rows_for_a_replay_and_never_overwrites(
        tmp_path: Path) -> None:
    kept = tmp_path / "nights.db"
    args = ("--tickers", "2", "--endpoints", "1", "--speedup", "20", "--output-scale", "0.05",
            "--kv-tokens", "500000", "--database", "sqlite", "--keep-sqlite", str(kept),
            "--nights", "2")
    result = bench("tests.bench.fleet", *args, tmp_path=tmp_path)
    assert result["gpu"]["kv_tokens"] == 500000
    engine = create_engine(f"sqlite:///{kept}")
    with engine.connect() as conn:
        batches = conn.execute(select(Batch.id, Batch.status).order_by(Batch.id)).all()
        calls = conn.execute(select(func.count()).select_from(LLMCall)).scalar()
    engine.dispose()
    assert [tuple(b) for b in batches] == [(1, "succeeded"), (2, "succeeded")]
    assert calls == 2 * 2 * 17
    # A second run into the same file is refused in one line, the kept rows untouched.
    again = subprocess.run([sys.executable, "-m", "tests.bench.fleet", *args], cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)},
                           capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and "exists already" in again.stderr
    assert "Traceback" not in again.stderr
    engine = create_engine(f"sqlite:///{kept}")
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Batch)).scalar() == 2
    engine.dispose()


@pytest.mark.slow
def test_the_fleet_bench_runs_a_smaller_night_before_into_the_same_database(
        tmp_path: Path) -> None:
    # The ETA's prior of another size: 2 tickers, then the night of 3 on the same server.
    kept = tmp_path / "nights.db"
    result = bench("tests.bench.fleet", "--tickers", "3", "--before-tickers", "2",
                   "--endpoints", "1", "--speedup", "20", "--output-scale", "0.05",
                   "--database", "sqlite", "--keep-sqlite", str(kept), tmp_path=tmp_path)
    engine = create_engine(f"sqlite:///{kept}")
    with engine.connect() as conn:
        batches = conn.execute(select(Batch.id, Batch.status, Batch.tickers_total)
                               .order_by(Batch.id)).all()
        calls = dict(conn.execute(select(LLMCall.batch_id, func.count())
                                  .group_by(LLMCall.batch_id)).all())
    engine.dispose()
    assert [tuple(b) for b in batches] == [(1, "succeeded", 2), (2, "succeeded", 3)]
    assert calls == {1: 2 * 17, 2: 3 * 17}
    before = result["before"]
    assert (before["tickers"], before["batch_id"], before["calls"]) == (2, 1, 2 * 17)
    assert before["failed_attempts"] == 0 and before["tickers_not_succeeded"] == []
    assert before["makespan_s"] > 0 and before["gate_wait_s"]["max"] >= 0
    # The figures are the later night's.
    assert (result["tickers"], result["arm"]["batch_id"], result["arm"]["calls"]) == (3, 2, 51)


def router_installed() -> bool:
    try:
        fleet.router.find_binary()
    except fleet.ServerError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not router_installed(), reason="the vllm-router binary is not installed "
                    "(pip install 'nightdesk[router]'; `make setup` does)")
def test_the_fleet_bench_runs_behind_vllm_router_and_kills_an_endpoint_mid_night(
        tmp_path: Path) -> None:
    result = bench("tests.bench.fleet", "--tickers", "4", "--endpoints", "2", "--speedup", "8",
                   "--output-scale", "0.1", "--database", "sqlite", "--router",
                   "consistent_hash", "--router-arg=--enable-program-scheduling",
                   "--program-context", "--kill-at", "1.5", tmp_path=tmp_path)
    front = result["front"]
    assert (front["kind"], front["policy"], front["args"]) == (
        "vllm-router", "consistent_hash", ["--enable-program-scheduling"])
    # The client was given the router alone; the router placed every call.
    assert len(result["arm"]["endpoints"]) == 1
    assert front["cpu_s"] > 0
    # With the program identity sent, the router's program scheduling admitted programs.
    assert front["program_decisions"].get("program_admit", 0) >= 1
    kill = result["kill"]
    assert kill["killed"] is True and kill["at_s"] == 1.5
    # The killed server was read just before it died: both servers' counters are summed.
    assert (result["servers"]["read"], result["servers"]["of"]) == (2, 2)
    # The router's retries and nightdesk's own carried the killed server's tickers through.
    assert kill["tickers_lost"] == result["servers"]["tickers_not_succeeded"] == []
    assert arm_makespan(result) > 1.5


def test_the_fleet_bench_refuses_router_flags_without_a_router_in_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "tests.bench.fleet", "--router-arg=--x"],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--router-arg and --program-context need --router" in \
        done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


# The fleet's rows written per second: a usage row per attempt in ``llm_calls``, a body per
# call in ``llm_requests``. A night whose calls were tried again, one of them never
# answered, tells attempts from calls.
async def test_the_fleet_counts_a_row_per_attempt_and_a_body_per_call(
        sqlite_engine: Engine) -> None:
    settings = load_settings(check_context_length=False, retry_backoff_s=0, max_attempts=2)
    load = synthetic_workload(settings, 3, 0.002, output_scale=0.004)

    def reply(chat: Any) -> Reply:
        text = chat.body["messages"][1]["content"]
        if ". market data:" in text and chat.attempt == 1:
            return Reply(status=500)  # each ticker's market analyst answers at its retry
        if text.startswith("Instrument SYN001") and "Role trader" in text:
            return Reply(status=500)  # both tries: SYN001's trader is never answered
        return Reply("tok " * 6, completion_tokens=6)

    server = FakeServer(reply)
    result = await run_bench(settings, sqlite_engine, load, name="synthetic",
                             strategies=["fixed-all"], sample_metrics=False,
                             http_client=server.client(), warmup_tickers=0)
    arm = result.arms[0]
    with sqlite_engine.connect() as conn:
        written = sum(conn.execute(select(func.count()).select_from(table)
                                   .where(table.batch_id == arm["batch_id"])).scalar_one()
                      for table in (LLMCall, LLMRequest))
    sent = [chat for chat in server.chats if chat.attempt == 1]
    assert written == len(server.chats) + len(sent)  # what the server saw, row for row
    assert fleet.usage_rows(arm, load) == written
    # 3 analysts tried twice and the trader's 2 failed tries: 4 attempts more than calls
    # sent, 5 more than calls answered.
    assert (arm["attempts"], arm["calls"]) == (len(sent) + 4, len(sent) - 1)
