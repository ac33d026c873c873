"""``nightdesk bench``: measure nightdesk's own overheads (not timed tests; reports)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table

from app.cli.common import setup

if TYPE_CHECKING:
    from app.bench.schedulers import BenchResult

app = typer.Typer(no_args_is_help=True, help="Measure nightdesk's own overheads.")


@app.command("tracker")
def tracker(
    calls: Annotated[int, typer.Option(help="Calls per arm and round.")] = 500,
    concurrency: Annotated[int, typer.Option(help="Calls in flight at once.")] = 64,
    database: Annotated[Literal["sqlite", "postgresql", "both"],
                        typer.Option(help="Where the tracked arm writes.")] = "both",
    pg_url: Annotated[str, typer.Option(help="PostgreSQL server; a private schema is "
                                             "created there and dropped after.")]
        = "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    repeats: Annotated[int, typer.Option(help="Interleaved rounds; medians are reported.")] = 15,
    json_out: Annotated[Path | None, typer.Option(help="Also write the figures here.")] = None,
) -> None:
    """Measure the wall time usage tracking adds per call against a zero-latency fake server."""
    from app.bench.tracker import run_tracker_bench

    setup()
    result = run_tracker_bench(calls, concurrency, database, pg_url, repeats)
    table = Table(title=f"tracker overhead: {calls} calls, {concurrency} concurrent, "
                        f"median of {repeats} rounds")
    for col in ("arm", "wall s", "ms/call", "+ms/call", "+CPU ms/call", "final flush s",
                "+ms/call incl. flush", "rows written"):
        table.add_column(col, justify="left" if col == "arm" else "right")
    for name, arm in result.arms.items():
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}"
        table.add_row(name, f"{arm.median_wall_s:.3f}", ms(arm.ms_per_call),
                      ms(arm.added_ms_per_call), ms(arm.added_cpu_ms_per_call),
                      "-" if name == "baseline" else f"{arm.median_flush_s:.3f}",
                      ms(arm.added_ms_per_call_with_flush),
                      "-" if name == "baseline" else ("all" if arm.rows_ok else "MISSING"))
    console = Console()
    if not console.is_terminal:
        # Piped into a log: do not fold the table into 80 columns.
        console = Console(width=130)
    console.print(table)
    m = result.machine
    console.print(f"{m['cpu_model']}, {m['cores']} cores, Python {m['python']}, {result.date}; "
                  f"target < {result.target_ms_per_call} ms/call added: "
                  + ("met" if result.meets_target() else "[bold red]missed[/]"))
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    if not all(a.rows_ok for a in result.arms.values()):
        raise typer.Exit(1)


@app.command("schedulers")
def schedulers(
    tickers: Annotated[int, typer.Option(help="Tickers in the workload.")] = 32,
    workload: Annotated[str, typer.Option(
        help="synthetic (the nightly per-node shape, scaled) or recorded:BATCH_ID")] = "synthetic",
    scale: Annotated[float | None, typer.Option(
        help="Synthetic prompt scale (default: the largest that fits max-model-len).")] = None,
    output_scale: Annotated[float | None, typer.Option(
        help="Synthetic output scale (default: same as --scale).")] = None,
    strategies: Annotated[str, typer.Option(
        help="Comma-separated arms, run in this order; 'sweep' is the fixed-N sweep chosen "
             "from the server's KV cache and the workload; each adaptive arm is followed by "
             "its twin with tail=off.")] = "fixed-3,sweep,fixed-all,adaptive",
    json_out: Annotated[Path | None, typer.Option(help="Also write the figures here.")] = None,
    warmup: Annotated[int, typer.Option(
        min=0, help="Tickers whose requests (short answers) warm the server up first, "
                    "untimed; 0: none.")] = 1,
    plan: Annotated[bool, typer.Option(
        "--plan", help="Print the arms (the sweep worked out) and stop, running none.")]
        = False,
) -> None:
    """Drive one workload with several strategies against the running server; find the ceiling.

    The ceiling is the best fixed schedule that respects the graph (sequential, fixed-N,
    fixed-all); the graph bound is what any such schedule could get from this server,
    modelled from the run's readings (flood, which ignores dependencies, is no target).
    """
    import asyncio

    import httpx

    from app.batch.workload import recorded_workload
    from app.batchids import parse_batch_id
    from app.bench.arms import plan_arms
    from app.bench.schedulers import run_bench
    from app.bench.workloads import fit_scale, synthetic_workload
    from app.cli.common import database
    from app.errors import InputError, ServerError
    from serving.facts import batch_server_facts
    from serving.urls import redact, server_root

    settings = setup()
    engine = database(settings)
    lengths = []
    for url in settings.base_urls:  # every endpoint must answer; the smallest length rules
        root = server_root(url)
        try:
            models = httpx.get(f"{root}/v1/models", timeout=10).json()["data"]
        except (httpx.HTTPError, KeyError, ValueError) as error:
            raise ServerError(redact(f"no server answers at {root}: start one first "
                                     f"(nightdesk server start) — {error}")) from None
        lengths.append(int(models[0].get("max_model_len") or 8192))
    max_len = min(lengths)
    if workload == "synthetic":
        chosen = scale if scale is not None else fit_scale(max_len)
        load = synthetic_workload(settings, tickers, chosen, output_scale)
        name = f"synthetic x{chosen:g} (out x{output_scale if output_scale else chosen:g})"
    elif workload.startswith("recorded:"):
        recorded = parse_batch_id(workload[9:], what="--workload recorded:BATCH_ID")
        _, load = recorded_workload(engine, recorded)
        load = dict(list(load.items())[:tickers])
        name = workload
    else:
        raise InputError(f"--workload takes synthetic or recorded:BATCH_ID (got {workload!r})")
    facts = batch_server_facts(settings.server_profile, settings.base_url, settings.server_dir)
    arms, sweep = plan_arms(strategies, load, facts.get("kv_cache_tokens"),
                            facts.get("max_num_seqs"), len(settings.base_urls))
    if sweep is not None:
        typer.echo(f"sweep: fixed-{', fixed-'.join(map(str, sweep.sizes))} around n* = "
                   f"{sweep.n_star} ({sweep.kv_tokens or 'unknown'} KV tokens, max_num_seqs "
                   f"{sweep.max_num_seqs or 'unknown'}, {sweep.chain_request_tokens:.0f} tokens "
                   f"per chain request, {sweep.endpoints} endpoint(s))")
    typer.echo("arms: " + " ".join(arms))
    if plan:
        return
    result = asyncio.run(run_bench(settings, engine, load, name=name, strategies=arms,
                                   warmup_tickers=warmup, server_facts=facts,
                                   sweep=sweep.to_json() if sweep else None))
    show_schedulers(result, json_out)


def show_schedulers(result: BenchResult, json_out: Path | None) -> None:
    """Print a scheduler bench's table, references and checks; write its JSON when asked."""
    from app.cli.report import _fmt
    from app.report import COMPARE_COLUMNS

    bound = f"{result.bound_tok_s:.1f} tok/s" if result.bound_tok_s else "-"
    table = Table(title=f"scheduler bench: {result.workload}, {result.tickers} tickers, "
                        f"{result.requests} requests; ceiling {result.ceiling_tok_s:.1f} tok/s "
                        f"({result.ceiling_arm or '-'}); graph bound {bound}")
    columns = [("strategy", "strategy", "s"), ("makespan s", "makespan_s", ".1f"),
               ("output tok/s", "output_tokens_per_s", ".1f"),
               ("ok tok/s", "succeeded_output_tokens_per_s", ".1f"),
               ("÷ ceiling", "ratio_to_ceiling", ".2f"),
               ("÷ bound", "ratio_to_bound", ".2f")] + [
        c for c in COMPARE_COLUMNS if c[1] in ("running_mean", "running_max", "waiting_max",
                                               "kv_usage_max", "preemptions", "mean_ttft_s",
                                               "ttft_ready_mean_s", "prefix_cache_hit_rate",
                                               "decode_time_share")]
    if result.server_bound_tok_s:
        columns.insert(6, ("÷ flood", "ratio_to_server_bound", ".2f"))
    for header, _, _ in columns:
        table.add_column(header, justify="left" if header == "strategy" else "right")
    for a in result.arms:
        table.add_row(*(str(a.get(key)) if spec == "s" else _fmt(a.get(key), spec)
                        for _, key, spec in columns))
    console = Console(width=190)
    console.print(table)
    m = result.machine
    console.print(f"machine: {m['cpu_model']}, {m['cores']} cores, Python {m['python']}, host "
                  f"{m.get('host', '-')}, code {m.get('commit', '-')}; server "
                  f"{m['model']} ({m['profile']}) at {m['server']}; {m['date']}")
    if result.mixed:
        console.print("[bold red]mixed runs[/] (--allow-mixed): " + "; ".join(
            f"{what}: {len(values)} values" for what, values in result.mixed.items()))
    if result.bound:
        b, step = result.bound, result.bound["step"]
        console.print(
            f"graph bound {result.bound_tok_s:.1f} tok/s, set by {b['binding']}: "
            f"{b['graph']['output_tokens']} output tokens in {b['steps']:.0f} server steps at "
            f"least (KV {b['kv_tokens']} tokens, max_num_seqs {b['max_num_seqs']} from "
            f"{b['max_num_seqs_from']}, {b['endpoints']} endpoint(s)), each step "
            f"{step['a'] * 1000:.2f} ms + {step['b'] * 1000:.3f} ms per running request "
            f"(fitted to {step['levels']} levels of the run's readings)")
    if result.sweep:
        console.print(f"fixed-N sweep: {result.sweep['sizes']} around n* = "
                      f"{result.sweep['n_star']} ({result.sweep['rule']})")
    if result.warmup:
        w = result.warmup
        console.print(f"warm-up before the arms (untimed): {w['requests']} requests of "
                      f"{w['tickers']} ticker(s) at once per endpoint, {w['max_tokens']} output "
                      f"tokens each, {w['seconds']:.1f} s")
    for a in result.arms:
        budget = (a.get("admission") or {}).get("token_budget")
        if budget:
            console.print(f"  {a['strategy']}: token budget {budget['limit_tokens']} of "
                          f"{budget['kv_capacity_tokens']} KV tokens at the end (factor "
                          f"{budget['factor']}, peak {budget.get('factor_peak', '-')}, "
                          f"correction {budget['correction']}, "
                          f"{budget['tokens_per_byte']} tokens/byte; last change: "
                          f"{budget['reason']})")
        elif a["strategy"].startswith("adaptive") and a.get("admission"):
            console.print(f"  {a['strategy']}: no token budget (KV capacity unknown or "
                          "budget=off): admission by request count")
        held = (a.get("admission") or {}).get("new_tickers_held_back") or {}
        if held.get("readings"):
            console.print(f"  {a['strategy']}: while tickers waited to start "
                          f"({held['readings']} readings), what was short: " + ", ".join(
                              f"{reason} {share:.0%}" for reason, share in held["share"].items()))
    for a in result.arms:
        shares = a.get("endpoints") or []
        if len(shares) > 1:
            console.print(f"  {a['strategy']}: " + "; ".join(
                f"{e['endpoint']} {e['output_tokens_per_s']:.1f} tok/s, {e['tickers']} tickers, "
                f"KV peak {_fmt(e['kv_usage_max'], '.0%')}, preemptions "
                f"{_fmt(e['preemptions'], '.0f')}" for e in shares)
                + f" (total {a['output_tokens_per_s']:.1f} tok/s)")
        for url, part in ((a.get("admission") or {}).get("endpoints") or {}).items():
            budget = part.get("token_budget")
            if budget:
                console.print(f"    {url}: token budget {budget['limit_tokens']} of "
                              f"{budget['kv_capacity_tokens']} KV tokens at the end "
                              f"({budget['reason']}); {part['tickers_started']} tickers "
                              f"started, {part['tickers_moved_in']} moved in")
    for check, ok in result.checks.items():
        console.print(f"  {'met   ' if ok else 'MISSED'}  {check}")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result.to_json(), indent=2, default=str) + "\n")


@app.command("combine")
def combine(
    files: Annotated[list[Path], typer.Argument(help="JSON files of bench schedulers runs.")],
    json_out: Annotated[Path | None, typer.Option(help="Also write the figures here.")] = None,
    allow_mixed: Annotated[bool, typer.Option(
        "--allow-mixed", help="Combine runs whose code commit, host or server flags differ "
                              "(the result then says what differed).")] = False,
) -> None:
    """Put arms run in separate calls (same workload, same server) in one table and judge them.

    The ceiling, the graph bound and the checks are worked out again over all the arms.
    Runs of another code commit, host or server flags are refused unless --allow-mixed.
    """
    from app.bench.schedulers import combine_results
    from app.errors import InputError

    setup()
    loaded = []
    for path in files:
        try:
            loaded.append(json.loads(path.read_text()))
        except (OSError, ValueError) as error:
            raise InputError(f"cannot read bench JSON {path}: {error}") from None
    show_schedulers(combine_results(loaded, allow_mixed=allow_mixed), json_out)


@app.command("fleet")
def fleet(
    tickers: Annotated[int, typer.Option(min=1, help="Demo tickers in the night.")] = 500,
    endpoints: Annotated[int, typer.Option(min=1, help="Simulated servers.")] = 8,
    speedup: Annotated[float, typer.Option(
        min=0.1, help="Time compression: each server step this many times shorter.")] = 4.0,
    scale: Annotated[float, typer.Option(help="Prompt text sent, x the production shape.")]
        = 0.2,
    output_scale: Annotated[float, typer.Option(help="Outputs, x the production shape.")] = 1.0,
    stream_interval: Annotated[int, typer.Option(
        min=1, help="Tokens per stream chunk (vLLM's --stream-interval).")] = 16,
    strategy: Annotated[str, typer.Option(help="The arm the client runs.")] = "adaptive",
    database: Annotated[Literal["sqlite", "postgresql"],
                        typer.Option(help="Where the usage rows go.")] = "postgresql",
    pg_url: Annotated[str, typer.Option(help="PostgreSQL server; a private schema is "
                                             "created there and dropped after.")]
        = "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    port: Annotated[int, typer.Option(help="The first endpoint's port (then +1 each).")]
        = 18100,
    json_out: Annotated[Path | None, typer.Option(help="Also write the figures here.")] = None,
) -> None:
    """Simulate a night over several H200-sized endpoints on 127.0.0.1, one client process.

    The servers (app/bench/fleet.py) run in a second process; prompts are sent at ``scale``
    of production's text and counted at production's size. Reports the client's event-loop
    lag, CPU and memory, usage rows written per second, routing, and the output against the
    endpoints' summed capacity and the graph bound.
    """
    import asyncio
    import contextlib
    import subprocess
    import sys
    import time
    from dataclasses import asdict, replace

    import httpx

    from app.bench.fleet import MODEL, FleetResult, GPUModel, capacity, drive
    from app.bench.tracker import machine_facts, postgres_schema, sqlite_database
    from app.bench.workloads import synthetic_workload
    from app.config import load_settings
    from app.db.engine import get_engine
    from app.errors import ServerError

    setup()
    gpu = replace(GPUModel(), speedup=speedup, prompt_weight=1.0 / scale,
                  stream_interval=stream_interval)
    ports = [port + i for i in range(endpoints)]
    urls = [f"http://127.0.0.1:{p}/v1" for p in ports]
    command = [sys.executable, "-m", "app.bench.fleet", "--ports", ",".join(map(str, ports)),
               "--speedup", str(gpu.speedup), "--prompt-weight", str(gpu.prompt_weight),
               "--stream-interval", str(gpu.stream_interval)]
    with contextlib.ExitStack() as stack:
        servers = subprocess.Popen(command, stdin=subprocess.DEVNULL)

        def stop() -> None:
            servers.terminate()
            try:
                servers.wait(timeout=15)
            except subprocess.TimeoutExpired:
                servers.kill()
                servers.wait()
        stack.callback(stop)
        deadline = time.monotonic() + 60
        for url in urls:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url.removesuffix("/v1") + "/health", timeout=2).is_success:
                        break
                if servers.poll() is not None or time.monotonic() > deadline:
                    raise ServerError(f"the simulated endpoint {url} did not start")
                time.sleep(0.2)
        db_url = stack.enter_context(postgres_schema(pg_url) if database == "postgresql"
                                     else sqlite_database())
        settings = load_settings(llm_base_url=",".join(urls), llm_model=MODEL,
                                 database_url=db_url, max_concurrency=256,
                                 metrics_interval_s=1.0, retry_backoff_s=0.5)
        engine = get_engine(db_url)
        load = synthetic_workload(settings, tickers, scale, output_scale)
        name = f"synthetic x{scale:g} sent, x1 counted (out x{output_scale:g})"
        arm_json, lag, use = asyncio.run(drive(settings, engine, load, gpu, strategy=strategy,
                                               name=name))
    arm = arm_json["arms"][0]
    rows = arm["calls"] + sum(len(v) for v in load.values())  # llm_calls and llm_requests
    result = FleetResult(
        tickers=tickers, endpoints=endpoints, gpu=asdict(gpu), workload=name, arm=arm,
        loop_lag=lag.summary(), process=use.to_json(),
        rows_per_s=rows / arm["makespan_s"] if arm["makespan_s"] else 0.0,
        capacity=capacity(arm, gpu, endpoints),
        machine={**machine_facts(), "database": database})
    show_fleet(result)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result.to_json(), indent=2) + "\n")


def show_fleet(result: Any) -> None:
    """Print a fleet simulation's figures."""
    from app.cli.report import _fmt

    a, c, lag, use = result.arm, result.capacity, result.loop_lag, result.process
    console = Console(width=150)
    console.print(f"fleet: {result.tickers} tickers over {result.endpoints} simulated "
                  f"endpoints (speedup {result.gpu['speedup']:g}), {result.workload}; "
                  f"{result.machine['cpu_model']}, {result.machine['cores']} cores")
    console.print(f"  makespan {a['makespan_s']:.1f} s, {a['calls']} calls, "
                  f"{a['failed_calls']} failed; output {a['output_tokens_per_s']:.0f} tok/s "
                  f"= {_fmt(c['share_of_summed_capacity'], '.2f')} of the summed capacity "
                  f"({c['summed_capacity_tok_s']:.0f} tok/s at "
                  f"{c['sequences_per_endpoint_at_full_cache']} sequences per endpoint); graph "
                  f"bound {_fmt(c['graph_bound_tok_s'], '.0f')} tok/s "
                  f"({c['graph_bound_binding']}), makespan {_fmt(c['share_of_graph_bound'], '.2f')}"
                  " of its best")
    console.print(f"  client loop lag: max {_fmt(lag['max_s'], '.3f')} s, p99 "
                  f"{_fmt(lag['p99_s'], '.3f')} s, p50 {_fmt(lag.get('p50_s'), '.4f')} s; CPU "
                  f"{use['cpu_s']:.1f} s over {use['wall_s']:.1f} s "
                  f"({use['cpu_share_of_one_core']:.0%} of a core); peak RSS "
                  f"{use['max_rss_mib']:.0f} MiB; rows written {result.rows_per_s:.1f}/s "
                  f"({result.machine['database']})")
    for share in a.get("endpoints") or []:
        part = ((a.get("admission") or {}).get("endpoints") or {}).get(share["endpoint"], {})
        console.print(f"  {share['endpoint']}: {share['output_tokens_per_s']:.0f} tok/s, "
                      f"{share['tickers']} tickers ({part.get('tickers_started', '-')} started, "
                      f"{part.get('tickers_moved_in', '-')} moved in), running mean "
                      f"{_fmt(share['running_mean'])}, KV peak "
                      f"{_fmt(share['kv_usage_max'], '.0%')}")


@app.command("durability")
def durability(
    runs: Annotated[int, typer.Option(help="Pipeline runs per mode (interleaved).")] = 20,
    pg_url: Annotated[str | None, typer.Option(
        help="Measure on this PostgreSQL database instead of a temporary SQLite file.")] = None,
    reply_chars: Annotated[int, typer.Option(
        help="Characters per node's answer (what each checkpoint carries).")] = 4000,
    json_out: Annotated[Path | None, typer.Option(help="Also write the figures here.")] = None,
) -> None:
    """Measure what a checkpointed node costs with durability none, exit, async and sync."""
    import asyncio

    from app.bench.durability import MODES, run_durability_bench, write_json

    settings = setup()
    result = asyncio.run(run_durability_bench(settings, pg_url, runs=runs,
                                              reply_chars=reply_chars))
    table = Table(title=f"checkpoint durability on {result.database}: median of {runs} runs "
                        f"of {result.nodes_per_run} nodes, {reply_chars}-character answers")
    for col in ("mode", "ms/node", "+ms/node vs none"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for mode in MODES:
        table.add_row(mode, f"{result.ms_per_node[mode]:.2f}", f"{result.added_ms(mode):+.2f}")
    console = Console(width=120)
    console.print(table)
    m = result.machine
    console.print(f"{m['cpu_model']}, {m['cores']} cores, Python {m['python']}, {result.date}")
    if json_out is not None:
        write_json(result, json_out)
