"""``nightdesk report``: what a batch did and where its time went, or arms side by side;
``nightdesk batches``: the batches, newest first."""

from __future__ import annotations

from datetime import UTC
from typing import Annotated, Literal

import typer
from pydantic_core import to_jsonable_python
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from app.bench.bound import MIN_INTERVAL_LEVELS
from app.bench.plan import NightBound, night_bound
from app.cli.common import (
    MAX_COUNT,
    Formats,
    TableOrJson,
    csv_of,
    database,
    echo_csv,
    echo_json,
    figures,
    mark_crashed,
    next_clause,
    setup,
    what_the_night_says,
)
from app.cli.logs import console
from app.errors import InputError
from app.morning.accounting import (
    COMPARE_COLUMNS,
    Arm,
    BatchReport,
    EndpointShare,
    batch_report,
    compare_arm,
    endpoint_shares,
    latest_batch_id,
)
from app.morning.advice import Advice, next_steps
from app.morning.batchids import parse_batch_id, parse_batch_ids
from app.morning.nightstatus import night_status, refusal_line, span
from app.morning.numbers import number
from app.morning.serverview import BOUND_NAMES, LOOKUPS_SLACK, ServerView, server_view
from app.morning.summary import (
    BatchSummary,
    FailedTicker,
    Seen,
    batch_summary,
    failed_tickers,
    list_batches,
)
from app.morning.timeline import Interval, batch_timeline
from app.quality.monitor import warnings_for


def held_back_by(view: ServerView) -> str:
    """Say which bound held the most busy readings, with every bound's share."""
    if not view.bound or not view.bound_shares:
        return "—"
    name = BOUND_NAMES[view.bound]
    if view.bound == "client" and view.request_cap:
        name += f" ({view.request_cap} per endpoint; the server had room)"
    rest = ", ".join(f"{key} {share:.0%}" for key, share in view.bound_shares.items())
    return f"{name}: {view.bound_shares[view.bound]:.0%} of busy readings ({rest})"


STATUS_STYLES = {"succeeded": "green", "partial": "yellow", "running": "blue"}


def render_head(batch: BatchSummary, failed: list[FailedTicker], advice: list[Advice],
                console: Console) -> None:
    """Print what the batch was and how it ended, what to do about it, then every ticker
    that failed and why."""
    style = STATUS_STYLES.get(batch.status, "red")
    demo = "[bold red]DEMO DATA[/] " if batch.demo else ""
    console.print(f"{demo}batch {batch.id} ({batch.kind}, as of {batch.as_of}): "
                  f"[{style}]{batch.status}[/] — {batch.outcome}; "
                  f"duration {span(batch.duration_s)}")
    if batch.error:
        console.print(f"  error: {escape(batch.error)}")
    for note in batch.notes:
        console.print(f"  universe note: {escape(note)}")
    for step in advice:
        console.print(f"  next: {escape(str(step))}")
    if failed:
        what = ("failed tickers" if all(t.status == "failed" for t in failed)
                else "tickers without a result")
        console.print(f"{what} ({len(failed)}):")
        for ticker in failed:
            console.print(f"  [red]{ticker.ticker}[/] ({ticker.said()}): "
                          f"{escape(ticker.error or 'no error recorded')}")


def render_table(report: BatchReport, view: ServerView, console: Console) -> None:
    summary = Table(title=f"batch {report.batch_id}", show_header=False)
    for key, value in (
        ("calls", report.calls),
        ("attempts", report.attempts),
        ("failed attempts", report.failed_attempts),
        ("prompt tokens", report.prompt_tokens),
        ("completion tokens", report.completion_tokens),
        # As the batch's page shows them: to the second, in UTC; "—" when no call ran.
        *((key, "—" if at is None else f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC")
          for key, at in (("first call start", report.first_call_start),
                          ("last call end", report.last_call_end))),
        ("wall seconds", f"{report.wall_seconds:.1f}"),
        ("active seconds", f"{report.active_seconds:.1f}"),
        ("paused seconds", f"{report.paused_seconds:.1f} ({report.pauses} "
                           f"pause{'' if report.pauses == 1 else 's'}, not in tok/s)"),
        *((("batch output tok/s", "— (under 1 s of calls: too brief for a rate)"),)
          if report.brief else
          (("batch output tok/s", f"{report.output_tokens_per_s:.1f} (over the active seconds)"),
           ("  of tickers that succeeded", f"{report.succeeded_output_tokens_per_s:.1f}"))),
    ):
        summary.add_row(key, str(value))
    if report.metrics_fallback:
        fb = report.metrics_fallback
        summary.add_row("admission fallback",
                        f"{fb.readings_missed} readings of /metrics missed over "
                        f"{fb.seconds} s: adaptive held at {fb.limit} and paused")
    console.print(summary)
    server = Table(title=f"the server's view ({view.samples} samples of /metrics)",
                   show_header=False)
    for key, value in (
        ("running: mean / p50 / max", f"{number(view.running_mean)} / {number(view.running_p50)}"
                                      f" / {number(view.running_max, '.0f')}"),
        ("waiting: mean / max", f"{number(view.waiting_mean)} / {number(view.waiting_max, '.0f')}"),
        ("KV cache usage max", number(view.kv_usage_max, ".0%")),
        ("preemptions", number(view.preemptions, ".0f")),
        ("prompt / generation tokens (server)",
         f"{number(view.prompt_tokens, '.0f')} / {number(view.generation_tokens, '.0f')}"),
        ("prefill tokens computed", number(view.prefill_tokens_computed, ".0f")),
        ("prefix cache hit rate", prefix_hits(view)),
        ("spec-decode acceptance", number(view.spec_acceptance, ".1%")),
        ("request time", f"prefill {number(view.prefill_time_s)} s, decode"
                         f" {number(view.decode_time_s)} s (decode"
                         f" {number(view.decode_time_share, '.0%')})"),
        ("time to first token from sending: mean (s)", number(view.mean_ttft_s, ".2f")),
        ("  from the graph's issue: mean / p90 (s)",
         f"{number(view.ttft_ready_mean_s, '.2f')} / {number(view.ttft_ready_p90_s, '.2f')}"),
        ("held back by", held_back_by(view)),
        ("client loop lag max", client_lag(view)),
    ):
        server.add_row(key, value)
    console.print(server)
    nodes = figures("latency per node (s)", ("node", "attempts", "mean", "p50", "p99"), {"node"})
    for n in report.nodes:
        nodes.add_row(n.node, str(n.attempts), f"{n.mean_s:.2f}", f"{n.p50_s:.2f}",
                      f"{n.p99_s:.2f}")
    console.print(nodes)


def prefix_hits(view: ServerView) -> str:
    """Give the prefix-cache hit rate, or say why the server's counters cannot give it."""
    lookups = view.prefix_lookups_per_prompt_token
    if view.prefix_cache_hit_rate is None and lookups is not None and lookups > LOOKUPS_SLACK:
        return (f"— (the server looked prompts up {lookups:.1f}× per prompt token: requests "
                "waiting at a full cache are looked up again at every step)")
    return number(view.prefix_cache_hit_rate, ".1%")


def client_lag(view: ServerView) -> str:
    """Say how far behind the client's own event loop fell, and what that means when it did."""
    if view.client_lag_max_s is None:
        return "—"
    text = f"{view.client_lag_max_s:.2f} s"
    late = view.client_lag_readings_over_1s
    if late:
        # The launcher's profiles all stream every 16 tokens: advise it only where it is not so.
        step = (f"the server already ran with --stream-interval {view.stream_interval}"
                if (view.stream_interval or 0) >= 16
                else "start the server with --stream-interval 16")
        text += (f" ({late} reading{'' if late == 1 else 's'} over 1 s: the client fell behind "
                 f"its streams and admission read stale gauges; {step})")
    return text


def timeline_table(intervals: list[Interval]) -> Table:
    """Return the batch over time: where its makespan went fast and where slow."""
    table = figures("over time (from the first call; output spread over each call's decode "
                    "time)", ("interval s", "output tok/s", "tickers in flight",
                              "attempts started", "running mean", "KV max", "preemptions"))
    for i in intervals:
        table.add_row(i.label, f"{i.output_tokens_per_s:.1f}",
                      f"{i.tickers_in_flight:.1f}", str(i.attempts_started),
                      number(i.running_mean), number(i.kv_usage_max, ".0%"),
                      number(i.preemptions, ".0f"))
    return table


def endpoint_table(shares: list[EndpointShare], report: BatchReport, view: ServerView) -> Table:
    """Return each endpoint's part of a batch, then the batch's total."""
    table = figures("endpoints (output tok/s over the batch's makespan: they add up)",
                    ("endpoint", "calls", "attempts", "failed attempts", "tickers",
                     "output tok/s", "running mean",
                     "KV peak", "preemptions"), {"endpoint"})
    for share in shares:
        table.add_row(share.endpoint or "(not recorded)", str(share.calls),
                      str(share.attempts), str(share.failed_attempts), str(share.tickers),
                      f"{share.output_tokens_per_s:.1f}", number(share.running_mean),
                      number(share.kv_usage_max, ".0%"), number(share.preemptions, ".0f"))
    table.add_row("batch total", str(report.calls), str(report.attempts),
                  str(report.failed_attempts), "",
                  f"{report.output_tokens_per_s:.1f}", number(view.running_mean),
                  number(view.kv_usage_max, ".0%"), number(view.preemptions, ".0f"),
                  style="bold")
    return table


def compare_table(arms: list[Arm], title: str = "arms side by side") -> Table:
    table = figures(title, (header for header, _, _ in COMPARE_COLUMNS), {"label"})
    for a in arms:
        row = [getattr(a, key) for _, key, _ in COMPARE_COLUMNS]
        cells = [escape(number(value, spec))
                 for value, (_, _, spec) in zip(row, COMPARE_COLUMNS, strict=True)]
        # The label cell marks a demo arm as `batches` does (``_label``).
        cells[[key for _, key, _ in COMPARE_COLUMNS].index("label")] = _label(a) or "—"
        table.add_row(*cells)
    return table


def report(
    batch_id: Annotated[int | None, typer.Argument(
        help="Batch id (default: the latest night, the one the ranking's status names; "
             "with no night, the newest batch).",
        parser=lambda text: parse_batch_id(text, what="batch_id"))] = None,
    fmt: TableOrJson = "table",
    compare: Annotated[str | None, typer.Option("--compare", help="ID1,ID2,… side by side")] = (
        None),
) -> None:
    """Print a batch's calls, tokens, batch throughput, the server's view and node latency."""
    if batch_id is not None and compare is not None:  # before, the batch id went unread
        raise InputError(f"a batch id ({batch_id}) or --compare, not both: `nightdesk report "
                         f"{batch_id}` reports one batch, `--compare {compare}` sets batches "
                         f"side by side")
    settings = setup()
    engine = database(settings)
    # A batch whose process died is reported as what it is, not as still running. One
    # reading of the nightly lock and the calls' ends for the whole command (``Seen``).
    seen = Seen(engine)
    mark_crashed(engine, settings.batch.heartbeat_stale_s, read_only_ok=True, seen=seen)
    if compare is not None:
        arms = [compare_arm(engine, i) for i in parse_batch_ids(compare, what="--compare")]
        if fmt == "json":
            echo_json(arms)
        else:
            console().print(compare_table(arms))
        return
    chosen = batch_id if batch_id is not None else latest_batch_id(engine)
    # InputError (exit 2) for an unknown id
    head = batch_summary(engine, chosen, settings.batch.heartbeat_stale_s, seen)
    failed = failed_tickers(engine, chosen, dead=head.status == "crashed")
    advice = next_steps(engine, head, settings.batch.heartbeat_stale_s, seen)
    result = batch_report(engine, chosen)
    view = server_view(engine, chosen)
    shares = endpoint_shares(engine, chosen)
    warnings = warnings_for(engine, chosen)
    intervals = batch_timeline(engine, chosen)
    bound = night_bound(engine, chosen, result.active_seconds, paused_s=result.paused_seconds,
                        pauses=result.pauses)
    if fmt == "json":
        # The batch report's own fields flattened between the batch and the server's view;
        # the advice as ``Advice`` objects, the shape ``ranking --format json`` gives it.
        echo_json(
            {"batch": head, "failed_tickers": failed,
             "advice": advice, **to_jsonable_python(result),
             "server": view, "endpoints": shares, "over_time": intervals,
             "graph_bound": bound, "warnings": warnings})
    else:
        shown = console()
        render_head(head, failed, advice, shown)
        render_table(result, view, shown)
        if len(shares) > 1:
            shown.print(endpoint_table(shares, result, view))
        if intervals:
            shown.print(timeline_table(intervals))
        shown.print(bound_line(bound))
        for message in warnings:
            shown.print(f"[yellow]warning:[/] {message}")


def bound_line(bound: NightBound) -> str:
    """Say how the night's makespan compares with its graph bound, or why it cannot."""
    if bound.bound_s is None:
        return f"graph bound: not computed ({bound.unavailable})"
    if bound.unavailable is not None:
        return f"graph bound: none for this night ({bound.unavailable})"
    paused = (f" (its calls running; {bound.pauses} pause{'s' if bound.pauses > 1 else ''}, "
              f"{bound.paused_s:.0f} s, left out)" if bound.pauses else "")
    return (f"graph bound: makespan {bound.makespan_s:.0f} s{paused} = "
            f"{bound.makespan_over_bound:.2f}"
            f" x the least any schedule that respects the graph needs ({bound.bound_s:.0f} s "
            f"on {bound.endpoints} endpoint(s), set by {bound.binding}; {bound.server})"
            + ("; 90% interval {:.2f}–{:.2f} x (the step refitted to the night's readings "
               "resampled)".format(*bound.makespan_over_bound_90)
               if bound.makespan_over_bound_90 else
               f"; no interval (the night's readings have fewer than {MIN_INTERVAL_LEVELS} "
               "levels of running requests to refit the step to)")
            + (f" — {bound.scope}" if bound.scope else ""))


def _label(row: BatchSummary | Arm) -> str:
    """Return the batch's label cell: DEMO DATA for a night on the seeded synthetic snapshot
    (as /batches marks it), then the arm's own label."""
    demo = "[bold red]DEMO DATA[/]" if row.demo else ""
    return " ".join(part for part in (demo, escape(row.label or "")) if part)


# Times are stored and shown in UTC whatever the host's zone, as every other line says.
BATCH_COLUMNS = ("id", "kind", "status", "as_of", "tickers", "failed", "duration",
                 "started (UTC)", "label")


def batches(
    limit: Annotated[int, typer.Option("--limit", min=1, max=MAX_COUNT,
                                            help="the newest N batches")] = 20,
    kind: Annotated[Literal["nightly", "rerun"] | None, typer.Option(
        "--kind", help="only nightly batches or only reruns")] = None,
    fmt: Formats = "table",
) -> None:
    """List batches, newest first: status, as-of, tickers succeeded/planned, duration."""
    settings = setup()
    engine = database(settings)
    seen = Seen(engine)  # one read of the lock and of each batch's last call, as the page
    rows = list_batches(engine, settings.batch.heartbeat_stale_s, limit, kind, seen)
    if fmt == "json":
        echo_json(rows)
        return
    if fmt == "csv":
        echo_csv(csv_of(rows), BatchSummary.csv_fields())
        return
    table = Table(title="batches" + (f" ({kind})" if kind else ""))
    for column in BATCH_COLUMNS:
        table.add_column(column, justify="right" if column in ("id", "failed") else "left")
    for row in rows:
        table.add_row(str(row.id), row.kind,
                      f"[{STATUS_STYLES.get(row.status, 'red')}]{row.status}[/]",
                      str(row.as_of), row.tickers, str(row.tickers_failed),
                      span(row.duration_s),
                      row.started_at.strftime("%Y-%m-%d %H:%M") if row.started_at else "—",
                      _label(row))
    console().print(table)
    # A refused night has no row here: the one the morning's status names, said under them.
    night = night_status(engine, settings, None, seen=seen) if rows and kind != "rerun" \
        else None
    if night is not None and night.refused is not None:
        # With what the morning advises, as the page's "Not listed" line.
        console(stderr=True).print(f"not listed: {refusal_line(night.refused)}"
                                   + next_clause(night.advice), markup=False)
    if not rows:
        # None at all: what the morning advises (the first night), as `ranking` says it.
        console(stderr=True).print("no batches recorded yet" + (
            f" of kind {kind}" if kind else what_the_night_says()), markup=False)
