"""``nightdesk bench``: measure nightdesk's own overheads (not timed tests; reports).

The benches against fake servers (tracker overhead, the simulated fleet) are not here: they
need the tests' fakes, so they run from a checkout (tests/bench/, ``make bench-tracker``,
``make bench-fleet``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table

from app.cli.common import MAX_COUNT, database, figures, setup, ticker_count, writable
from app.cli.logs import console
from app.config import Store
from app.errors import InputError
from app.morning.numbers import number

if TYPE_CHECKING:
    from app.bench.schedulers import BenchResult

app = typer.Typer(no_args_is_help=True, help="Measure nightdesk's own overheads.")


@app.command("schedulers")
def schedulers(
    tickers: Annotated[int, ticker_count("Tickers in the workload.")] = 32,
    workload: Annotated[str, typer.Option(
        help="synthetic (the nightly per-node shape, scaled) or recorded:BATCH_ID")] = "synthetic",
    scale: Annotated[float | None, typer.Option(
        help="Synthetic prompt scale (default: the largest that fits max-model-len).")] = None,
    output_scale: Annotated[float | None, typer.Option(
        help="Synthetic output scale (default: same as --scale).")] = None,
    strategies: Annotated[str, typer.Option(
        help="Comma-separated arms, run in this order; 'sweep' is the fixed-N sweep chosen "
             "from the server's KV cache and the workload; each adaptive arm is followed by "
             "its twin with tail=off; fixed-N:tail=on,prefetch=on gives a fixed arm "
             "adaptive's tail rule and prefetching.")] = "fixed-3,sweep,fixed-all,adaptive",
    json_out: Annotated[Path | None, typer.Option(help="Also write the figures here.")] = None,
    warmup: Annotated[int, typer.Option(
        min=0, max=MAX_COUNT, help="Tickers whose requests (short answers) warm the server "
                                   "up first, untimed; 0: none.")] = 1,
    plan: Annotated[bool, typer.Option(
        "--plan", help="Print the arms (the sweep worked out) and stop, running none.")]
        = False,
    repeat: Annotated[int, typer.Option(
        min=1, max=MAX_COUNT, help="Run every arm this many times, interleaved; verdicts "
                                   "use the means and test each adaptive arm's lead on the "
                                   "runs (Welch's t).")] = 1,
) -> None:
    """Drive one workload with several strategies against the running server; find the ceiling.

    The ceiling is the best fixed schedule that respects the graph (sequential, fixed-N,
    fixed-all); the graph bound is what any such schedule could get from this server,
    modelled from the run's readings (flood, which ignores dependencies, is no target).
    """
    import asyncio

    import httpx

    from app.bench.arms import check_arms, plan_arms
    from app.bench.schedulers import run_bench
    from app.bench.workloads import fit_scale, synthetic_workload
    from app.errors import ServerError
    from app.morning.batchids import parse_batch_id
    from app.runs.replay import recorded_workload
    from serving.facts import batch_server_facts
    from serving.urls import redact, server_root

    settings = setup()
    # Everything the operator wrote is read before any server is asked: with none up, a typo
    # would otherwise be hidden behind "no server answers".
    check_arms(strategies)
    writable(json_out)
    for option, value in (("--scale", scale), ("--output-scale", output_scale)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise InputError(f"{option} takes a number above 0 (got {value:g})")
    engine = database(settings)
    recorded_load = None
    if workload.startswith("recorded:"):
        recorded = parse_batch_id(workload[9:], what="--workload recorded:BATCH_ID")
        _, recorded_load = recorded_workload(engine, recorded)
    elif workload != "synthetic":
        raise InputError(f"--workload takes synthetic or recorded:BATCH_ID (got {workload!r})")
    lengths, served = [], []
    for url in settings.llm.urls:  # every endpoint must answer; the smallest length rules
        root = server_root(url)
        try:
            models = httpx.get(f"{root}/v1/models", timeout=10).json()["data"]
        except (httpx.HTTPError, KeyError, ValueError) as error:
            raise ServerError(redact(f"no server answers at {root}: start one first "
                                     f"(nightdesk server start) — {error}")) from None
        lengths.append(int(models[0].get("max_model_len") or 8192))
        served.append(models[0])
    max_len = min(lengths)
    if recorded_load is None:
        chosen = scale if scale is not None else fit_scale(max_len)
        load = synthetic_workload(settings, tickers, chosen, output_scale)
        name = f"synthetic x{chosen:g} (out x{output_scale if output_scale else chosen:g})"
    else:
        load = dict(list(recorded_load.items())[:tickers])
        name = workload
    facts = batch_server_facts(settings.llm.server_profile, settings.llm.url,
                               settings.paths.server_dir, settings.llm.router_urls)
    arms, sweep = plan_arms(strategies, load, facts.get("kv_cache_tokens"),
                            facts.get("max_num_seqs"), len(settings.llm.urls))
    if sweep is not None:
        typer.echo(f"sweep: fixed-{', fixed-'.join(map(str, sweep.sizes))} around n* = "
                   f"{sweep.n_star} ({sweep.kv_tokens or 'unknown'} KV tokens, max_num_seqs "
                   f"{sweep.max_num_seqs or 'unknown'}, {sweep.chain_request_tokens:.0f} tokens "
                   f"per chain request, {sweep.endpoints} endpoint(s))")
    typer.echo("arms: " + " ".join(arms) + (f", each {repeat} times interleaved"
                                             if repeat > 1 else ""))
    if plan:
        return
    result = asyncio.run(run_bench(settings, engine, load, name=name, strategies=arms,
                                   warmup_tickers=warmup, server_facts=facts,
                                   sweep=sweep.to_json() if sweep else None,
                                   repeat=repeat, served=served))
    show_schedulers(result, json_out)


def show_schedulers(result: BenchResult, json_out: Path | None) -> None:
    """Print a scheduler bench's table, references and checks; write its JSON when asked."""
    from app.bench.bound import MIN_INTERVAL_LEVELS
    from app.bench.schedulers import ServerFlags, models_differ
    from app.morning.accounting import COMPARE_COLUMNS

    bound = (f"{result.bound_tok_s:.1f} tok/s" if result.bound_tok_s
             else "none (below)" if result.bound else "-")
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
    # No fixed arm made output: no ceiling, which "0.0 tok/s" would claim was measured.
    ceiling = (f"{result.ceiling_tok_s:.1f} tok/s ({result.ceiling_arm})" if result.ceiling_arm
               else "none (no fixed arm made output)")
    table = figures(f"scheduler bench: {result.workload}, {result.tickers} tickers, "
                    f"{result.requests} requests; ceiling {ceiling}; graph bound {bound}",
                    (header for header, _, _ in columns), {"strategy"})
    for a in result.arms:
        table.add_row(*(_named(a) if key == "strategy" else str(a.get(key)) if spec == "s"
                        else number(a.get(key), spec) for _, key, spec in columns))
    out = console()
    out.print(table)
    m = result.machine
    out.print(f"machine: {m['cpu_model']}, {m['cores']} cores, Python {m['python']}, host "
                  f"{m.get('host', '-')}, code {m.get('commit', '-')}; server "
                  f"{m['model'] or 'not told'} (profile {m['profile'] or 'not told'}) at "
                  f"{m['server']}; {m['date']}")
    if differ := models_differ(m):
        out.print(f"[bold red]WARNING[/]: the endpoints serve different models "
                  f"({escape(differ)}): these figures are of no one model (machine.model is "
                  "null)")
    out.print(ServerFlags.model_validate(m.get("server_flags") or {}).line())
    if result.mixed:
        out.print("[bold red]mixed runs[/] (--allow-mixed): " + "; ".join(
            f"{what}: {len(values)} values" for what, values in result.mixed.items()))
    if result.unchecked:
        out.print(f"not compared (no run records it): {', '.join(result.unchecked)}")
    if result.bound and result.bound.get("unavailable"):
        out.print(f"graph bound: none for this run ({result.bound['unavailable']})")
    elif result.bound:
        b, step = result.bound, result.bound["step"]
        out.print(
            f"graph bound {result.bound_tok_s:.1f} tok/s, set by {b['binding']}: "
            f"{b['graph']['output_tokens']} output tokens in {b['steps']:.0f} server steps at "
            f"least (KV {b['kv_tokens']} tokens, max_num_seqs {b['max_num_seqs']} from "
            f"{b['max_num_seqs_from']}, {b['endpoints']} endpoint(s)), each step "
            f"{step['a'] * 1000:.2f} ms + {step['b'] * 1000:.3f} ms per running request "
            f"(fitted to {step['levels']} levels of the run's readings)")
        if b.get("interval_90_tok_s"):
            low, high = b["interval_90_tok_s"]
            out.print(f"  the bound's 90% interval: {low:.1f}–{high:.1f} tok/s (the step refitted "
                      f"to its reading levels resampled; each ratio to it moves as much)")
        else:
            levels = f"{step['levels']} level{'' if step['levels'] == 1 else 's'}"
            out.print(f"  no interval for the bound: {levels} of readings, fewer than the "
                      f"{MIN_INTERVAL_LEVELS} a 90% interval of the fit holds its 90% from")
    if result.sweep:
        out.print(f"fixed-N sweep: {result.sweep['sizes']} around n* = "
                      f"{result.sweep['n_star']} ({result.sweep['rule']})")
    if result.warmup:
        w = result.warmup
        out.print(f"warm-up before the arms (untimed): {w.requests} requests of "
                      f"{w.tickers} ticker(s) at once per endpoint, {w.max_tokens} output "
                      f"tokens each, {w.seconds:.1f} s")
    for a in result.arms:
        for line in _admission_lines(a):
            out.print(f"  {a['strategy']}: {line}")
    for a in result.arms:
        for line in _endpoint_lines(a):
            out.print(line)
    if any(m["runs"] > 1 for m in result.means.values()):
        out.print(_means_table(result))
    for check, ok in result.checks.items():
        out.print(f"  {'met   ' if ok else 'MISSED'}  {check}")
    for verdict in result.verdicts:
        out.print(f"  {verdict}")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result.to_json(), indent=2, default=str) + "\n")


def _named(arm: dict[str, Any]) -> str:
    """Name an arm as combined (``canonical_arm``), and as the operator typed it where that
    differs (``fixed-15:tail=off`` read as ``fixed-15``)."""
    typed = arm.get("strategy_as_run")
    return arm["strategy"] + (f" (run as {typed})" if typed and typed != arm["strategy"]
                              else "")


def _budget(budget: dict[str, Any]) -> str:
    return (f"token budget {budget['limit_tokens']} of {budget['kv_capacity_tokens']} KV "
            f"tokens at the end")


def _admission_lines(a: dict[str, Any]) -> list[str]:
    """Say how an arm's admission ended: its token budget, and what held new tickers back."""
    admission = a.get("admission") or {}
    budget, lines = admission.get("token_budget"), []
    if budget and budget.get("kv_capacity_tokens"):
        lines.append(f"{_budget(budget)} (factor {budget['factor']}, peak "
                     f"{budget.get('factor_peak', '-')}, correction {budget['correction']}, "
                     f"{budget['tokens_per_byte']} tokens/byte; last change: "
                     f"{budget['reason']})")
    elif a["strategy"].startswith("adaptive") and admission:
        lines.append("no KV capacity to budget by (no vllm:cache_config_info): admission by "
                     "request count")
    held = admission.get("new_tickers_held_back") or {}
    if held.get("readings"):
        lines.append(f"while tickers waited to start ({held['readings']} readings), what was "
                     "short: " + ", ".join(f"{reason} {share:.0%}"
                                           for reason, share in held["share"].items()))
    return lines


def _endpoint_lines(a: dict[str, Any]) -> list[str]:
    """Give each endpoint's part of an arm that several served, and its token budget."""
    shares, lines = a.get("endpoints") or [], []
    if len(shares) > 1:
        lines.append(f"  {a['strategy']}: " + "; ".join(
            f"{e['endpoint']} {e['output_tokens_per_s']:.1f} tok/s, {e['tickers']} tickers, "
            f"KV peak {number(e['kv_usage_max'], '.0%')}, preemptions "
            f"{number(e['preemptions'], '.0f')}" for e in shares)
            + f" (total {a['output_tokens_per_s']:.1f} tok/s)")
    for url, part in ((a.get("admission") or {}).get("endpoints") or {}).items():
        if budget := part.get("token_budget"):
            lines.append(f"    {url}: {_budget(budget)} ({budget['reason']}); "
                         f"{part['tickers_started']} tickers started, "
                         f"{part['tickers_moved_in']} moved in")
    return lines


def _means_table(result: BenchResult) -> Table:
    """Return each arm's mean over its runs, with their spread."""
    means = figures("each arm over its runs (the checks use these means)",
                    ("strategy", "runs", "mean tok/s", "min", "max", "spread", "preemptions"),
                    {"strategy"})
    for m in result.means.values():
        spread = m["spread_tok_s"]
        typed = sorted({a.get("strategy_as_run") or a["strategy"] for a in result.arms
                        if a["strategy"] == m["strategy"]})
        means.add_row(m["strategy"] + (f" (run as {', '.join(typed)})"
                                       if typed != [m["strategy"]] else ""),
                      str(m["runs"]), f"{m['output_tokens_per_s']:.1f}",
                      f"{m['min_tok_s']:.1f}", f"{m['max_tok_s']:.1f}",
                      "-" if spread is None else f"{spread:.1f}" + (
                          f" ({spread / m['output_tokens_per_s']:.1%})"
                          if m["output_tokens_per_s"] > 0 else ""),
                      number(m["preemptions"], ".0f"))
    return means


@app.command("combine")
def combine(
    files: Annotated[list[Path], typer.Argument(help="JSON files of bench schedulers runs.")],
    json_out: Annotated[Path | None, typer.Option(help="Also write the figures here.")] = None,
    allow_mixed: Annotated[bool, typer.Option(
        "--allow-mixed", help="Combine runs whose code commit, host, server flags or number "
                              "of endpoints differ (the result then says what differed).")]
        = False,
) -> None:
    """Put arms run in separate calls (same workload, same server) in one table and judge them.

    The ceiling, the graph bound and the checks are worked out again over all the arms.
    Runs of another code commit, host, server flags or number of endpoints are refused
    unless --allow-mixed.
    """
    from agents.errors import os_said
    from app.bench.schedulers import check_result, combine_results

    setup()
    writable(json_out)
    loaded = []
    for path in files:
        try:
            loaded.append(json.loads(path.read_text()))
        except (OSError, ValueError) as error:
            raise InputError(f"cannot read bench JSON {path}: {os_said(error)}") from None
        try:
            check_result(loaded[-1])
        except InputError as error:
            raise InputError(f"{path} {error}") from None
    show_schedulers(combine_results(loaded, allow_mixed=allow_mixed,
                                    names=[str(path) for path in files]), json_out)


def _postgresql_url(text: str) -> str:
    """Return ``--pg-url`` as the settings read a database URL; InputError in one line for
    anything but a PostgreSQL URL (before, a traceback from SQLAlchemy; "" took SQLite)."""
    try:
        url = Store.model_validate({"database_url": text}).database_url
    except ValidationError:
        url = ""
    if not url.startswith("postgresql"):
        raise InputError(f"--pg-url takes a PostgreSQL URL, like postgresql://user:<password>@"
                         f"host:5432/nightdesk (got {text!r})")
    return url


@app.command("durability")
def durability(
    runs: Annotated[int, typer.Option(
        min=1, max=MAX_COUNT, help="Pipeline runs per mode (interleaved).")] = 20,
    pg_url: Annotated[str | None, typer.Option(
        parser=_postgresql_url,
        help="Measure on this PostgreSQL database instead of a temporary SQLite file.")] = None,
    reply_chars: Annotated[int, typer.Option(
        min=1, max=MAX_COUNT,
        help="Characters per node's answer (what each checkpoint carries).")] = 4000,
    json_out: Annotated[Path | None, typer.Option(help="Also write the figures here.")] = None,
) -> None:
    """Measure what a checkpointed node costs with durability none, exit, async and sync."""
    import asyncio

    from app.bench.durability import MODES, run_durability_bench, write_json

    settings = setup()
    writable(json_out)
    result = asyncio.run(run_durability_bench(settings, pg_url, runs=runs,
                                              reply_chars=reply_chars))
    table = figures(f"checkpoint durability on {result.database}: median of {runs} runs of "
                    f"{result.nodes_per_run} nodes, {reply_chars}-character answers",
                    ("mode", "ms/node", "+ms/node vs none"), {"mode"})
    for mode in MODES:
        table.add_row(mode, f"{result.ms_per_node[mode]:.2f}", f"{result.added_ms(mode):+.2f}")
    out = console()
    out.print(table)
    m = result.machine
    out.print(f"{m['cpu_model']}, {m['cores']} cores, Python {m['python']}, {result.date}")
    if json_out is not None:
        write_json(result, json_out)
