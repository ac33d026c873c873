"""``nightdesk bench``: measure nightdesk's own overheads (not timed tests; reports)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.table import Table

from app.cli.common import setup

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
