"""``nightdesk report``: what a batch did and where its time went, or arms side by side."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table

from app.batch.resume import mark_stale_crashed
from app.cli.common import database, setup
from app.errors import InputError
from app.quality.monitor import warnings_for
from app.report import (
    BatchReport,
    EndpointShare,
    arm,
    batch_report,
    endpoint_shares,
    latest_batch_id,
)
from app.serverview import BOUND_NAMES, LOOKUPS_SLACK, ServerView, server_view
from app.timeline import Interval, batch_timeline, timeline_json


def _fmt(value: Any, spec: str = ".1f") -> str:
    if value is None:
        return "—"
    return format(value, spec) if isinstance(value, float) else str(value)


def held_back_by(view: ServerView) -> str:
    """Say which bound held the most busy readings, with every bound's share."""
    if not view.bound or not view.bound_shares:
        return "—"
    name = BOUND_NAMES[view.bound]
    if view.bound == "client" and view.request_cap:
        name += f" ({view.request_cap} per endpoint; the server had room)"
    rest = ", ".join(f"{key} {share:.0%}" for key, share in view.bound_shares.items())
    return f"{name}: {view.bound_shares[view.bound]:.0%} of busy readings ({rest})"


def render_table(report: BatchReport, view: ServerView, console: Console) -> None:
    summary = Table(title=f"batch {report.batch_id}", show_header=False)
    for key, value in (
        ("calls", report.calls),
        ("failed calls", report.failed_calls),
        ("prompt tokens", report.prompt_tokens),
        ("completion tokens", report.completion_tokens),
        ("first call start", report.first_call_start),
        ("last call end", report.last_call_end),
        ("wall seconds", f"{report.wall_seconds:.1f}"),
        ("batch output tok/s", f"{report.output_tokens_per_s:.1f}"),
        ("  of tickers that succeeded", f"{report.succeeded_output_tokens_per_s:.1f}"),
    ):
        summary.add_row(key, str(value))
    if report.metrics_fallback:
        fb = report.metrics_fallback
        summary.add_row("admission fallback",
                        f"{fb['readings_missed']} readings of /metrics missed over "
                        f"{fb['seconds']} s: adaptive held at {fb['limit']} and paused")
    console.print(summary)
    server = Table(title=f"the server's view ({view.samples} samples of /metrics)",
                   show_header=False)
    for key, value in (
        ("running: mean / p50 / max", f"{_fmt(view.running_mean)} / {_fmt(view.running_p50)}"
                                      f" / {_fmt(view.running_max, '.0f')}"),
        ("waiting: mean / max", f"{_fmt(view.waiting_mean)} / {_fmt(view.waiting_max, '.0f')}"),
        ("KV cache usage max", _fmt(view.kv_usage_max, ".0%")),
        ("preemptions", _fmt(view.preemptions, ".0f")),
        ("prompt / generation tokens (server)",
         f"{_fmt(view.prompt_tokens, '.0f')} / {_fmt(view.generation_tokens, '.0f')}"),
        ("prefill tokens computed", _fmt(view.prefill_tokens_computed, ".0f")),
        ("prefix cache hit rate", prefix_hits(view)),
        ("spec-decode acceptance", _fmt(view.spec_acceptance, ".1%")),
        ("request time", f"prefill {_fmt(view.prefill_time_s)} s, decode"
                         f" {_fmt(view.decode_time_s)} s (decode"
                         f" {_fmt(view.decode_time_share, '.0%')})"),
        ("time to first token from sending: mean (s)", _fmt(view.mean_ttft_s, ".2f")),
        ("  from the graph's issue: mean / p90 (s)",
         f"{_fmt(view.ttft_ready_mean_s, '.2f')} / {_fmt(view.ttft_ready_p90_s, '.2f')}"),
        ("held back by", held_back_by(view)),
        ("client loop lag max", client_lag(view)),
    ):
        server.add_row(key, value)
    console.print(server)
    nodes = Table(title="latency per node (s)")
    for col in ("node", "calls", "mean", "p50", "p99"):
        nodes.add_column(col, justify="left" if col == "node" else "right")
    for n in report.nodes:
        nodes.add_row(n.node, str(n.calls), f"{n.mean_s:.2f}", f"{n.p50_s:.2f}", f"{n.p99_s:.2f}")
    console.print(nodes)


def prefix_hits(view: ServerView) -> str:
    """Give the prefix-cache hit rate, or say why the server's counters cannot give it."""
    lookups = view.prefix_lookups_per_prompt_token
    if view.prefix_cache_hit_rate is None and lookups is not None and lookups > LOOKUPS_SLACK:
        return (f"— (the server looked prompts up {lookups:.1f}× per prompt token: requests "
                "waiting at a full cache are looked up again at every step)")
    return _fmt(view.prefix_cache_hit_rate, ".1%")


def client_lag(view: ServerView) -> str:
    """Say how far behind the client's own event loop fell, and what that means when it did."""
    if view.client_lag_max_s is None:
        return "—"
    text = f"{view.client_lag_max_s:.2f} s"
    if view.client_lag_readings_over_1s:
        text += (f" ({view.client_lag_readings_over_1s} readings over 1 s: the client fell "
                 "behind its streams and admission read stale gauges; start the server with "
                 "--stream-interval 16)")
    return text


def timeline_table(intervals: list[Interval]) -> Table:
    """Return the batch over time: where its makespan went fast and where slow."""
    table = Table(title="over time (from the first call; output spread over each call's "
                        "decode time)")
    for header in ("interval s", "output tok/s", "tickers in flight", "calls started",
                   "running mean", "KV max", "preemptions"):
        table.add_column(header, justify="right")
    for i in intervals:
        table.add_row(f"{i.start_s:.0f}–{i.end_s:.0f}", f"{i.output_tokens_per_s:.1f}",
                      f"{i.tickers_in_flight:.1f}", str(i.calls_started),
                      _fmt(i.running_mean), _fmt(i.kv_usage_max, ".0%"),
                      _fmt(i.preemptions, ".0f"))
    return table


def endpoint_table(shares: list[EndpointShare], report: BatchReport, view: ServerView) -> Table:
    """Return each endpoint's part of a batch, then the batch's total."""
    table = Table(title="endpoints (output tok/s over the batch's makespan: they add up)")
    for header in ("endpoint", "calls", "failed", "tickers", "output tok/s", "running mean",
                   "KV peak", "preemptions"):
        table.add_column(header, justify="left" if header == "endpoint" else "right")
    for share in shares:
        table.add_row(share.endpoint or "(not recorded)", str(share.calls),
                      str(share.failed_calls), str(share.tickers),
                      f"{share.output_tokens_per_s:.1f}", _fmt(share.running_mean),
                      _fmt(share.kv_usage_max, ".0%"), _fmt(share.preemptions, ".0f"))
    table.add_row("batch total", str(report.calls), str(report.failed_calls), "",
                  f"{report.output_tokens_per_s:.1f}", _fmt(view.running_mean),
                  _fmt(view.kv_usage_max, ".0%"), _fmt(view.preemptions, ".0f"),
                  style="bold")
    return table


COMPARE_COLUMNS = (
    ("batch", "batch_id", "d"), ("label", "label", "s"), ("span s", "makespan_s", ".1f"),
    ("output tok/s", "output_tokens_per_s", ".1f"),
    # Output of the tickers that succeeded (the figure before counts failed tickers' too).
    ("ok tok/s", "succeeded_output_tokens_per_s", ".1f"),
    ("prefill tok/s", "prefill_tokens_per_s", ".0f"),
    ("decode tok/s", "decode_tokens_per_s", ".1f"),
    ("prefix hit", "prefix_cache_hit_rate", ".1%"),
    ("prefill done", "prefill_tokens_computed", ".0f"),
    ("run mean", "running_mean", ".1f"), ("run max", "running_max", ".0f"),
    ("wait max", "waiting_max", ".0f"), ("KV max", "kv_usage_max", ".0%"),
    # Time to first token from sending (the server's queue and prefill), and from the
    # graph's issue of the call (our own gate's wait too): only the second is fair.
    ("preempt", "preemptions", ".0f"), ("TTFT s", "mean_ttft_s", ".2f"),
    ("TTFT rdy s", "ttft_ready_mean_s", ".2f"),
    ("decode share", "decode_time_share", ".0%"),
)


def compare_table(arms: list[dict[str, Any]], title: str = "arms side by side") -> Table:
    table = Table(title=title)
    for header, _, _ in COMPARE_COLUMNS:
        table.add_column(header, justify="left" if header == "label" else "right")
    for a in arms:
        table.add_row(*(_fmt(a[key], spec) if a[key] is not None and spec not in ("s", "d")
                        else str(a[key] if a[key] is not None else "—")
                        for _, key, spec in COMPARE_COLUMNS))
    return table


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--compare takes batch ids like 3,4 (got {text!r})") from None
    if len(ids) < 2:
        raise InputError("--compare needs at least two batch ids")
    return ids


def report(
    batch_id: Annotated[int | None, typer.Argument(help="Batch id (default: the newest).")] = None,
    fmt: Annotated[Literal["table", "json"], typer.Option("--format")] = "table",
    compare: Annotated[str | None, typer.Option("--compare", help="ID1,ID2,… side by side")] = (
        None),
) -> None:
    """Print a batch's calls, tokens, batch throughput, the server's view and node latency."""
    settings = setup()
    engine = database(settings)
    # A batch whose process died is reported as what it is, not as still running.
    for crashed in mark_stale_crashed(engine, settings.heartbeat_stale_s):
        Console(stderr=True).print(f"note: batch {crashed} had no heartbeat for over "
                                   f"{settings.heartbeat_stale_s:.0f} s: marked crashed "
                                   f"(`nightdesk run --resume {crashed}` continues it)",
                                   highlight=False, soft_wrap=True)
    if compare is not None:
        arms = [arm(engine, i) for i in _parse_ids(compare)]
        if fmt == "json":
            typer.echo(json.dumps(arms, indent=2, default=str))
        else:
            # Piped into a log or a doc: do not fold the columns into 80.
            Console(width=None if Console().is_terminal else 200).print(compare_table(arms))
        return
    chosen = batch_id if batch_id is not None else latest_batch_id(engine)
    result = batch_report(engine, chosen)
    view = server_view(engine, chosen)
    shares = endpoint_shares(engine, chosen)
    warnings = warnings_for(engine, chosen)
    intervals = batch_timeline(engine, chosen)
    if fmt == "json":
        typer.echo(json.dumps({**result.to_json(), "server": view.to_json(),
                               "endpoints": [asdict(share) for share in shares],
                               "over_time": timeline_json(intervals),
                               "warnings": warnings}, indent=2))
    else:
        console = Console()
        render_table(result, view, console)
        if len(shares) > 1:
            console.print(endpoint_table(shares, result, view))
        if intervals:
            console.print(timeline_table(intervals))
        for message in warnings:
            console.print(f"[yellow]warning:[/] {message}", highlight=False)
