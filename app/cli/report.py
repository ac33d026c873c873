"""``nightdesk report``: what a batch did and where its time went."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.table import Table

from app.cli.common import database, setup
from app.report import BatchReport, batch_report, latest_batch_id


def render_table(report: BatchReport, console: Console) -> None:
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
    ):
        summary.add_row(key, str(value))
    console.print(summary)
    nodes = Table(title="latency per node (s)")
    for col in ("node", "calls", "mean", "p50", "p99"):
        nodes.add_column(col, justify="left" if col == "node" else "right")
    for n in report.nodes:
        nodes.add_row(n.node, str(n.calls), f"{n.mean_s:.2f}", f"{n.p50_s:.2f}", f"{n.p99_s:.2f}")
    console.print(nodes)


def report(
    batch_id: Annotated[int | None, typer.Argument(help="Batch id (default: the newest).")] = None,
    fmt: Annotated[Literal["table", "json"], typer.Option("--format")] = "table",
) -> None:
    """Print a batch's calls, tokens, batch throughput and per-node latency."""
    settings = setup()
    engine = database(settings)
    result = batch_report(engine, batch_id if batch_id is not None else latest_batch_id(engine))
    if fmt == "json":
        typer.echo(json.dumps(result.to_json(), indent=2))
    else:
        render_table(result, Console())
