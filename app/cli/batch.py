"""``nightdesk run / rerun / ranking / changes``: run batches, read their ranking and changes.

Their exit codes are one table, docs/reliability.md's: 0 success, 1 failed, 2 bad settings
or input, 3 partial, 4 already running, 5 interrupted by a server outage, 130 stopped;
``ranking --require-fresh`` exits 6 when the ranking is not the latest night's.
"""

from __future__ import annotations

import functools
import shlex
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.markup import escape
from rich.table import Table
from sqlalchemy import Engine

from agents.tickers import check_symbol, choose_tickers
from app.batch.engine import BatchEngine, BatchOutcome, BatchPlan
from app.batch.signals import BatchInterrupted, run_batch
from app.cli.common import (
    MAX_TICKERS,
    Formats,
    batch_database,
    csv_columns,
    csv_of,
    database,
    echo_csv,
    echo_json,
    mark_crashed,
    setup,
)
from app.cli.data import parse_as_of
from app.cli.logs import console
from app.config import Settings
from app.db.batchsettings import BatchSettings
from app.db.models import batch_row
from app.errors import ERRORS, InputError
from app.morning.batchids import parse_batch_id
from app.morning.changes import (
    NO_NIGHT_BEFORE,
    UNFINISHED,
    RankedRow,
    TickerChange,
    compare_nights,
    ranked_row,
)
from app.morning.nightstatus import STALE_EXIT, NightStatus, night_status
from app.morning.numbers import counted
from app.morning.ranking import RankRow, from_reruns, ranking
from app.morning.summary import BatchSummary, summarize
from app.quality.monitor import warnings_for
from app.runs.nightly import (
    NOTHING_RECORDED,
    NightlyRequest,
    default_as_of,
    execute_plan,
    resume_recorded,
    run_nightly,
    tell_refused,
)
from app.runs.preflight import PreflightRefused, ServerCheck
from app.runs.resumable import ResumePoint
from app.traffic.strategy import Strategy as TrafficStrategy
from serving.facts import batch_server_facts

out = console()
err = console(stderr=True)


def _checked_strategy(text: str) -> str:
    """Return ``text`` once it names a strategy (InputError otherwise): read with the other
    arguments, so a typo is named before the lock, the server or the data are asked."""
    TrafficStrategy.parse(text)
    return text


STRATEGY_HELP = ("adaptive (default; adaptive:tail=off,kv_high=0.95 sets knobs), sequential "
                 "or fixed-N")
Strategy = Annotated[str, typer.Option("--strategy", parser=_checked_strategy,
                                       help=STRATEGY_HELP)]
# run's: None when not given, so that --resume (which keeps the batch's own) can refuse it.
RunStrategy = Annotated[str | None, typer.Option("--strategy", parser=_checked_strategy,
                                                 help=STRATEGY_HELP, show_default=False)]
Samples = Annotated[int, typer.Option("--samples", min=1, max=32,
                                      help="independent samples per ticker")]
AsOf = Annotated[str | None, typer.Option(
    "--as-of", help="YYYY-MM-DD (default: the newest snapshot; with NIGHTDESK_DATA_PROVIDER "
    "yfinance or demo, today's date on this host)")]
NoPreflight = Annotated[bool, typer.Option(
    "--no-preflight", help="start without asking the server whether it answers, serves the "
                           "model and has the context for the night's prompts (the tickers "
                           "and the snapshot are still checked)")]

# What a caller (systemd, cron) can act on: 3 means the night ran but its ranking lacks
# some tickers; anything else that is not a success is 1. A batch stopped early ends with
# its stop's own code instead (HaltReason.error).
EXIT_CODES = {"succeeded": 0, "partial": 3}


def _server_check(no_preflight: bool) -> ServerCheck:
    """Return how far a start from the command line asks the server (app/runs/preflight.py)."""
    return "skip" if no_preflight else "require"


def _names_its_skip(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command with --no-preflight a server check's refusal that names the flag."""
    @functools.wraps(command)
    def checked(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except PreflightRefused as error:
            raise PreflightRefused(f"{error} (--no-preflight skips this check)") from None
    return checked


def _ready_database(settings: Settings) -> Engine:
    """Return the engine, after marking batches whose process died as crashed."""
    engine = batch_database(settings)
    mark_crashed(engine, settings.batch.heartbeat_stale_s)
    return engine


def _announce(point: ResumePoint) -> None:
    err.print(f"resuming batch {point.batch_id} ({point.kind}, {point.status}, as of "
              f"{point.as_of}): {counted(len(point.tickers), 'ticker')} left, "
              f"{point.finished} finished")
    taken = [f"{count} {why}" for count, why in (
        (len(point.tickers) - point.infrastructure - point.retried, "not finished"),
        (point.infrastructure, "failed to the infrastructure (the server or the database)"),
        (point.retried, "failed on their own account (--retry-failed)")) if count]
    if point.infrastructure or point.retried:
        err.print(f"taken up: {'; '.join(taken)}")


def _finish(outcome: BatchOutcome, planned: int) -> None:
    """Print how the batch ended, then exit with its code (see the module's table)."""
    style = "green" if not outcome.failed else "yellow" if outcome.succeeded else "red"
    err.print(f"[{style}]batch {outcome.batch_id} {outcome.status}:[/] "
              f"{len(outcome.succeeded)} succeeded, {len(outcome.failed)} failed "
              f"of {planned}")
    for ticker, reason in sorted(outcome.failed.items()):
        err.print(f"  [red]{ticker}[/]: {escape(reason)}")
    if outcome.infrastructure and outcome.halt is None:
        one = len(outcome.infrastructure) == 1
        err.print(f"{len(outcome.infrastructure)} of them failed to the infrastructure (the "
                  f"server or the database), not on {'its' if one else 'their'} own account: "
                  f"`nightdesk run --resume {outcome.batch_id}` runs "
                  f"{'it' if one else 'them'} again")
    if outcome.halt is not None:
        raise outcome.halt.error(outcome.batch_id)
    code = EXIT_CODES.get(outcome.status, 1)
    if code:
        raise typer.Exit(code)


@_names_its_skip
def run(
    batch_id: Annotated[int | None, typer.Argument(
        help="with --resume: the batch to continue (default: the newest with tickers left)",
        show_default=False, parser=lambda text: parse_batch_id(text, what="batch_id"))] = None,
    tickers: Annotated[str | None, typer.Option(
        "--tickers", help="A,B,C (default: NIGHTDESK_UNIVERSE_FILE, else the snapshot's "
                          "universe.txt)")] = None,
    universe: Annotated[Path | None, typer.Option("--universe",
                                                  help="file: one ticker per line")] = None,
    as_of: AsOf = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, max=MAX_TICKERS,
                                              help="only the first N tickers")] = None,
    samples: Annotated[int | None, typer.Option(
        "--samples", min=1, max=32,
        help="independent samples per ticker (default: NIGHTDESK_SAMPLES)")] = None,
    strategy: RunStrategy = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="continue an interrupted or crashed batch where it stopped, and run "
                         "again its tickers the server or database failed")] = False,
    continue_night: Annotated[bool, typer.Option(
        "--continue-night",
        help="if tonight's nightly batch (same as-of date) was cut short, or has tickers the "
             "server or database failed, continue it with its own tickers; if it finished, run "
             "nothing and say so (NIGHTDESK_SCHEDULE_REPEAT_AS_OF=true runs it again); else "
             "start the night (the timer's unit runs this)")] = False,
    retry_failed: Annotated[bool, typer.Option(
        "--retry-failed",
        help="with --resume: also run again the tickers that failed on their own account "
             "(those the server or database failed are always taken up)")] = False,
    no_preflight: NoPreflight = False,
) -> None:
    """Run the nightly batch over a universe, or continue one with --resume [BATCH_ID].

    One nightly run at a time: a second start exits 4 ("already running: batch N").
    """
    settings = setup()
    server = _server_check(no_preflight)
    if resume and continue_night:
        raise InputError("--resume and --continue-night exclude each other: --resume [ID] "
                         "continues a recorded batch, --continue-night tonight's or a new one")
    if retry_failed and not resume:
        raise InputError("--retry-failed goes with --resume [ID]: it runs a recorded batch's "
                         "failed tickers again")
    if resume:
        given = [name for name, value in (("--tickers", tickers), ("--universe", universe),
                                          ("--as-of", as_of), ("--limit", limit),
                                          ("--samples", samples), ("--strategy", strategy))
                 if value is not None]
        if given:
            raise InputError(f"--resume continues a recorded batch with its own tickers, "
                             f"date, samples and strategy: drop {', '.join(given)}")
        night = resume_recorded(settings, _ready_database(settings), batch_id,
                                server=server, announce=_announce, retry_failed=retry_failed)
    else:
        if batch_id is not None:
            raise InputError(f"a batch id ({batch_id}) is only taken with --resume")
        if tickers is not None or universe is not None:
            # Checked here, before the lock and the server: bad input is named first.
            symbols, notes = choose_tickers(tickers, universe)
            for note in notes:
                err.print(f"note: {note}")
            tickers, universe = ",".join(symbols), None
        else:
            notes = []
        request = NightlyRequest(as_of=parse_as_of(as_of) if as_of is not None else None,
                                 tickers=tickers, universe=universe, limit=limit,
                                 samples=samples, strategy=strategy or "adaptive",
                                 command=shlex.join(["nightdesk", *sys.argv[1:]]),
                                 notes=tuple(notes))
        try:
            engine = _ready_database(settings)
        except ERRORS as error:  # a night refused by its database: not silent either
            tell_refused(settings, request, error)
            raise
        # The timer's path keeps the daemon's rule: one nightly batch per as-of date.
        night = run_nightly(settings, request, engine=engine,
                            resume=continue_night, server=server, announce=_announce,
                            once_per_as_of=continue_night and not settings.schedule.repeat_as_of)
    if night.said is not None:  # only a scheduled run skips a finished night
        err.print(night.said, markup=False)
    if night.outcome is not None:
        _finish(night.outcome, night.tickers)


@_names_its_skip
def rerun(
    ticker: Annotated[str, typer.Argument(help="ticker symbol")],
    as_of: AsOf = None,
    samples: Samples = 1,
    no_preflight: NoPreflight = False,
) -> None:
    """Run one ticker again as its own batch (kind rerun); the ranking applies it."""
    settings = setup()
    day = parse_as_of(as_of) if as_of is not None else default_as_of(settings)
    plan = BatchPlan("rerun", day, [check_symbol(ticker)], samples)
    outcome = execute_plan(settings, _ready_database(settings), plan,
                           server=_server_check(no_preflight))
    _finish(outcome, len(plan.tickers))


def show_ranking(
    batch: Annotated[int | None, typer.Option("--batch", help="batch id (default: the newest "
                                                               "finished nightly of the "
                                                               "latest as-of date)",
                                              parser=parse_batch_id)] = None,
    fmt: Formats = "table",
    require_fresh: Annotated[bool, typer.Option(
        "--require-fresh", help=f"exit {STALE_EXIT} when the ranking is not the latest "
                                "night's (it failed, runs, was interrupted or crashed, none "
                                "came since the schedule's due time, or no night ever "
                                "finished)")] = False,
) -> None:
    """Print the ranking: rank, ticker, rating, mean score, spread, confidence, summary, and
    each ticker's previous night and change; stderr names the latest night first."""
    settings = setup()
    engine = database(settings)
    try:
        chosen, rows = ranking(engine, batch)
    except InputError:
        if batch is not None:
            raise  # an unknown --batch is bad input (exit 2), fresh or not
        if not require_fresh:
            raise  # NoNightYet: one line with the night's status and advice (app/cli)
        night = night_status(engine, settings, None)
        # No finished night at all: for a script that asks for a fresh ranking this is
        # "not fresh" (exit 6), the same as a failed or missed night, not bad input.
        _night_lines(night)
        if fmt == "json":
            echo_json(RankingJSON(night=night, batch=None, rows=[]))
        raise typer.Exit(STALE_EXIT) from None
    night = night_status(engine, settings, chosen.id)
    _night_lines(night)
    changes = compare_nights(engine, chosen.id).by_ticker()
    demo = BatchSettings.read(chosen.settings).demo_data
    data = [ranked_row(r, changes.get(r.ticker)) for r in rows]
    if fmt in ("json", "csv"):
        found = RankingJSON(night=night, batch=summarize(
            chosen, settings.batch.heartbeat_stale_s, engine=engine), rows=data)
        if fmt == "json":
            echo_json(found)
        else:
            # Flat: each row carries what JSON gives once, the ranked batch as ranked_* (a
            # row's own batch_id is its rerun's), "demo" and "fresh" named as before.
            flat = csv_of(found, "rows", prefixes={"batch": "ranked"},
                          renamed={"night_fresh": "fresh", "ranked_demo": "demo"})
            echo_csv(flat, flat[0] if flat else ["rank"])
    else:
        out.print(_ranking_table(f"{'DEMO DATA — ' if demo else ''}ranking of batch "
                                 f"{chosen.id} ({chosen.kind}, as of {chosen.as_of})", data))
        if any(r.contradicting for r in rows):
            out.print("! = rating outside its score band in at least one sample")
        # As the page's "Reruns applied": a row whose result is a rerun's says so.
        reruns = from_reruns(chosen.id, rows)
        if reruns:
            out.print(f"reruns applied: {', '.join(reruns)}", markup=False)
    # A ranking without some of the night's tickers says which, and why: never a silent gap.
    # (On stderr for json/csv, so their output stays machine-readable.)
    for r in rows:
        if r.rank is None:
            (out if fmt == "table" else err).print(f"missing: {r.ticker} ({r.summary})",
                                                   markup=False)
    for note in summarize(chosen, settings.batch.heartbeat_stale_s).notes:
        (out if fmt == "table" else err).print(f"universe note: {note}", markup=False)
    for message in warnings_for(engine, chosen.id):
        # On stderr, so that json and csv output stays machine-readable.
        err.print(f"[yellow]warning:[/] batch {chosen.id}: {message}")
    if require_fresh and not night.fresh:
        raise typer.Exit(STALE_EXIT)


def _ranking_table(title: str, rows: list[RankedRow]) -> Table:
    """Return the ranking as ``nightdesk ranking`` prints it, each row beside its night before."""
    table = Table(title=title)
    for col in ("rank", "ticker", "rating", "score", "±", "conf", "was", "change", "summary"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(str(r.rank or "—"), r.ticker, rating_text(r),
                      "" if r.score is None else f"{r.score:+.2f}",
                      "" if r.spread is None or r.samples < 2 else f"{r.spread:.2f}",
                      "" if r.confidence is None else f"{r.confidence:.2f}",
                      _rated_text(r.previous_rating, r.previous_score, r.previous_rank),
                      r.change or "", r.summary)
    return table


def _night_lines(night: NightStatus) -> None:
    """Print the night's status on stderr, first of all: a ranking older than the latest
    night says so, and why."""
    if not night.fresh:
        what = "no night yet" if night.status == "none" else "not the latest night"
        err.print(f"[bold yellow]{what}:[/] {escape(night.reason or '')}")
    err.print(f"night: {escape(night.headline)}")
    for step in night.advice:
        err.print(f"next: {escape(str(step))}")


class RankingJSON(BaseModel):
    """``ranking --format json``: the latest night's status (the payload ``/api/ranking``
    carries as ``night``), the batch ranked (None: no finished night) and its rows, failed
    tickers last with rank null."""

    night: NightStatus
    batch: BatchSummary | None
    rows: list[RankedRow]



def rating_text(row: RankRow) -> str:
    """Return the rating as the CLI prints it: "!" when a sample contradicts its score."""
    # "!": a sample's own rating contradicts its own score (see `nightdesk quality`).
    return (row.rating or row.status.upper()) + (" !" if row.contradicting else "")


# The first columns of ``changes --format csv``, in the order they always came.
CHANGE_COLUMNS = ("ticker", "change", "previous_rating", "previous_score", "previous_rank",
                  "rating", "score", "rank", "score_move", "rerun_id", "previous_rerun_id",
                  "why")


def show_changes(
    batch: Annotated[int | None, typer.Option("--batch", help="the night (default: the one "
                                                               "the ranking shows)",
                                              parser=parse_batch_id)] = None,
    against: Annotated[int | None, typer.Option(
        "--against", help="the night to compare with (default: the newest finished nightly "
                          "batch of the latest earlier as-of date)",
        parser=lambda text: parse_batch_id(text, what="--against"))] = None,
    fmt: Formats = "table",
) -> None:
    """List every rating change since the night before, largest score move first, with the
    nodes whose views moved most."""
    engine = database(setup())
    if batch is not None and (kind := ranking(engine, batch)[0].kind) != "nightly":
        raise InputError(f"--batch {batch} is a {kind} batch, not a night: name a nightly "
                         "batch (a rerun's rating is in its night's ranking)")
    found = compare_nights(engine, batch, against)
    if fmt == "json":
        echo_json(found)
        return
    if fmt == "csv":
        # Flat: each row carries the nights compared and their DEMO mark, which JSON gives
        # once; its rows are the changes, as the table's (``tickers`` holds them and the rest).
        flat = csv_of(found, "changes", left={"tickers"}, lead=CHANGE_COLUMNS)
        echo_csv(flat, csv_columns(found, "changes", (f.name for f in fields(TickerChange)),
                                   lead=CHANGE_COLUMNS, left={"tickers"}))
        return
    demo = "DEMO DATA — " if found.demo else ""
    if found.against_id is None:
        out.print(f"{demo}batch {found.batch_id} (as of {found.as_of}): {NO_NIGHT_BEFORE}")
        return
    table = Table(title=f"{demo}changes: batch {found.batch_id} (as of {found.as_of}) "
                        f"against batch {found.against_id} (as of {found.against_as_of})")
    for col in ("ticker", "change", "was", "now", "move", "why"):
        table.add_column(col, overflow="fold")
    for t in found.changes:
        table.add_row(t.ticker, t.change or "",
                      _rated_text(t.previous_rating, t.previous_score, t.previous_rank,
                                  t.previous_contradicting),
                      _rated_text(t.rating, t.score, t.rank, t.contradicting),
                      "" if t.score_move is None else f"{t.score_move:+.2f}", t.why)
    out.print(table)
    counts = Counter(t.change for t in found.tickers)
    open_ = sum(1 for t in found.tickers if t.change is None and t.status in UNFINISHED)
    # In number: "0 downgrades", "1 upgrade" (new, dropped and same read alike either way).
    out.print(", ".join(counted(counts[k], k, k if k in ("new", "dropped", "same") else None)
                        for k in ("upgrade", "downgrade", "new", "dropped", "same"))
              + (f", {open_} not finished (no rating yet)" if open_ else ""))


def _rated_text(rating: str | None, score: float | None, rank: int | None,
                contradicting: int = 0) -> str:
    """Return ``Buy +0.70, rank 3``, with ``!`` after the rating when it lies outside its band
    (a rank in words: ``#3`` reads as a batch id, as everywhere else ``#`` names one)."""
    if rating is None or score is None:
        return "—"
    flag = " !" if contradicting else ""
    return f"{rating}{flag} {score:+.2f}" + (f", rank {rank}" if rank is not None else "")


@_names_its_skip
def replay(
    batch: Annotated[int, typer.Option("--batch", help="recorded batch to replay",
                                       parser=parse_batch_id)],
    base_url: Annotated[str | None, typer.Option(
        "--base-url", help="server to replay against (default: NIGHTDESK_LLM_BASE_URL)")] = None,
    label: Annotated[str | None, typer.Option("--label", help="name of this arm")] = None,
    strategy: Strategy = "adaptive",
    free_output: Annotated[bool, typer.Option(
        "--free-output", help="let outputs end where the model stops, instead of matching "
                              "the recorded output lengths")] = False,
    no_preflight: NoPreflight = False,
) -> None:
    """Replay a batch's recorded requests against a server, as a batch of kind replay: the
    prompts it sent, market data and all (no snapshot is read again)."""
    from app.runs.replay import replay_batch

    settings = setup()
    if base_url is not None:
        settings = settings.updated(**{"llm_base_url": base_url})
    engine = batch_database(settings)
    facts = batch_server_facts(settings.llm.server_profile, settings.llm.url,
                               settings.paths.server_dir, settings.llm.router_urls)
    runner = BatchEngine(settings, engine, server_facts=facts)
    try:
        outcome = run_batch(replay_batch(settings, engine, batch, label=label,
                                         strategy=strategy, match_output=not free_output,
                                         preflight=not no_preflight, runner=runner))
    except BatchInterrupted:
        if runner.batch_id is None:
            raise BatchInterrupted(NOTHING_RECORDED) from None
        raise BatchInterrupted(
            f"replay batch {runner.batch_id} interrupted: cancelled at once by the operator; "
            f"a replay does not resume: `nightdesk report {runner.batch_id}` shows what it "
            "played, and the same `nightdesk replay` command plays it again") from None
    err.print(f"replay batch {outcome.batch_id} {outcome.status}: "
              f"{len(outcome.succeeded)} tickers replayed, {len(outcome.failed)} with errors")
    for ticker, reason in sorted(outcome.failed.items()):
        err.print(f"  [red]{ticker}[/]: {reason}")
    for note in BatchSettings.read(batch_row(engine, outcome.batch_id).settings).universe_notes:
        err.print(f"note: {note}", markup=False)  # a ticker of the night not replayed
    err.print(f"compare: nightdesk report --compare {batch},{outcome.batch_id}")
    code = EXIT_CODES.get(outcome.status, 1)
    if code:
        raise typer.Exit(code)


def _before_the_batch(command: Callable[..., None]) -> Callable[..., None]:
    """Return ``command`` saying that a Ctrl-C before its batch's row recorded nothing (typer
    exits 130 without a word); once there is a row, the batch is named where it is run."""
    @functools.wraps(command)
    def said(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except KeyboardInterrupt:
            raise BatchInterrupted(NOTHING_RECORDED) from None

    return said


def register(app: typer.Typer) -> None:
    """Add the batch commands to the top-level app."""
    app.command("replay")(_before_the_batch(replay))
    app.command("run")(_before_the_batch(run))
    app.command("rerun")(_before_the_batch(rerun))
    app.command("ranking")(show_ranking)
    app.command("changes")(show_changes)
