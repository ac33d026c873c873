"""``nightdesk run / rerun / ranking``: run batches and read their ranking."""

from __future__ import annotations

import csv
import json
import sys
from datetime import date
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.table import Table

from agents.tickers import check_symbol
from app.batch.engine import BatchOutcome, BatchPlan
from app.batch.nightly import NightlyRequest, default_as_of, execute_plan, run_nightly
from app.batch.signals import run_batch
from app.cli.common import database, setup
from app.cli.data import parse_as_of
from app.config import Settings
from app.quality.monitor import warnings_for
from app.ranking import as_dicts, ranking
from serving.facts import batch_server_facts

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

Strategy = Annotated[str, typer.Option("--strategy",
                                       help="adaptive (default; adaptive:tail=off,kv_high=0.95 "
                                            "sets knobs), sequential or fixed-N")]
Samples = Annotated[int, typer.Option("--samples", min=1, max=32,
                                      help="independent samples per ticker")]
AsOf = Annotated[str | None, typer.Option("--as-of",
                                          help="YYYY-MM-DD (default: newest snapshot)")]


def _default_as_of(settings: Settings, text: str | None) -> date:
    return parse_as_of(text) if text is not None else default_as_of(settings)


def _print_outcome(outcome: BatchOutcome, planned: int) -> None:
    style = "green" if not outcome.failed else "yellow" if outcome.succeeded else "red"
    err.print(f"[{style}]batch {outcome.batch_id} {outcome.status}:[/] "
              f"{len(outcome.succeeded)} succeeded, {len(outcome.failed)} failed "
              f"of {planned}")
    for ticker, reason in sorted(outcome.failed.items()):
        err.print(f"  [red]{ticker}[/]: {reason}")


def _execute(settings: Settings, plan: BatchPlan) -> BatchOutcome:
    outcome = execute_plan(settings, database(settings), plan)
    _print_outcome(outcome, len(plan.tickers))
    return outcome


def run(
    tickers: Annotated[str | None, typer.Option(
        "--tickers", help="A,B,C (default: NIGHTDESK_UNIVERSE_FILE, else the snapshot's "
                          "universe.txt)")] = None,
    universe: Annotated[Path | None, typer.Option("--universe",
                                                  help="file: one ticker per line")] = None,
    as_of: AsOf = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1,
                                              help="only the first N tickers")] = None,
    samples: Annotated[int | None, typer.Option(
        "--samples", min=1, max=32,
        help="independent samples per ticker (default: NIGHTDESK_SAMPLES)")] = None,
    strategy: Strategy = "adaptive",
) -> None:
    """Run the nightly batch over a universe (one at a time: a second start exits 4)."""
    settings = setup()
    request = NightlyRequest(as_of=_default_as_of(settings, as_of) if as_of else None,
                             tickers=tickers, universe=universe, limit=limit, samples=samples,
                             strategy=strategy)
    night = run_nightly(settings, request, engine=database(settings))
    if night.outcome is None:  # only a scheduled run skips a finished night
        return
    _print_outcome(night.outcome, night.tickers)
    if night.outcome.status != "succeeded":
        raise typer.Exit(1)


def rerun(
    ticker: Annotated[str, typer.Argument(help="ticker symbol")],
    as_of: AsOf = None,
    samples: Samples = 1,
) -> None:
    """Run one ticker again as its own batch (kind rerun); the ranking applies it."""
    settings = setup()
    plan = BatchPlan("rerun", _default_as_of(settings, as_of), [check_symbol(ticker)], samples)
    outcome = _execute(settings, plan)
    if outcome.status != "succeeded":
        raise typer.Exit(1)


def show_ranking(
    batch: Annotated[int | None, typer.Option("--batch", help="batch id (default: newest "
                                                               "finished nightly)")] = None,
    fmt: Annotated[Literal["table", "json", "csv"], typer.Option("--format")] = "table",
) -> None:
    """Print the ranking: rank, ticker, rating, mean score, spread, confidence, summary."""
    settings = setup()
    chosen, rows = ranking(database(settings), batch)
    demo = bool((chosen.settings or {}).get("demo_data"))
    data = [{**r, "demo": demo} for r in as_dicts(rows)]
    if fmt == "json":
        typer.echo(json.dumps(data, indent=2))
    elif fmt == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=list(data[0]) if data else ["rank"])
        writer.writeheader()
        writer.writerows(data)
    else:
        title = (f"{'DEMO DATA — ' if demo else ''}ranking of batch {chosen.id} "
                 f"({chosen.kind}, as of {chosen.as_of})")
        table = Table(title=title)
        for col in ("rank", "ticker", "rating", "score", "±", "conf", "summary"):
            table.add_column(col, overflow="fold")
        for r in rows:
            # "!": a sample's own rating contradicts its own score (see `nightdesk quality`).
            flag = " !" if r.contradicting else ""
            table.add_row(str(r.rank or "—"), r.ticker, (r.rating or r.status.upper()) + flag,
                          "" if r.score is None else f"{r.score:+.2f}",
                          "" if r.spread is None or r.samples < 2 else f"{r.spread:.2f}",
                          "" if r.confidence is None else f"{r.confidence:.2f}", r.summary)
        out.print(table)
        if any(r.contradicting for r in rows):
            out.print("! = rating outside its score band in at least one sample")
    for message in warnings_for(database(settings), chosen.id):
        # On stderr, so that json and csv output stays machine-readable.
        err.print(f"[yellow]warning:[/] batch {chosen.id}: {message}")


def replay(
    batch: Annotated[int, typer.Option("--batch", help="recorded batch to replay")],
    base_url: Annotated[str | None, typer.Option(
        "--base-url", help="server to replay against (default: NIGHTDESK_LLM_BASE_URL)")] = None,
    label: Annotated[str | None, typer.Option("--label", help="name of this arm")] = None,
    strategy: Strategy = "adaptive",
    free_output: Annotated[bool, typer.Option(
        "--free-output", help="let outputs end where the model stops, instead of matching "
                              "the recorded output lengths")] = False,
) -> None:
    """Replay a batch's recorded requests against a server, as a batch of kind replay."""
    from app.batch.replay import replay_batch

    settings = setup()
    if base_url is not None:
        settings = settings.model_copy(update={"llm_base_url": base_url})
    engine = database(settings)
    facts = batch_server_facts(settings.server_profile, settings.base_url,
                               settings.server_dir)
    outcome = run_batch(replay_batch(settings, engine, batch, label=label, strategy=strategy,
                                     match_output=not free_output, server_facts=facts))
    err.print(f"replay batch {outcome.batch_id} {outcome.status}: "
              f"{len(outcome.succeeded)} tickers replayed, {len(outcome.failed)} with errors")
    for ticker, reason in sorted(outcome.failed.items()):
        err.print(f"  [red]{ticker}[/]: {reason}")
    err.print(f"compare: nightdesk report --compare {batch},{outcome.batch_id}")
    if outcome.status != "succeeded":
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the batch commands to the top-level app."""
    app.command("replay")(replay)
    app.command("run")(run)
    app.command("rerun")(rerun)
    app.command("ranking")(show_ranking)
