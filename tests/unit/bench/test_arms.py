"""Fair bench figures: the fixed-N sweep, tail-off twins, the graph bound, TTFT from readiness,
throughput of succeeded work, and combining only runs of one code, host and server."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from typer.testing import CliRunner

from app.bench.arms import knob_defaults, plan_arms, split_arms, sweep
from app.bench.bound import GraphFacts, StepCost, fit_step, graph_bound, graph_facts
from app.bench.schedulers import (
    BenchResult,
    ServerFlags,
    _judge,
    combine_results,
    machine_facts,
    run_bench,
    server_flags,
)
from app.bench.workloads import synthetic_workload
from app.cli import app
from app.cli.bench import show_schedulers
from app.config import load_settings
from app.db.models import LLMCall
from app.errors import InputError
from app.morning.accounting import batch_report
from app.runs.replay import WorkItem, Workload
from tests.fakevllm import FakeServer, Reply
from tests.unit.support.stepped_gpu import ANALYST_PROMPT, CHAIN_FIRST, CHAIN_LAST
from tests.unit.support.stepped_gpu import run as stepped_run

# --- the fixed-N sweep -----------------------------------------------------------------------


@pytest.mark.parametrize(("tickers", "scale", "out", "kv", "seqs", "best"), [
    # The H200 runs: 40 tickers x0.2/x0.2 on 49,152 KV tokens, best measured fixed-14 (of
    # 3, 14, 32, all); the 32-ticker x0.3/x0.1 run on 81,920 tokens and 48 sequences, best
    # measured fixed-20 (of 10, 14, 20, 28): the sweep brackets each.
    (40, 0.2, 0.2, 49_152, 32, 14),
    (32, 0.3, 0.1, 81_920, 48, 20),
])
def test_the_sweep_brackets_the_best_fixed_n_measured_on_the_h200(
        tickers: int, scale: float, out: float, kv: int, seqs: int, best: int) -> None:
    load = synthetic_workload(load_settings(check_context_length=False), tickers, scale, out)
    chosen = sweep(load, kv, seqs)
    assert len(chosen.sizes) >= 4
    assert min(chosen.sizes) < best <= max(chosen.sizes)
    assert all(1 <= n < tickers for n in chosen.sizes)
    assert chosen.sizes == sorted(set(chosen.sizes))


def test_the_sweep_follows_the_kv_cache_and_the_sequence_cap() -> None:
    load = synthetic_workload(load_settings(check_context_length=False), 100, 0.2, 0.2)
    small, large = sweep(load, 49_152, 256), sweep(load, 4 * 49_152, 256)
    # Four times the cache: about four times the tickers' chains fit.
    assert large.n_star == pytest.approx(4 * small.n_star, abs=3)
    # The sequence cap binds before the cache does; two endpoints double it.
    assert sweep(load, 10**7, 8).n_star == 8
    assert sweep(load, 10**7, 8, endpoints=2).n_star == 16
    # A cache that holds every ticker: the sweep stays below fixed-all with four sizes.
    few = synthetic_workload(load_settings(check_context_length=False), 24, 0.005, 0.02)
    tiny = sweep(few, 93_184, 32)
    assert tiny.n_star == 24 and len(tiny.sizes) >= 4 and max(tiny.sizes) < 24


def test_arms_are_planned_with_the_sweep_and_a_tail_off_twin_each() -> None:
    load = synthetic_workload(load_settings(check_context_length=False), 40, 0.2, 0.2)
    arms, chosen = plan_arms("fixed-3,sweep,fixed-all,adaptive,adaptive:prefetch=off,flood",
                             load, 49_152, 32)
    assert chosen is not None
    assert arms[:1 + len(chosen.sizes)] == ["fixed-3"] + [f"fixed-{n}" for n in chosen.sizes]
    assert arms[arms.index("adaptive") + 1] == "adaptive:tail=off"
    assert arms[arms.index("adaptive:prefetch=off") + 1] == "adaptive:prefetch=off,tail=off"
    assert arms[-1] == "flood" and "fixed-all" in arms
    # A twin already listed (knobs in any order) is not run twice, nor is one arm.
    again, _ = plan_arms("adaptive:prefetch=off,adaptive:tail=off,prefetch=off,fixed-8,fixed-8",
                         load, None, None)
    assert again == ["adaptive:prefetch=off", "adaptive:tail=off,prefetch=off", "fixed-8"]
    assert split_arms("adaptive:prefetch=off,tail=off,fixed-8") == [
        "adaptive:prefetch=off,tail=off", "fixed-8"]
    # A fixed arm takes the tail rule too; the same knob twice is one arm, and only
    # adaptive arms get a tail-off twin.
    assert split_arms("fixed-15:tail=on,fixed-15,adaptive") == [
        "fixed-15:tail=on", "fixed-15", "adaptive"]
    fair, _ = plan_arms("fixed-15:tail=on,fixed-15,fixed-15:tail=on,fixed-15:tail=off",
                        load, None, None)
    assert fair == ["fixed-15:tail=on", "fixed-15"]


def test_a_bad_arm_is_refused_before_anything_runs() -> None:
    load = synthetic_workload(load_settings(check_context_length=False), 4, 0.01, 0.01)
    with pytest.raises(InputError, match="fixd-8"):
        plan_arms("fixed-3,sweep,fixd-8", load, None, None)
    with pytest.raises(InputError):
        plan_arms(" , ", load, None, None)


# --- the graph bound -------------------------------------------------------------------------


def _item(ticker: str, node: str, deps: list[str]) -> WorkItem:
    return WorkItem(ticker, 0, node, {"messages": [], "max_tokens": 1}, deps)


def test_a_node_asked_again_counts_each_of_its_calls_once() -> None:
    # One ticker: a, then c asked three times (a decision asked again), each after the one
    # before. Outputs 10, then 30, 40, 50: the chain is 130 tokens, not 10 + 3 x 120.
    load: Workload = {"X": [_item("X", "a", []), _item("X", "c", ["a"]),
                            WorkItem("X", 0, "c", {}, ["a", "c"], request=2),
                            WorkItem("X", 0, "c", {}, ["a", "c", "c#2"], request=3)]}
    calls = [("X", 0, "a", 100, 10), ("X", 0, "c", 300, 30), ("X", 0, "c", 300, 40),
             ("X", 0, "c", 300, 50)]
    facts = graph_facts(calls, load)
    assert facts.critical_path_tokens == 130
    assert facts.output_tokens == 130
    # Each call holds its own prompt and output: 300 x 30 + 450, not 300 x 120 + 7,200.
    assert facts.kv_token_steps == 100 * 10 + 50 + sum(300 * o + o * o / 2 for o in (30, 40, 50))
    # A workload with fewer items than calls gives the calls left over to the node's last item.
    short: Workload = {"X": [_item("X", "a", []), _item("X", "c", ["a"])]}
    assert graph_facts(calls, short).critical_path_tokens == 130


def test_the_bound_of_a_workload_worked_by_hand() -> None:
    # Two tickers, each: a and b side by side, then c after both. Outputs 10, 20, 30 with
    # prompts 100, 200, 300: per ticker 60 output tokens, critical path b then c = 50.
    load: Workload = {t: [_item(t, "a", []), _item(t, "b", []), _item(t, "c", ["a", "b"])]
                      for t in ("X", "Y")}
    calls = [(t, 0, n, p, o) for t in ("X", "Y")
             for n, p, o in (("a", 100, 10), ("b", 200, 20), ("c", 300, 30))]
    facts = graph_facts(calls, load)
    kv_steps = 2 * (100 * 10 + 50 + 200 * 20 + 200 + 300 * 30 + 450)
    assert facts == GraphFacts(120, float(kv_steps), 50, 6)
    # One sequence at a time: 120 steps. 0.1 s per step: 12 s, 10 tok/s.
    one = graph_bound(facts, 10**6, 1, StepCost(0.1, 0.0))
    assert one is not None and one.binding == "max_num_seqs"
    assert one.tok_s == pytest.approx(10.0)
    # Unbounded sequences and cache: the chain (50 steps) sets it, 120 / 5 s = 24 tok/s.
    chain = graph_bound(facts, 10**6, 100, StepCost(0.1, 0.0))
    assert chain is not None and chain.binding == "critical_path"
    assert chain.tok_s == pytest.approx(24.0)
    # A cache of 500 tokens: 29,400 KV-token-steps need 58.8 steps.
    kv = graph_bound(facts, 500, 100, StepCost(0.1, 0.0))
    assert kv is not None and kv.binding == "kv_cache" and kv.steps == pytest.approx(58.8)
    # A step that grows with the batch: + 0.01 s per token made, 1.2 s more in all.
    grown = graph_bound(facts, 10**6, 1, StepCost(0.1, 0.01))
    assert grown is not None and grown.seconds == pytest.approx(12.0 + 1.2)


def test_the_step_cost_is_fitted_back_from_readings() -> None:
    a, b = 0.02, 0.0005  # seconds per step, and per running request
    levels = {r: [r * 1000.0, 1000 * (a + b * r)] for r in (4, 10, 20, 32)}
    step = fit_step(levels)
    assert step is not None
    assert step.a == pytest.approx(a, rel=1e-6) and step.b == pytest.approx(b, rel=1e-6)
    # One level alone: the time per step there, no growth.
    alone = fit_step({16: [16_000.0, 1000 * (a + b * 16)]})
    assert alone is not None and alone.b == 0 and alone.a == pytest.approx(a + b * 16)
    assert fit_step({}) is None


def _stepped_workload(tickers: int, out: int) -> tuple[Workload, list[tuple[Any, ...]]]:
    """The stepped model's tickers as a workload and their calls, in its own token sizes."""
    load: Workload = {}
    calls = []
    for i in range(tickers):
        key = f"T{i:03d}"
        analysts = [_item(key, f"analyst{j}", []) for j in range(4)]
        chain = [_item(key, f"step{n}", [a.node for a in analysts] + ([f"step{n - 1}"] if n
                                                                        else []))
                 for n in range(13)]
        load[key] = analysts + chain
        calls += [(key, 0, a.node, ANALYST_PROMPT, out) for a in analysts]
        calls += [(key, 0, f"step{n}",
                   round(CHAIN_FIRST + n * (CHAIN_LAST - CHAIN_FIRST) / 12), out)
                  for n in range(13)]
    return load, calls


@pytest.mark.slow
@pytest.mark.parametrize(("capacity", "seqs"), [(49_152, 32), (200_000, 12)])
def test_no_graph_respecting_schedule_beats_the_bound_on_the_stepped_gpu(
        capacity: int, seqs: int) -> None:
    # The stepped GPU of known capacity; a step costs one unit of time whatever it runs
    # (prefill made free), so the bound is in tokens per unit. Every schedule that respects
    # the graph stays under it, and the best comes near it: the bound is neither loose nor
    # wrong. The first case is KV-bound, the second bound by the sequence cap.
    tickers, out = 20, 60
    load, calls = _stepped_workload(tickers, out)
    bound = graph_bound(graph_facts(calls, load), capacity, seqs, StepCost(1.0, 0.0))
    assert bound is not None
    assert bound.binding == ("kv_cache" if seqs == 32 else "max_num_seqs")
    got = {s: stepped_run(s, tickers, out, capacity=capacity, max_seqs=seqs,
                          p_equiv=10**9)["output_per_step"]
           for s in ("fixed-4", "fixed-all", "adaptive")}
    assert all(v <= bound.tok_s * 1.001 for v in got.values()), (got, bound.tok_s)
    assert max(got.values()) >= 0.8 * bound.tok_s, (got, bound.tok_s)
    assert got["fixed-4"] < 0.8 * bound.tok_s  # too few tickers: far from it


# --- figures from the rows: TTFT from readiness, succeeded work ---------------------------


async def test_ttft_from_readiness_counts_the_wait_at_our_own_gate(
        sqlite_engine: Engine) -> None:
    # sequential lets one request out at a time: a ticker's four analysts are issued
    # together, so the k-th waits k requests' time at our gate before it is sent. fixed-all
    # sends each as it is issued. Time to first token from sending hides the gate's wait;
    # from readiness it shows it.
    settings = load_settings(check_context_length=False, retry_backoff_s=0)
    load = synthetic_workload(settings, 1, 0.002, output_scale=0.004)
    server = FakeServer(lambda chat: Reply("tok " * 6, delay_s=0.05, completion_tokens=6))
    result = await run_bench(settings, sqlite_engine, load, name="synthetic",
                             strategies=["sequential", "fixed-all"], sample_metrics=False,
                             http_client=server.client(), warmup_tickers=0)
    arms = {a["strategy"]: a for a in result.arms}
    with sqlite_engine.connect() as conn:
        rows = conn.execute(select(LLMCall.node, LLMCall.ready_at, LLMCall.started_at,
                                   LLMCall.batch_id)).all()
    assert rows and all(r.ready_at is not None and r.ready_at <= r.started_at for r in rows)
    waits = sorted((r.started_at - r.ready_at).total_seconds() for r in rows
                   if r.batch_id == arms["sequential"]["batch_id"]
                   and r.node in ("market", "sentiment", "news", "fundamentals"))
    assert waits[-1] >= 3 * 0.05 * 0.9  # the fourth analyst waited for three before it
    seq, all_in = arms["sequential"], arms["fixed-all"]
    assert seq["ttft_ready_mean_s"] - seq["mean_ttft_s"] >= 0.9 * (0 + 1 + 2 + 3) * 0.05 / 17
    assert all_in["ttft_ready_mean_s"] - all_in["mean_ttft_s"] < 0.05  # no gate to wait at
    # The p90 lies between the two answered calls that bracket the 90% rank (not above the
    # mean: one call stalled by a loaded host can lift the mean past it).
    with sqlite_engine.connect() as conn:
        timed = conn.execute(select(LLMCall.ready_at, LLMCall.first_token_at).where(
            LLMCall.batch_id == seq["batch_id"], LLMCall.status == "ok",
            LLMCall.first_token_at.is_not(None))).all()
    ready = sorted((r.first_token_at - r.ready_at).total_seconds() for r in timed)
    low = int(0.9 * (len(ready) - 1))
    high = min(low + 1, len(ready) - 1)
    assert ready[low] - 1e-6 <= seq["ttft_ready_p90_s"] <= ready[high] + 1e-6
    assert abs(seq["ttft_ready_mean_s"] - sum(ready) / len(ready)) < 1e-6


async def test_throughput_of_succeeded_tickers_leaves_out_the_failed_ones(
        sqlite_engine: Engine) -> None:
    settings = load_settings(check_context_length=False, retry_backoff_s=0, max_attempts=1)
    load = synthetic_workload(settings, 3, 0.002, output_scale=0.004)

    def reply(chat: Any) -> Reply:
        text = chat.body["messages"][1]["content"]
        if text.startswith("Instrument SYN001") and "Role portfolio_manager" in text:
            return Reply(status=500)  # the last call of one ticker fails: it fails
        return Reply("tok " * 6, completion_tokens=6)

    server = FakeServer(reply)
    result = await run_bench(settings, sqlite_engine, load, name="synthetic",
                             strategies=["fixed-all"], sample_metrics=False,
                             http_client=server.client(), warmup_tickers=0)
    figures = result.arms[0]
    report = batch_report(sqlite_engine, figures["batch_id"])
    # SYN001's 16 answered calls made tokens that the night did not deliver.
    assert report.completion_tokens == (3 * 17 - 1) * 6
    assert report.succeeded_completion_tokens == 2 * 17 * 6
    assert figures["succeeded_output_tokens_per_s"] == pytest.approx(
        figures["output_tokens_per_s"] * 34 / 50)


# --- combining runs ---------------------------------------------------------------------------


def _run(strategy: str, **machine: Any) -> dict[str, Any]:
    facts = {"cpu_model": "x", "cores": 1, "python": "3", "model": "m", "profile": "p",
             "server": "s", "date": "d", "host": "h1", "commit": "abc",
             "server_flags": {"max_num_seqs": 32}, **machine}
    result = BenchResult("w", 10, 170, machine=facts, arms=[
        {"strategy": strategy, "output_tokens_per_s": 100.0, "mean_ttft_s": 1.0,
         "preemptions": 0}])
    _judge(result)
    return result.to_json()


@pytest.mark.parametrize("differs", [{"commit": "def"}, {"host": "h2"},
                                     {"server_flags": {"max_num_seqs": 48}},
                                     {"commit": None},
                                     # two endpoints alike: twice the tok/s of one
                                     {"server": "http://a:8000/v1,http://b:8000/v1"},
                                     # another model served, or another server profile
                                     {"model": "other"}, {"profile": "other"}])
def test_combine_refuses_runs_of_another_commit_host_or_server(differs: dict[str, Any]) -> None:
    runs = [_run("fixed-8"), _run("fixed-3"), _run("adaptive", **differs)]
    with pytest.raises(InputError, match=r"cannot combine runs whose .* --allow-mixed"):
        combine_results(runs)
    combined = combine_results(runs, allow_mixed=True)
    assert [a["strategy"] for a in combined.arms] == ["fixed-8", "fixed-3", "adaptive"]
    assert combined.mixed and len(next(iter(combined.mixed.values()))) == 2
    assert combine_results(runs[:2]).mixed is None  # the same commit, host and server


@pytest.mark.slow
def test_bench_combine_says_in_one_line_why_it_refused(tmp_path: Path) -> None:
    files = []
    for name, run in (("a", _run("fixed-8")), ("b", _run("adaptive", commit="def"))):
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(run))
    cmd = [sys.executable, "-c", "from app.cli import main; main()", "bench", "combine",
           *map(str, files)]
    refused = subprocess.run(cmd, capture_output=True, text=True)
    assert refused.returncode == 2
    assert "cannot combine runs whose code commit differ" in refused.stderr
    assert "Traceback" not in refused.stderr
    out = tmp_path / "mixed.json"
    allowed = CliRunner().invoke(app, [*cmd[3:], "--allow-mixed", "--json-out", str(out)])
    assert allowed.exit_code == 0, allowed.output
    assert json.loads(out.read_text())["mixed"] == {"code commit": ["abc", "def"]}


async def test_every_bench_json_records_the_commit_host_and_server_flags(
        sqlite_engine: Engine) -> None:
    settings = load_settings(check_context_length=False, retry_backoff_s=0)
    load = synthetic_workload(settings, 1, 0.002, output_scale=0.004)
    server = FakeServer(lambda chat: Reply("tok " * 6, completion_tokens=6))
    facts = {"command": "VLLM_X=1 vllm serve /models/q --max-num-seqs 32 --quantization fp8",
             "max_num_seqs": 32, "kv_cache_tokens": 4096, "kv_cache_memory_gib": 1.5,
             "vllm_version": "0.31.0",
             "cache_config": {"block_size": "16", "_x": "1", "cache_dtype": "fp8_e4m3"}}
    result = await run_bench(settings, sqlite_engine, load, name="synthetic",
                             strategies=["fixed-1"], sample_metrics=False, server_facts=facts,
                             http_client=server.client(), warmup_tickers=0,
                             served=[{"id": "m", "root": "/other", "max_model_len": 4096}])
    machine = result.to_json()["machine"]
    assert machine["commit"] and machine["commit"] != "unknown" and machine["host"]
    # The order every bench file has had: the date first, the server's facts last.
    assert list(machine) == ["date", "cpu_model", "cores", "python", "platform", "host",
                             "commit", "server", "model", "models", "profile", "server_facts",
                             "server_flags"]
    # The whole server configuration, None where not known (the fake has no GPU to name).
    assert machine["server_flags"] == {
        "model": "/models/q", "max_num_seqs": 32, "max_model_len": 4096,
        "quantization": "fp8", "kv_cache_dtype": "fp8_e4m3", "kv_cache_tokens": 4096,
        "kv_cache_memory_gib": 1.5, "vllm_version": "0.31.0", "gpu": None,
        "command": "VLLM_X=1 vllm serve /models/q --max-num-seqs 32 --quantization fp8",
        "cache_config": {"block_size": "16", "cache_dtype": "fp8_e4m3"}}


def test_combine_refuses_runs_on_servers_set_up_differently() -> None:
    # Two runs alike but for the KV cache dtype the server ran with: not comparable.
    first = {"model": "q", "max_num_seqs": 32, "kv_cache_dtype": "fp8_e4m3", "gpu": "H200"}
    for key, other in (("kv_cache_dtype", "auto"), ("quantization", "fp8"), ("gpu", "A100"),
                       ("model", "q2"), ("vllm_version", "0.32.0")):
        runs = [_run("fixed-8", server_flags=first),
                _run("adaptive", server_flags={**first, key: other})]
        with pytest.raises(InputError, match="server flags differ"):
            combine_results(runs)
        mixed = combine_results(runs, allow_mixed=True)
        assert mixed.mixed is not None and len(mixed.mixed["server flags"]) == 2


# The machine a bench ran on, as today's H100 run recorded it: a server started by hand
# (`vllm serve ... --quantization fp8 --max-num-seqs 32 --kv-cache-memory-bytes 6G`), only
# its /metrics read (docs/bench/gpu-h100-40-tickers-fair-2026-12-06-a.json).
HAND_STARTED = {"profile": "gpu-dummy", "source": "live /metrics", "kv_cache_tokens": 49152,
                "cache_config": {"cache_dtype": "fp8", "kv_cache_memory_bytes": "6442450944"}}
HAND_COMMAND = ("/usr/bin/python3 /usr/local/bin/vllm serve /root/stage/model --served-model-name"
                " gpu-model --load-format dummy --host 127.0.0.1 --port 8000 --quantization fp8"
                " --kv-cache-dtype fp8 --max-model-len 34816 --max-num-seqs 32"
                " --kv-cache-memory-bytes 6G")


def test_flags_of_a_hand_started_server_come_from_its_process_and_version() -> None:
    flags = server_flags({**HAND_STARTED, "vllm_version": "0.24.0", "command": HAND_COMMAND},
                         {"id": "gpu-model", "root": "/root/stage/model"}, "H100")
    assert flags.model_dump(exclude={"cache_config", "command"}) == {
        "model": "/root/stage/model", "max_num_seqs": 32, "max_model_len": 34816,
        "quantization": "fp8", "kv_cache_dtype": "fp8", "kv_cache_tokens": 49152,
        "kv_cache_memory_gib": 6.0, "vllm_version": "0.24.0", "gpu": "H100"}
    assert flags.unknown() == []


@pytest.mark.parametrize(("given", "gib"), [("6G", 6.0), ("6g", 6e9 / 2**30),
                                            ("1536M", 1.5), ("3221225472", 3.0), ("x", None)])
def test_the_kv_cache_size_given_on_the_command_is_recorded_in_gib(
        given: str, gib: float | None) -> None:
    flags = server_flags({"command": f"vllm serve m --kv-cache-memory-bytes {given}"})
    assert flags.kv_cache_memory_gib == (pytest.approx(gib, abs=1e-3) if gib else None)


def test_the_log_s_kv_cache_size_comes_before_the_size_given() -> None:
    facts = {**HAND_STARTED, "kv_cache_memory_gib": 5.5}
    assert server_flags(facts).kv_cache_memory_gib == 5.5
    none_given = {"cache_config": {"kv_cache_memory_bytes": "None"}}
    assert server_flags(none_given).kv_cache_memory_gib is None


def test_the_bench_says_which_server_flags_are_not_known(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    # Only /metrics read: no command, no version. The size /metrics gives is known.
    flags = server_flags(HAND_STARTED, {"root": "/root/stage/model", "max_model_len": 34816})
    assert flags.unknown() == ["max_num_seqs", "quantization", "vllm_version", "gpu",
                               "command"]
    result = BenchResult("w", 10, 170, machine={**_run("fixed-8")["machine"],
                                                "server_flags": flags.model_dump()})
    show_schedulers(result, None)
    printed = " ".join(capsys.readouterr().out.split())
    assert ("not known (null in the JSON): max_num_seqs, quantization, vllm_version, gpu, "
            "command") in printed
    assert "max-model-len 34816" in printed and "KV GiB 6.0" in printed
    # With the command known, no --quantization in it is a fact: none was given.
    known = ServerFlags(command="vllm serve m", vllm_version="0.32.0")
    assert "quantization" not in known.unknown()
    assert "quantization none given" in known.line()


def test_combine_still_refuses_runs_whose_recorded_flags_differ() -> None:
    # A run that read its server's process beside one that could not: the flags differ.
    seen = server_flags({**HAND_STARTED, "command": HAND_COMMAND}).model_dump()
    unseen = server_flags(HAND_STARTED).model_dump()
    with pytest.raises(InputError, match="server flags differ"):
        combine_results([_run("fixed-8", server_flags=seen),
                         _run("adaptive", server_flags=unseen)])


# --- repeated arms: means, spreads and what a lead means ----------------------------------


def _runs(*arms: tuple[str, float]) -> BenchResult:
    result = BenchResult("w", 10, 170, machine={"server_flags": {}}, arms=[
        {"strategy": s, "output_tokens_per_s": tok_s, "mean_ttft_s": 1.0, "preemptions": 0,
         "makespan_s": 1000 / tok_s} for s, tok_s in arms])
    _judge(result)
    return result


def test_verdicts_use_the_means_and_test_the_lead_on_the_runs() -> None:
    # adaptive 104 and 100 (mean 102, spread 4); fixed-14 100 and 98 (mean 99): a 3.0% lead
    # that two runs a side do not show. The ceiling is fixed-14's mean, not its best run.
    unshown = _runs(("fixed-14", 100.0), ("adaptive", 104.0), ("fixed-14", 98.0),
                    ("adaptive", 100.0))
    assert unshown.ceiling_tok_s == pytest.approx(99.0) and unshown.ceiling_arm == "fixed-14"
    assert unshown.means["adaptive"]["runs"] == 2
    assert unshown.means["adaptive"]["runs_tok_s"] == [104.0, 100.0]
    assert unshown.means["adaptive"]["spread_tok_s"] == pytest.approx(4.0)
    assert unshown.checks["adaptive >= ceiling (best fixed schedule: fixed-14)"]
    # Welch's t = 3 / sqrt(8/2 + 2/2) = 1.34, on min(n) - 1 = 1 degree of freedom.
    assert unshown.verdicts == ["adaptive vs fixed-14: +3.0% on the means (2 and 2 runs), "
                                "Welch's t, df = min(n)-1 = 1, p = 0.408: not shown at the "
                                "5% level"]
    # 110/111 against 100/101: t = 10 / sqrt(0.5) = 14.1 on 1 degree of freedom, and back.
    lead = _runs(("fixed-14", 100.0), ("adaptive", 110.0), ("fixed-14", 101.0),
                 ("adaptive", 111.0))
    assert lead.verdicts[0].endswith("+10.0% on the means (2 and 2 runs), Welch's t, "
                                     "df = min(n)-1 = 1, p = 0.045: a lead at the 5% level")
    deficit = _runs(("fixed-14", 110.0), ("adaptive", 100.0), ("fixed-14", 111.0),
                    ("adaptive", 101.0))
    assert deficit.verdicts[0].endswith("p = 0.045: a deficit at the 5% level")
    # A fixed arm with the tail rule is a ceiling candidate like any fixed count.
    tailed = _runs(("fixed-14", 100.0), ("fixed-14:tail=on", 106.0), ("adaptive", 103.0))
    assert tailed.ceiling_arm == "fixed-14:tail=on"
    assert not tailed.checks["adaptive >= ceiling (best fixed schedule: fixed-14:tail=on)"]
    assert tailed.verdicts[0].endswith(": unresolved (one run gives no variance)")


async def test_repeat_runs_every_arm_k_times_interleaved(sqlite_engine: Engine) -> None:
    settings = load_settings(check_context_length=False, retry_backoff_s=0)
    load = synthetic_workload(settings, 2, 0.002, output_scale=0.004)
    server = FakeServer(lambda chat: Reply("tok " * 6, delay_s=0.01, completion_tokens=6))
    result = await run_bench(settings, sqlite_engine, load, name="synthetic",
                             strategies=["fixed-1", "fixed-1:tail=on"], repeat=2,
                             sample_metrics=False, http_client=server.client(),
                             warmup_tickers=0)
    assert [(a["strategy"], a["run"]) for a in result.arms] == [
        ("fixed-1", 1), ("fixed-1:tail=on", 1), ("fixed-1", 2), ("fixed-1:tail=on", 2)]
    assert len({a["batch_id"] for a in result.arms}) == 4
    for strategy in ("fixed-1", "fixed-1:tail=on"):
        mine = [a["output_tokens_per_s"] for a in result.arms if a["strategy"] == strategy]
        assert result.means[strategy]["runs"] == 2
        assert result.means[strategy]["output_tokens_per_s"] == pytest.approx(sum(mine) / 2)
        assert result.means[strategy]["spread_tok_s"] == pytest.approx(max(mine) - min(mine))
    assert result.repeat == 2 and result.to_json()["means"].keys() == result.means.keys()
    with pytest.raises(InputError, match="--repeat"):
        await run_bench(settings, sqlite_engine, load, name="synthetic",
                        strategies=["fixed-1"], repeat=0, sample_metrics=False,
                        http_client=server.client(), warmup_tickers=0)


async def test_fixed_n_prefetching_runs_fan_outs_ahead_but_n_chains(
        sqlite_engine: Engine) -> None:
    # fixed-1: one ticker at a time. With prefetch=on one chain at a time still, but the next
    # ticker's analysts run while it goes, as adaptive's prefetching does.
    settings = load_settings(check_context_length=False, retry_backoff_s=0)
    load = synthetic_workload(settings, 3, 0.002, output_scale=0.004)
    server = FakeServer(lambda chat: Reply("tok " * 6, delay_s=0.02, completion_tokens=6))
    result = await run_bench(settings, sqlite_engine, load, name="synthetic",
                             strategies=["fixed-1", "fixed-1:prefetch=on"],
                             sample_metrics=False, http_client=server.client(),
                             warmup_tickers=0)
    analysts = {"market", "sentiment", "news", "fundamentals"}
    spans: dict[str, dict[str, list[tuple[Any, Any]]]] = {}
    for arm in result.arms:
        assert arm["failed_attempts"] == 0 and arm["calls"] == 3 * 17
        with sqlite_engine.connect() as conn:
            rows = conn.execute(select(LLMCall.ticker, LLMCall.node, LLMCall.started_at,
                                       LLMCall.ended_at)
                                .where(LLMCall.batch_id == arm["batch_id"])).all()
        chains: dict[str, list[Any]] = {}
        fans: dict[str, list[Any]] = {}
        for r in rows:
            (fans if r.node in analysts else chains).setdefault(r.ticker, []).append(
                (r.started_at, r.ended_at))
        spans[arm["strategy"]] = {
            "chain": sorted((min(s for s, _ in v), max(e for _, e in v))
                            for v in chains.values()),
            "fan": sorted((min(s for s, _ in v), max(e for _, e in v)) for v in fans.values())}
    for strategy in ("fixed-1", "fixed-1:prefetch=on"):
        chain = spans[strategy]["chain"]
        # Never two chains at once: each ticker's chain ends before the next one's starts.
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(chain)), strategy
    plain, ahead = spans["fixed-1"], spans["fixed-1:prefetch=on"]
    # Without prefetching a ticker's analysts wait for the ticker before it to end; with it,
    # the second and third tickers' analysts start while a chain before them runs.
    assert all(f[0] >= c[1] for f, c in zip(plain["fan"][1:], plain["chain"], strict=False))
    assert all(f[0] < c[1] for f, c in zip(ahead["fan"][1:], ahead["chain"], strict=False))


def test_combine_pools_one_arm_however_it_is_spelled() -> None:
    # fixed-15 in one file and fixed-15:tail=off (its default written out) in another were
    # two rows of one run each; knobs in another order likewise.
    runs = [_run("fixed-15"), _run("fixed-15:tail=off"), _run("fixed-8:prefetch=on,tail=on"),
            _run("fixed-8:tail=on,prefetch=on"), _run("adaptive"), _run("adaptive:kv_high=0.9")]
    combined = combine_results(runs)
    assert {name: m["runs"] for name, m in combined.means.items()} == {
        "fixed-15": 2, "fixed-8:tail=on,prefetch=on": 2, "adaptive": 2}
    assert [a.get("strategy_as_run") for a in combined.arms] == [
        None, "fixed-15:tail=off", "fixed-8:prefetch=on,tail=on", None, None,
        "adaptive:kv_high=0.9"]


def test_combine_keeps_arms_of_other_defaults_apart() -> None:
    # A file from before prefetching was adaptive's default records no defaults: its
    # adaptive and adaptive:prefetch=on were two arms then; read by today's defaults they
    # would pool. A file that records prefetch off by default is read by that.
    older = [_run("adaptive"), _run("adaptive:prefetch=on")]
    for run in older:
        run["knob_defaults"] = None
    assert {n: m["runs"] for n, m in combine_results(older).means.items()} == {
        "adaptive": 1, "adaptive:prefetch=on": 1}
    recorded = _run("adaptive")
    recorded["knob_defaults"] = {"adaptive": {**knob_defaults()["adaptive"], "prefetch": "off"}}
    today = _run("adaptive")
    today["arms"][0]["batch_id"] = 2  # another run of the same figures
    mixed = combine_results([recorded, _run("adaptive:prefetch=off"), today])
    assert {n: m["runs"] for n, m in mixed.means.items()} == {"adaptive:prefetch=off": 2,
                                                               "adaptive": 1}
    # The older files' fixed arms: their defaults have not changed, so they pool.
    fixed = [_run("fixed-15"), _run("fixed-15:tail=off")]
    for run in fixed:
        run["knob_defaults"] = None
    assert combine_results(fixed).means["fixed-15"]["runs"] == 2


def test_a_bench_runs_an_arm_once_whatever_its_spelling() -> None:
    # adaptive:kv_high=0.9 is adaptive (its kv_high is 0.9): one arm, not two run apart.
    arms, _ = plan_arms("adaptive,adaptive:kv_high=0.9,fixed-8,fixed-8:tail=off", {}, None, None)
    assert arms == ["adaptive", "adaptive:tail=off", "fixed-8"]


def test_combine_marks_each_run_with_the_call_it_came_in() -> None:
    # A file is a call: its runs share a host's and a server's state, and the lead verdict
    # needs to know which runs did (tests/unit/bench/test_schedulers_lead.py).
    joined = combine_results([_run("fixed-15"), _run("adaptive")]).to_json()
    assert [a["call"] for a in joined["arms"]] == ["0", "1"]
    again = combine_results([joined, _run("fixed-8")])
    assert [a["call"] for a in again.arms] == ["0.0", "0.1", "1"]
    assert again.means["adaptive"]["runs_call"] == ["0.1"]


def test_a_combined_file_beside_its_part_is_refused_though_its_names_changed() -> None:
    part = _run("fixed-15:tail=off")
    joined = combine_results([part, _run("fixed-8")]).to_json()
    assert joined["arms"][0]["strategy"] == "fixed-15"
    with pytest.raises(InputError, match="given twice"):
        combine_results([joined, part])


@pytest.mark.parametrize(("facts", "profile"), [
    # A server started by hand, its /metrics read: the profile is only this client's setting.
    (HAND_STARTED, None),
    # The launcher's record of the server it started (``serving.launcher.start``).
    ({"profile": "h200-moe", "root_url": "http://127.0.0.1:8000", "kv_cache_tokens": 4096},
     "h200-moe")])
def test_the_bench_records_the_model_and_profile_the_server_gives_not_the_settings(
        facts: dict[str, Any], profile: str | None) -> None:
    # The settings name smollm2-135m and cpu-tiny; /v1/models lists another name. Before,
    # machine.model and .profile were the settings', so `bench combine` compared this
    # client's settings, not the servers it ran against.
    settings = load_settings(check_context_length=False)
    machine = machine_facts(settings, facts, [{"id": "qwen-moe", "root": "/models/q"}])
    assert (machine.model, machine.profile) == ("qwen-moe", profile)
    assert machine_facts(settings, facts).model is None  # /v1/models not read: not known


@pytest.mark.parametrize(("served", "model"), [
    ([{"id": "q"}, {"id": "q"}], "q"),
    # Another model behind the second endpoint: before, machine.model was the first's.
    ([{"id": "q"}, {"id": "other"}], None),
    ([{"id": "q"}, None], None)])  # the second's /v1/models not read: not known
def test_the_bench_records_what_each_endpoint_serves(
        served: list[dict[str, Any] | None], model: str | None) -> None:
    settings = load_settings(check_context_length=False,
                             llm_base_url="http://a:8000/v1,http://b:8000/v1")
    machine = machine_facts(settings, {}, served)
    assert machine.models == [(entry or {}).get("id") for entry in served]
    assert machine.model == model
