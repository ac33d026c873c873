"""``nightdesk plan``: how many GPUs a night of N tickers needs, by the bench's graph bound."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from sqlalchemy import Engine

from app.bench.plan import (
    ENDPOINTS,
    PROFILES,
    SCHEMA,
    Admission,
    NightShape,
    ServerModel,
    answer_deadline,
    night_server,
    parse_clock,
    plan_fleet,
    recorded_shape,
    synthetic_shape,
)
from app.cli.common import (
    Formats,
    csv_of,
    database,
    echo_csv,
    echo_json,
    figures,
    mark_crashed,
    setup,
    ticker_count,
)
from app.cli.logs import console
from app.config import Settings
from app.errors import InputError
from app.morning.batchids import parse_batch_id
from app.morning.timetable import due_times, nightly_trigger


def _span(seconds: float) -> str:
    """Show a duration: seconds under a minute (0.4 s is no "0.0 min"), minutes under an
    hour, else hours and minutes."""
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{seconds / 60:.1f} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _night_database(settings: Settings) -> Engine:
    """Return the database with dead batches marked crashed: a night whose process died
    must not read as still running."""
    engine = database(settings)
    mark_crashed(engine, settings.batch.heartbeat_stale_s, read_only_ok=True)
    return engine


def _shape(settings: Settings, text: str) -> NightShape:
    if text == "synthetic":
        return synthetic_shape()
    if not text.strip().isdigit():
        raise InputError(f"--shape takes synthetic or a recorded night's batch id (got {text!r})")
    return recorded_shape(_night_database(settings), parse_batch_id(text, what="--shape"))


def _profile(settings: Settings, text: str) -> ServerModel:
    if text in PROFILES:
        return PROFILES[text]
    if not text.strip().isdigit():
        raise InputError(f"--profile takes {', '.join(PROFILES)} or a recorded night's batch "
                         f"id, whose readings give the server's step (got {text!r})")
    batch_id = parse_batch_id(text, what="--profile")
    try:
        return night_server(_night_database(settings), batch_id)
    except InputError as error:
        # Said here, not in the model: `report` shows the same reason, where it is no advice.
        raise InputError(f"{error}: plan with a built-in --profile, e.g. --profile "
                         f"{next(iter(PROFILES))}") from None


def plan(
    tickers: Annotated[int, ticker_count("Tickers in the night.")],
    shape: Annotated[str, typer.Option(
        "--shape", help="synthetic (the production shape: 17 nodes, 25.5k output tokens a "
                        "ticker) or a recorded night's batch id (its mean ticker; the night "
                        "must have recorded its requests)")] = "synthetic",
    profile: Annotated[str, typer.Option(
        "--profile", help=f"one endpoint: {', '.join(PROFILES)} or a recorded night's batch "
                          "id (its KV cache, --max-num-seqs and a step fitted to its "
                          "readings)")] = "h200-moe",
    deadline: Annotated[str | None, typer.Option(
        "--deadline", help="HH:MM in the schedule's zone: the fewest GPUs that finish between "
                           "the next scheduled start and then")] = None,
    fmt: Formats = "table",
) -> None:
    """For 1..16 endpoints: the makespan planned for adaptive admission (the bench's graph
    bound at the cache share it fills, plus its start ramp), the bound itself, the share of
    the summed capacity the bound uses, and the smallest fleet within 5% of the best."""
    settings = setup()
    clock = parse_clock(deadline) if deadline is not None else None  # before any work
    chosen = plan_fleet(tickers, _shape(settings, shape), _profile(settings, profile),
                        Admission(reading_s=settings.llm.metrics_interval_s))
    start = None
    if clock is not None:
        trigger = nightly_trigger(settings)
        _, start = due_times(trigger, datetime.now(UTC))
        if start is None:
            raise InputError(f"the schedule {settings.schedule.cron!r} never fires again: no "
                             "start to count to --deadline from")
        start = start.astimezone(trigger.timezone)
        _, following = due_times(trigger, start)
        answer = answer_deadline(chosen, start, clock,
                                 None if following is None
                                 else following.astimezone(trigger.timezone))
        chosen = chosen.model_copy(update={"deadline": answer, "rows": [
            r.model_copy(update={"by_deadline": r.makespan_s <= answer.seconds})
            for r in chosen.rows]})
    if chosen.model_mismatch:  # on stderr, whatever the format: JSON and CSV carry it too
        console(stderr=True).print(f"warning: two models: {chosen.model_mismatch}",
                                   markup=False)
    if fmt == "json":
        echo_json(chosen, SCHEMA)
        return
    if fmt == "csv":
        # Every row carries the plan's own facts (the floor, the shape, the deadline), as
        # the JSON gives them once.
        rows = csv_of(chosen.json_facts(), "rows", lead=("schema",))
        echo_csv(rows, rows[0])
        return
    table = figures(f"plan: {tickers} tickers of {chosen.shape.name}, endpoints "
                    f"{chosen.profile.name}; the makespan planned for adaptive admission",
                    ("endpoints", "on busiest", "makespan", "makespan s", "bound s",
                     "bound's tok/s",
                     "start ramp s", "set by", "bound's share of capacity",
                     "within 5% of best"), {"set by"})
    for r in chosen.rows:
        table.add_row(str(r.endpoints), str(r.busiest_tickers), _span(r.makespan_s),
                      f"{r.makespan_s:.0f}",
                      f"{r.bound_s:.0f}", f"{r.bound_output_tok_s:.0f}", f"{r.ramp_s:.1f}",
                      r.binding,
                      f"{r.share_of_summed_capacity:.2f}",
                      "yes" if r.within_5pct_of_best else "")
    out = console()
    out.print(table)
    out.print(f"endpoint: {chosen.profile.source}")
    out.print(f"smallest fleet within 5% of the best ({_span(chosen.best_makespan_s)} on "
              f"{max(ENDPOINTS)}): {chosen.smallest_within_5pct} endpoint(s). Planned: the "
              f"bound with {chosen.admission.kv_share:.0%} of each cache admitted and the "
              f"request limit's start ramp (from {chosen.admission.initial_requests}, doubled "
              f"every {chosen.admission.reading_s:g} s); prefill's own work, preemption and "
              "the client's per-call overheads come on top.")
    if chosen.smallest_within_5pct_of_floor > max(ENDPOINTS):
        out.print(f"past {max(ENDPOINTS)}: more endpoints still shorten the night, to "
                  f"{_span(chosen.floor_s)} at least (a ticker an endpoint); within 5% of that: "
                  f"{chosen.smallest_within_5pct_of_floor:,} endpoints")
    if chosen.deadline is not None:
        d = chosen.deadline
        # A deadline at or before the start's time is the next day's: dated, "00:10 to 00:05"
        # would read as a window that ends before it begins.
        same_day = d.deadline.date() == d.start.date()
        until = f"{d.deadline:{'%H:%M' if same_day else '%Y-%m-%d %H:%M'}}"
        window = (f"from the next scheduled start {d.start:%Y-%m-%d %H:%M %Z} to {until} "
                  f"({_span(d.seconds)})")
        if d.endpoints is None:
            out.print(f"deadline: no fleet of up to {max(ENDPOINTS)} endpoints finishes "
                      f"{window}; the fastest needs at least {_span(chosen.best_makespan_s)}")
        else:
            out.print(f"deadline: at least {d.endpoints} endpoint(s) to finish {window}")
        if d.overlaps_next_night and d.next_start is not None:
            out.print(f"deadline: WARNING: {until} is past the schedule's next start after "
                      f"this one ({d.next_start:%Y-%m-%d %H:%M %Z}): a night that runs to it "
                      "overlaps the next night")
