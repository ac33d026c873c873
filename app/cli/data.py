"""``nightdesk data``: write the demo snapshot, freeze any provider's data, show prompt text."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path
from typing import Annotated

import typer

from agents.data import PROVIDERS, get_provider
from agents.data.demo import COMPANIES, DEFAULT_TICKERS, DEMO_AS_OF, demo_tickers, write_demo
from agents.data.freeze import freeze as freeze_snapshot
from agents.tickers import check_symbol, choose_tickers
from app.cli.common import MAX_COUNT, setup, writable
from app.cli.logs import console
from app.errors import DataError, InputError
from app.runs.nightly import default_as_of

app = typer.Typer(no_args_is_help=True, help="Market-data snapshots: demo, freeze, show.")
out = console()
err = console(stderr=True)


def parse_as_of(text: str | None, default: date | None = None) -> date:
    """Parse a YYYY-MM-DD date option; InputError on anything else."""
    if text is None:
        if default is None:
            raise InputError("--as-of is required (YYYY-MM-DD)")
        return default
    try:
        # Python also reads 20261127 and 2026-W48-5 as dates; the option promises one form.
        if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text):
            raise ValueError(text)
        return date.fromisoformat(text)
    except ValueError:
        raise InputError(f"invalid --as-of {text!r}: expected YYYY-MM-DD") from None


@app.command()
def demo(
    as_of: Annotated[str | None, typer.Option("--as-of", help="YYYY-MM-DD")] = None,
    tickers: Annotated[int, typer.Option("--tickers", min=1, max=len(COMPANIES),
                                                   help="how many demo tickers")] = (
        DEFAULT_TICKERS),
    out_dir: Annotated[Path | None, typer.Option("--out", help="default: data_dir")] = None,
) -> None:
    """Write the seeded DEMO snapshot (synthetic data; same bytes every time)."""
    settings = setup()
    day = parse_as_of(as_of, DEMO_AS_OF)
    demo_tickers(tickers)  # validate the count before writing anything
    writable(out_dir, "--out", folder=True)
    folder = write_demo(out_dir or settings.paths.data_dir, day, tickers)
    out.print(f"wrote DEMO snapshot (synthetic data) of {tickers} tickers for {day} to {folder}")
    out.print(f"universe: {folder / 'universe.txt'}")


@app.command()
def freeze(
    provider: Annotated[str, typer.Option("--provider", help=" | ".join(PROVIDERS))],
    as_of: Annotated[str, typer.Option("--as-of", help="YYYY-MM-DD")],
    tickers: Annotated[str | None, typer.Option("--tickers", help="A,B,C")] = None,
    universe: Annotated[Path | None, typer.Option("--universe", help="one ticker per line")] = (
        None),
    out_dir: Annotated[Path | None, typer.Option("--out", help="default: data_dir")] = None,
    source_dir: Annotated[Path | None, typer.Option(
        "--source-dir", help="snapshot provider's directory (default: data_dir)")] = None,
    forward_days: Annotated[int, typer.Option(
        "--forward-days", min=0, max=MAX_COUNT,
        help="sessions after as-of to keep, for scoring")] = 60,
) -> None:
    """Write a snapshot of TICKERS from any provider, so a night's inputs can be replayed."""
    settings = setup()
    day = parse_as_of(as_of)
    symbols, notes = choose_tickers(tickers, universe)
    for note in notes:
        err.print(f"note: {note}")
    writable(out_dir, "--out", folder=True)
    if source_dir is not None and not source_dir.is_dir():
        # Bad input, not a failed run: each ticker would fail "no snapshot" and exit 1.
        raise InputError(f"--source-dir {source_dir}: no such folder")
    source = get_provider(provider, source_dir or settings.paths.data_dir)
    target = out_dir or settings.paths.data_dir
    result = freeze_snapshot(source, symbols, day, target, forward_days=forward_days)
    for reason in result.failed.values():
        err.print(f"[red]failed:[/] {reason}")
    if not result.frozen:
        raise DataError(f"froze nothing: all {len(symbols)} tickers failed")
    out.print(f"froze {len(result.frozen)} of {len(symbols)} tickers from {provider} "
              f"for {day} to {result.directory}")
    if result.left:
        err.print(f"note: {len(result.left)} ticker folder(s) of an earlier freeze of {day} "
                  f"are not in this snapshot and are not read: {', '.join(result.left)}",
                  markup=False)


@app.command()
def show(
    ticker: Annotated[str, typer.Argument(help="ticker symbol")],
    as_of: Annotated[str | None, typer.Option(
        "--as-of", help="YYYY-MM-DD (default: the date a night would take: the newest "
        "snapshot; with a live provider, today's date on this host)")] = None,
    provider: Annotated[str | None, typer.Option("--provider", help=" | ".join(PROVIDERS))] = (
        None),
    rows: Annotated[int, typer.Option("--rows", min=1, max=MAX_COUNT,
                                                help="price rows to show")] = 20,
) -> None:
    """Print the data sections the analysts would see for TICKER."""
    from agents.data.render import (
        render_fundamentals,
        render_indicators,
        render_news,
        render_prices,
        render_social,
    )

    settings = setup()
    day = parse_as_of(as_of) if as_of is not None else default_as_of(settings, provider)
    source = get_provider(provider or settings.agents.data_provider, settings.paths.data_dir)
    try:
        bundle = source.load(check_symbol(ticker), day)
    except DataError as error:
        # The ticker or date asked for has no data: bad input (exit 2), as `run` refuses it.
        raise InputError(str(error)) from None
    for section in (render_prices(bundle, max_rows=rows), render_indicators(bundle),
                    render_fundamentals(bundle), render_news(bundle), render_social(bundle)):
        out.print(section, markup=False)
