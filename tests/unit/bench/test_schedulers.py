"""Check the scheduler bench's workload shape and that each strategy paces requests as named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from typer.testing import CliRunner

from agents.graph import chain_length
from app.batch.engine import max_in_flight
from app.bench.schedulers import BenchResult, _judge, run_bench
from app.bench.workloads import fit_scale, seed_shape, synthetic_workload
from app.cli import app
from app.cli.bench import show_schedulers
from app.config import load_settings
from app.db.models import LLMCall
from app.runs.replay import shape
from app.traffic.strategy import Strategy
from tests.fakevllm import BASE_URL, FakeServer, FakeServers, Reply
from tests.unit.support.bench_arms import SERVER, fake_arm


def test_seed_shape_matches_the_seeds_per_call_averages() -> None:
    shape = seed_shape()
    assert len(shape) == 17
    mean_in = sum(s.prompt for s in shape) / 17
    assert 10_000 <= mean_in <= 12_000  # seeds: ~188k in per ticker, ≈11k per call
    assert all(s.output == 1_500 for s in shape)
    downstream = [s.prompt for s in shape[4:]]
    assert downstream == sorted(downstream)  # prompts grow along the graph


def test_synthetic_workload_fits_the_server_and_shares_a_prefix() -> None:
    settings = load_settings()
    scale = fit_scale(8192)
    load = synthetic_workload(settings, 3, scale)
    assert len(load) == 3 and all(len(v) == 17 for v in load.values())
    items = load["SYN000"]
    longest = max(len(i.body["messages"][1]["content"].split()) + i.body["max_tokens"]
                  for i in items)
    assert longest <= 8192
    downstream = [i.body["messages"][1]["content"] for i in items[4:]]
    prefix = downstream[0].split("\n\nRole")[0]
    assert all(d.startswith(prefix) for d in downstream)
    assert items[-1].deps[-1] == items[-2].node and items[0].deps == []
    # The scheduler's view of a ticker: 17 requests, the analysts side by side, then 13
    # one after another: the same chain the pipeline itself has.
    assert shape(items) == (17, 14) == (17, chain_length(settings.pipeline()))


def _max_overlap(engine: Engine, batch_id: int) -> int:
    with engine.connect() as conn:
        spans = conn.execute(select(LLMCall.started_at, LLMCall.ended_at)
                             .where(LLMCall.batch_id == batch_id)).all()
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                    key=lambda x: (x[0], x[1]))
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


@pytest.mark.slow
async def test_the_bench_orders_arms_as_a_server_of_known_capacity_dictates(
        sqlite_engine: Engine) -> None:
    # A fake that serves 2 requests at once, each 20 tokens x 2 ms. In units of one request:
    # a ticker alone (fixed-1) takes 2 for its four analysts plus 13 for its chain, 30 for
    # two tickers; both at once (fixed-2) take 4 + 13 = 17, and so does flood (34 requests
    # over 2 places). So fixed-1 reaches at most 17/30 = 0.57 of the ceiling (less when each
    # step's own latency adds up along its longer chain of steps), fixed-2 and flood all of
    # it. Were the server unbounded, flood (every request at once) would beat fixed-2
    # several times over; were it one place, fixed-1 would be as fast as any arm. Readings
    # are on, so adaptive runs with the fake's live gauges.
    settings = load_settings(check_context_length=False, retry_backoff_s=0,
                             llm_base_url=BASE_URL, metrics_interval_s=0.05)
    load = synthetic_workload(settings, 2, 0.002, output_scale=0.004)
    server = FakeServer(lambda chat: Reply(" tok" * 20, completion_tokens=20,
                                           token_delay_s=0.002, finish_reason="length"),
                        capacity=2)
    result = await run_bench(settings, sqlite_engine, load, name="synthetic",
                             strategies=["fixed-1", "fixed-2", "flood", "adaptive"],
                             http_client=server.client())
    arms = {a["strategy"]: a for a in result.arms}
    assert all(a["calls"] == 34 and a["completion_tokens"] == 34 * 20 for a in arms.values())
    # The ceiling is the best arm that respects the graph; flood is the server's bound.
    assert result.ceiling_arm == "fixed-2"
    assert result.server_bound_arm == "flood"
    # The bounds leave room for a shared machine's noise between arms (about a fifth).
    assert 0.2 <= arms["fixed-1"]["ratio_to_ceiling"] <= 0.75
    # Flooding past the server's two places buys nothing (32 requests only wait, and this
    # process juggles 34 streams): the ceiling is the server's. Unbounded, flood measured
    # 3.7x fixed-2 here.
    flood_gain = arms["flood"]["output_tokens_per_s"] / arms["fixed-2"]["output_tokens_per_s"]
    assert flood_gain <= 1.5
    # The adaptive arm reads the gauges and keeps the server nearly as full as fixed-2 does
    # (leaving it half idle, as fixed-1 does, would reach under half of the ceiling).
    assert arms["adaptive"]["ratio_to_ceiling"] >= 0.7
    assert server.load.max_in_flight == 34 and server.load.max_waiting == 34 - 2  # flood
    # Each arm paced as named: one ticker at a time sends at most its four analysts.
    assert _max_overlap(sqlite_engine, arms["fixed-1"]["batch_id"]) <= 4
    # Per-arm cache salts: no arm can reuse another arm's prefix cache (nor the warm-up's).
    salts = {c.body.get("cache_salt") for c in server.chats}
    assert len(salts) == 4 + 1
    # Before the first arm, one ticker's requests warmed the server up (a fresh H200 made
    # the first arm's early requests wait 10 s): all at once, short answers, own salt,
    # recorded in no arm's rows (each arm has its 34 calls above).
    assert result.warmup is not None and result.warmup.requests == 17
    warm = [c for c in server.chats if c.body.get("cache_salt", "").endswith("-warmup")]
    assert len(warm) == 17 and server.chats[:17] == warm
    assert all(c.body["max_tokens"] <= 16 and not c.body.get("stream") for c in warm)
    assert all(a["warmup"] == result.warmup.model_dump() for a in arms.values())


def test_the_ceiling_is_the_best_graph_respecting_arm_and_the_graph_bound_the_target() -> None:
    result = BenchResult("w", 100, 1700, arms=[
        fake_arm("fixed-14", 500.0, ttft=1.0), fake_arm("fixed-all", 450.0, ttft=20.0),
        fake_arm("adaptive", 480.0, ttft=0.9, preemptions=3), fake_arm("flood", 600.0, 139.0),
    ], machine={"server_facts": SERVER, "server": "http://x/v1"})
    _judge(result)
    assert (result.ceiling_arm, result.ceiling_tok_s) == ("fixed-14", 500.0)
    assert (result.server_bound_arm, result.server_bound_tok_s) == ("flood", 600.0)
    by = {a["strategy"]: a for a in result.arms}
    assert by["adaptive"]["ratio_to_ceiling"] == pytest.approx(480 / 500)
    assert by["adaptive"]["ratio_to_server_bound"] == pytest.approx(480 / 600)
    assert by["flood"]["ratio_to_ceiling"] == pytest.approx(600 / 500)
    checks = result.checks
    assert checks["adaptive >= ceiling (best fixed schedule: fixed-14)"] is False
    # The target is the graph bound (800 tok/s, see GRAPH), no longer flood's 600.
    assert result.bound_tok_s == pytest.approx(800.0)
    assert result.bound is not None and result.bound["binding"] == "max_num_seqs"
    assert by["adaptive"]["ratio_to_bound"] == pytest.approx(480 / 800)
    assert checks["adaptive >= 0.9 x graph bound"] is False  # 480 < 720
    assert not [c for c in checks if "flood" in c]
    assert checks["adaptive: zero preemptions"] is False
    # Older arms have no time to first token from readiness: compared from sending.
    assert checks["adaptive TTFT from sending <= best fixed-N's (fixed-14)"] is True
    assert "adaptive >= 1.5 x fixed-3" not in checks
    # The JSON says which arm set each reference.
    data = result.to_json()
    assert data["ceiling_arm"] == "fixed-14" and data["server_bound_arm"] == "flood"


def test_every_adaptive_variant_is_judged_under_its_own_name() -> None:
    # Time to first token from readiness: adaptive's waits at its own gate count. From
    # sending, both variants look faster than fixed-14; from readiness, only one is.
    result = BenchResult("w", 40, 680, arms=[
        fake_arm("adaptive", 777.0, ttft=0.5, ready=1.2),
        fake_arm("adaptive:prefetch=off", 740.0, 0.3, ready=2.0),
        fake_arm("fixed-14", 776.0, ttft=1.35, preemptions=15, ready=1.4),
        fake_arm("flood", 958.0),
    ])
    _judge(result)
    checks = result.checks
    assert checks["adaptive >= ceiling (best fixed schedule: fixed-14)"] is True
    assert checks["adaptive:prefetch=off >= ceiling (best fixed schedule: fixed-14)"] is False
    assert checks["adaptive TTFT from ready <= best fixed-N's (fixed-14)"] is True
    assert checks["adaptive:prefetch=off TTFT from ready <= best fixed-N's (fixed-14)"] is False
    assert checks["adaptive:prefetch=off: zero preemptions"] is True
    # Neither fixed nor flood arms are judged: they are what the variants are judged against.
    assert not [c for c in checks if c.startswith(("fixed", "flood"))]


def test_fixed_all_keeps_every_ticker_in_flight_and_flood_is_uncapped() -> None:
    all_in = Strategy.parse("fixed-all")
    tickers = 120  # more than httpx's default pool of 100 connections
    shapes = {f"T{i}": (17, 14) for i in range(tickers)}
    assert all_in.tickers_in_flight is not None and all_in.tickers_in_flight >= tickers
    # The pool for fixed-all (and flood, which runs as fixed-all) holds every request.
    assert max_in_flight(all_in, shapes, max_concurrency=64) == 17 * 120


async def test_fixed_all_runs_every_ticker_at_once_respecting_dependencies(
        sqlite_engine: Engine) -> None:
    settings = load_settings(check_context_length=False, retry_backoff_s=0)
    load = synthetic_workload(settings, 6, 0.002, output_scale=0.004)
    server = FakeServer(lambda chat: Reply("tok " * 6, delay_s=0.05, completion_tokens=6))
    result = await run_bench(settings, sqlite_engine, load, name="synthetic",
                             strategies=["fixed-all"], sample_metrics=False,
                             http_client=server.client())
    batch_id = result.arms[0]["batch_id"]
    # Every ticker is in flight (more than one ticker's 4 analysts at once), yet never more
    # than 6 tickers x 4 analysts: the chain after them keeps each ticker at one request.
    assert 4 < _max_overlap(sqlite_engine, batch_id) <= 6 * 4
    with sqlite_engine.connect() as conn:
        rows = conn.execute(select(LLMCall.ticker, LLMCall.node, LLMCall.started_at,
                                   LLMCall.ended_at).where(LLMCall.batch_id == batch_id)).all()
    ends = {(r.ticker, r.node): r.ended_at for r in rows}
    for r in rows:
        item = next(i for i in load[r.ticker] if i.node == r.node)
        assert all(ends[(r.ticker, d)] <= r.started_at for d in item.deps)


@pytest.mark.slow
def test_arms_run_in_separate_calls_are_combined_and_judged_together(tmp_path: Path) -> None:
    def run(*arms: dict[str, Any], workload: str = "w") -> Path:
        result = BenchResult(workload, 100, 1700, arms=list(arms),
                             machine={"cpu_model": "x", "cores": 1, "python": "3", "model": "m",
                                      "profile": "p", "server": "s", "date": "d",
                                      "server_facts": SERVER})
        _judge(result)
        path = tmp_path / f"{arms[0]['strategy']}-{workload}.json"
        path.write_text(json.dumps(result.to_json()))
        return path

    files = [run(fake_arm("fixed-14", 500.0, ttft=1.0)),
             run(fake_arm("fixed-all", 450.0, ttft=20.0)),
             run(fake_arm("adaptive", 520.0, ttft=0.9)),
             run(fake_arm("flood", 600.0, ttft=139.0))]
    out = tmp_path / "all.json"
    cli = CliRunner().invoke(app, ["bench", "combine", *map(str, files), "--json-out", str(out)])
    assert cli.exit_code == 0, cli.output
    combined = json.loads(out.read_text())
    assert [a["strategy"] for a in combined["arms"]] == ["fixed-14", "fixed-all", "adaptive",
                                                         "flood"]
    assert (combined["ceiling_arm"], combined["server_bound_arm"]) == ("fixed-14", "flood")
    by = {a["strategy"]: a for a in combined["arms"]}
    assert by["adaptive"]["ratio_to_ceiling"] == pytest.approx(520 / 500)
    assert by["adaptive"]["ratio_to_server_bound"] == pytest.approx(520 / 600)
    assert combined["checks"]["adaptive >= ceiling (best fixed schedule: fixed-14)"] is True
    # The graph bound is worked out again from every file's readings: 800 tok/s (GRAPH).
    assert combined["bound_tok_s"] == pytest.approx(800.0)
    assert combined["checks"]["adaptive >= 0.9 x graph bound"] is False  # 520 < 720
    # Another workload's arms are not comparable: refused, with one line.
    other = run(fake_arm("fixed-3", 100.0), workload="other")
    refused = subprocess.run(
        [sys.executable, "-c", "from app.cli import main; main()", "bench", "combine",
         str(files[0]), str(other)], capture_output=True, text=True)
    assert refused.returncode != 0
    assert "cannot combine" in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.slow
async def test_a_bench_over_two_endpoints_reports_each_and_the_total(
        sqlite_engine: Engine, tmp_path: Path) -> None:
    urls = ["http://gpu0.test:8000/v1", "http://gpu1.test:8001/v1"]
    servers = FakeServers({url: FakeServer(lambda chat: Reply(
        " tok" * 20, completion_tokens=20, token_delay_s=0.002, finish_reason="length"),
        capacity=2) for url in urls})
    settings = load_settings(check_context_length=False, retry_backoff_s=0,
                             llm_base_url=servers.base_urls, metrics_interval_s=0.05)
    load = synthetic_workload(settings, 4, 0.002, output_scale=0.004)
    result = await run_bench(settings, sqlite_engine, load, name="synthetic",
                             strategies=["fixed-1", "adaptive"], http_client=servers.client())
    for a in result.arms:
        shares = {e["endpoint"]: e for e in a["endpoints"]}
        # fixed-1 is one ticker per endpoint at a time: both endpoints serve.
        assert set(shares) == set(urls), a["strategy"]
        assert sum(e["calls"] for e in shares.values()) == a["calls"] == 4 * 17
        assert sum(e["tickers"] for e in shares.values()) == 4
        assert sum(e["output_tokens_per_s"] for e in shares.values()) == pytest.approx(
            a["output_tokens_per_s"])
        assert set(a["admission"]["endpoints"]) == set(urls)
        for url, server in servers.servers.items():
            # Each arm's prefix-cache salt is "<run>-<strategy>-<round>" (bench --repeat).
            assert shares[url]["calls"] == len([c for c in server.chats
                                                if f"-{a['strategy']}-" in
                                                c.body.get("cache_salt", "")])
    out = tmp_path / "bench.json"
    show_schedulers(result, out)
    assert json.loads(out.read_text())["arms"][0]["endpoints"][0]["endpoint"] in urls
