"""``nightdesk quality repro|samples|forward|track|acknowledge``: how far the ratings can be
trusted, and the monitor's new normal."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from sqlalchemy import Engine

from agents.decision import RATINGS
from agents.tickers import check_symbol
from app.cli.common import MAX_COUNT, TableOrJson, database, echo_json, figures, setup
from app.cli.data import parse_as_of
from app.cli.logs import console
from app.errors import InputError
from app.morning.batchids import parse_batch_id, parse_batch_ids
from app.quality.averaging import KRow
from app.quality.forward import SCHEMA as FORWARD_SCHEMA
from app.quality.forward import ForwardReport, forward_report, parse_horizon
from app.quality.grades import load_grades, newest_batch, newest_nightly
from app.quality.monitor import acknowledge
from app.quality.repro import SCHEMA as REPRO_SCHEMA
from app.quality.repro import BatchSummary, ReproReport, repro
from app.quality.samples import SCHEMA as SAMPLES_SCHEMA
from app.quality.samples import SamplesReport, samples_report
from app.quality.statistics import PairStats
from app.quality.track import (
    DEFAULT_HORIZONS,
    NOT_JUDGED,
    HorizonRecord,
    TrackReport,
    parse_horizons,
    providers,
    track_nights,
    track_report,
)
from app.quality.track import SCHEMA as TRACK_SCHEMA

app = typer.Typer(no_args_is_help=True, help="Rating quality: reproducibility, sample "
                  "stability, forward returns, the track record over nights, the monitor's "
                  "new normal.")

Resamples = Annotated[int, typer.Option("--resamples", min=0, max=100_000,
                                        help="bootstrap resamples for intervals (0: none)")]
BatchId = Annotated[str | None, typer.Option("--batch", help="batch id (default: the newest "
                                                             "finished nightly batch)")]
UNDEFINED = "undefined"
R = TypeVar("R")


def _batch_id(text: str | None, engine: Engine) -> int:
    return newest_batch(engine) if text is None else parse_batch_id(text)


WITHHELD = "withheld"  # a t or p below the nights a verdict needs (docs/quality.md)


def _num(value: float | None, spec: str = ".2f") -> str:
    return UNDEFINED if value is None else format(value, spec)


def _ci(interval: Sequence[float] | None) -> str:
    return "—" if interval is None else f"[{interval[0]:+.2f}, {interval[1]:+.2f}]"


def _show(report: R, fmt: str, render: Callable[[R, Console], None], schema: str) -> None:
    """Print a report as its JSON (its schema, then the report's fields in their order) or
    as tables."""
    if fmt == "json":
        echo_json(report, schema)
    else:
        render(report, console())


def _batches_table(batches: list[BatchSummary]) -> Table:
    demo = "DEMO DATA — " if any(b.demo for b in batches) else ""
    table = figures(f"{demo}batches: each ticker's rating (N > 1: band of the mean score)",
                    ("batch", "as of", "status", "N", "tickers", *RATINGS, "contradicting"),
                    {"as of", "status"})
    for b in batches:
        table.add_row(str(b.batch_id), b.as_of, b.status, str(b.samples), str(b.tickers),
                      *(str(b.distribution[r]) for r in RATINGS),
                      f"{b.contradicting} of {b.decisions}")
    return table


def _stats_cells(s: PairStats) -> list[str]:
    flips = "—" if s.flip_rate is None else f"{s.flip_rate:.0%} of {s.directional}"
    return [str(s.n), _num(s.agreement, ".0%"), _num(s.qwk), _num(s.spearman), flips]


STATS_COLUMNS = ("tickers", "agreement", "QWK", "Spearman", "flips")


def _k_table(rows: list[KRow], title: str) -> Table:
    table = figures(title, ("k", "choices", "s.e. over choices", "tickers", "agreement", "QWK",
                            "95% CI", "Spearman", "95% CI", "Spearman–Brown from k=1"))
    for r in rows:
        table.add_row(str(r.k), f"{r.choices} ({'all' if r.exhaustive else 'drawn'})",
                      "0 (exact)" if r.exhaustive else _num(r.choice_error, ".3f"),
                      str(r.n), _num(r.agreement, ".0%"),
                      _num(r.qwk), _ci(r.qwk_ci), _num(r.spearman), _ci(r.spearman_ci),
                      "—" if r.k == 1 else _num(r.spearman_predicted))
    return table


def _print_k_table(console: Console, rows: list[KRow], title: str) -> None:
    """Print the by-k table, then in one line why any QWK interval was left out."""
    console.print(_k_table(rows, title))
    reasons = dict.fromkeys(r.qwk_ci_withheld for r in rows if r.qwk_ci_withheld)
    if reasons:
        console.print(f"note: {'; '.join(reasons)} (the repository's docs/quality.md)")


def _render_repro(report: ReproReport, console: Console) -> None:
    console.print(_batches_table(report.batches))
    pairs = figures(f"agreement between batches over {len(report.common)} common tickers",
                    ("batches", *STATS_COLUMNS))
    for p in report.pairs:
        pairs.add_row(f"{p.a} vs {p.b}", *_stats_cells(p.stats))
    if len(report.pairs) > 1:
        _add_mean_row(pairs, report.mean)
    console.print(pairs)
    if report.by_k:
        _print_k_table(console, report.by_k, "between batches, each ticker's grade the mean "
                                             "of k samples")
    for batch_id, tickers in report.only_in.items():
        if tickers:
            console.print(f"only in batch {batch_id}: {', '.join(tickers)}")
    for note in report.notes:
        console.print(f"note: {note}")


def _add_mean_row(table: Table, mean: dict[str, float | None]) -> None:
    """Close a table of pairs with the mean of its statistics."""
    table.add_row("mean of pairs", "", _num(mean["agreement"], ".0%"), _num(mean["qwk"]),
                  _num(mean["spearman"]), _num(mean["flip_rate"], ".0%"))


def _render_samples(report: SamplesReport, console: Console) -> None:
    console.print(_batches_table([report.batch]))
    dist = ", ".join(f"{r} {report.sample_distribution[r]}" for r in RATINGS)
    console.print(f"every sample's own rating: {dist}")
    pairs = figures(f"sample against sample, {report.samples} samples of "
                    f"{len(report.tickers)} tickers", ("samples", *STATS_COLUMNS))
    for p in report.pairs:
        pairs.add_row(f"{p.i} vs {p.j}", *_stats_cells(p.stats))
    _add_mean_row(pairs, report.mean)
    console.print(pairs)
    if report.split_half:
        _print_k_table(console, report.split_half, "split-half: mean of k samples against "
                                                   "the mean of k other samples")
    if report.incomplete:
        console.print(f"left out, fewer than {report.samples} samples: "
                      f"{', '.join(report.incomplete)}")


def _render_forward(report: ForwardReport, console: Console) -> None:
    what = "excess return over " + report.benchmark if report.benchmark else "return"
    console.print(_batches_table([report.batch]))
    head = Table(title=f"batch {report.batch.batch_id}: score against the {what} over the "
                       f"next {report.horizon_days} sessions", show_header=False)
    for key, value in (
        ("tickers with a defined forward return (n)", str(report.n)),
        ("rank IC (Spearman of score vs return)", _num(report.rank_ic, "+.3f")),
        ("t-statistic, ic·sqrt((n−2)/(1−ic²))", _num(report.t_stat, "+.2f")),
        ("p-value (two-sided, permutation)", _num(report.p_value, ".3f")),
        ("hit rate of directional calls", _num(report.hit_rate, ".0%")),
        *([("benchmark return", _num(report.benchmark_return, "+.2%"))]
          if report.benchmark else []),
    ):
        head.add_row(key, value)
    console.print(head)
    buckets = figures("by rating", ("rating", "tickers", f"mean {what}", "hit rate"), {"rating"})
    for b in report.buckets:
        hit = "— (no direction)" if b.rating == "Hold" and b.n else _num(b.hit_rate, ".0%")
        buckets.add_row(b.rating, str(b.n), "—" if b.mean_return is None
                        else f"{b.mean_return:+.2%}", hit if b.n else "—")
    console.print(buckets)
    rows = figures("per ticker", ("ticker", "rating", "score", "from", "to", "return", "excess"),
                   {"ticker", "rating"})
    for t in sorted(report.tickers, key=lambda t: -t.score):
        rows.add_row(t.ticker, t.rating, f"{t.score:+.2f}", t.start, t.end,
                     _num(t.forward_return, "+.2%"),
                     _num(t.excess_return, "+.2%") if report.benchmark else "—")
    console.print(rows)
    for ticker, why in report.missing.items():
        console.print(f"no forward return for {ticker}: {why}")


@app.command("repro")
def repro_command(
    batches: Annotated[str | None, typer.Option(
        "--batches", help="A,B[,C…] (default: the two newest nightly batches of one as-of)")
    ] = None,
    fmt: TableOrJson = "table",
    resamples: Resamples = 1000,
) -> None:
    """Compare batches of the same tickers: agreement, QWK, Spearman, flips, distributions."""
    engine = database(setup())
    ids = parse_batch_ids(batches) if batches is not None else newest_nightly(engine, 2)
    report = repro(engine, ids, resamples=resamples)
    _show(report, fmt, _render_repro, REPRO_SCHEMA)


@app.command("samples")
def samples_command(batch: BatchId = None, fmt: TableOrJson = "table",
                    resamples: Resamples = 1000) -> None:
    """Compare a batch's samples and the split-half stability of their mean (--samples N)."""
    engine = database(setup())
    report = samples_report(engine, _batch_id(batch, engine), resamples=resamples)
    _show(report, fmt, _render_samples, SAMPLES_SCHEMA)


@app.command("forward")
def forward_command(
    batch: BatchId = None,
    horizon: Annotated[str, typer.Option("--horizon", help="trading days: 5d, 20d …")] = "5d",
    benchmark: Annotated[str | None, typer.Option(
        "--benchmark", help="ticker to subtract (default: NIGHTDESK_QUALITY_BENCHMARK)")] = None,
    fmt: TableOrJson = "table",
) -> None:
    """Score a batch's grades against the returns after its as-of date: rank IC, hit rates."""
    days = parse_horizon(horizon)
    settings = setup()
    engine = database(settings)
    chosen = _batch_id(batch, engine)
    bench = benchmark or settings.quality.benchmark
    bench = check_symbol(bench, "benchmark") if bench else None
    provider = providers(settings)(load_grades(engine, chosen))
    report = forward_report(engine, provider, chosen, days, benchmark=bench)
    _show(report, fmt, _render_forward, FORWARD_SCHEMA)


def _render_track(report: TrackReport, console: Console) -> None:
    what = "excess return over " + report.benchmark if report.benchmark else "return"
    console.print(f"{'DEMO DATA — ' if report.demo else ''}track record: {report.nights} "
                  f"nights, as of {report.first} to "
                  f"{report.last}; rank IC of score against the {what}")
    summary = figures("per horizon (t over ⌊nights/h⌋ non-overlapping nights: the "
                      "repository's docs/quality.md)",
                      ("horizon", "nights", "mean IC", "sd", "t", "p", "IC > 0", "hit rate",
                       "long − short", "its t", "decay", "verdict"), {"verdict"})
    for h in report.horizons:
        t, p, its_t = ((WITHHELD,) * 3 if h.withheld else
                       (_num(h.t_stat, "+.2f"), _num(h.p_value, ".3f"),
                        _num(h.long_short_t, "+.2f")))
        summary.add_row(f"{h.horizon_days}d", f"{h.judged} (min {h.min_nights})",
                        _num(h.mean_ic, "+.3f"), _num(h.sd_ic, ".3f"), t, p,
                        _num(h.positive_share, ".0%"), _num(h.hit_rate, ".0%"),
                        _num(h.long_short, "+.2%"), its_t, _num(h.decay, ".2f"), h.verdict)
    console.print(summary)
    console.print(_by_rating_table(report.horizons, what))
    console.print(_nights_table(report.horizons))
    for h in report.horizons:
        short = [n.as_of for n in h.nights if n.not_judged]
        if short:
            console.print(f"IC not judged at {h.horizon_days}d ({len(short)} of the "
                          f"{len(h.nights)} nights: {', '.join(short)}): {NOT_JUDGED}")
        for as_of, why in h.pending.items():
            console.print(f"no {h.horizon_days}d returns for the night of {as_of}: {why}")
        for as_of, tickers in h.left_out.items():
            for ticker, why in tickers.items():
                console.print(f"left out of the night of {as_of} at {h.horizon_days}d: "
                              f"{ticker}: {why}")


def _by_rating_table(horizons: list[HorizonRecord], what: str) -> Table:
    table = figures(f"scored record: per rating, hit rate and mean {what} over every scored "
                    "rating (n)", ("rating", *(f"{h.horizon_days}d" for h in horizons)),
                    {"rating"})
    for i, rating in enumerate(RATINGS):
        cells = []
        for h in horizons:
            r = h.by_rating[i]
            if r.mean_return is None:
                cells.append(f"too few: {r.scored} of {r.needed} scored")
            else:
                hit = "no direction" if r.hit_rate is None else f"hit {r.hit_rate:.0%}"
                cells.append(f"{hit}, {r.mean_return:+.2%} (n {r.scored})")
        table.add_row(rating, *cells)
    return table


def _nights_table(horizons: list[HorizonRecord]) -> Table:
    table = figures("rank IC per night",
                    ("as of", "batch", *(f"IC {h.horizon_days}d" for h in horizons)), {"as of"})
    rows: dict[str, dict[int, str]] = {}
    ids: dict[str, int] = {}
    for h in horizons:
        for n in h.nights:
            ids[n.as_of] = n.batch_id
            ic = "not judged" if n.not_judged else _num(n.ic, '+.3f')
            rows.setdefault(n.as_of, {})[h.horizon_days] = f"{ic} (n {n.n})"
    for as_of in sorted(rows):
        table.add_row(as_of, str(ids[as_of]), *(rows[as_of].get(h.horizon_days, "pending")
                                                for h in horizons))
    return table


@app.command("track")
def track_command(
    nights: Annotated[int | None, typer.Option(
        "--nights", min=1, max=MAX_COUNT, help="the last N nights (default: every night)")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="nights with an as-of date on or after YYYY-MM-DD")] = None,
    horizon: Annotated[str, typer.Option(
        "--horizon", help="trading days, comma-separated: 1d,5d,20d")] = DEFAULT_HORIZONS,
    benchmark: Annotated[str | None, typer.Option(
        "--benchmark", help="ticker to subtract (default: NIGHTDESK_QUALITY_BENCHMARK)")] = None,
    fmt: TableOrJson = "table",
) -> None:
    """Judge the ratings over many nights: rank IC per night, its mean and t, hit rate, decay."""
    if nights is not None and since is not None:
        raise InputError("--nights and --since choose the nights two ways: give one")
    days = parse_horizons(horizon)
    try:
        start = parse_as_of(since) if since is not None else None
    except InputError:
        raise InputError(f"--since takes a date YYYY-MM-DD (got {since!r})") from None
    settings = setup()
    engine = database(settings)
    bench = benchmark or settings.quality.benchmark
    bench = check_symbol(bench, "benchmark") if bench else None
    ids = track_nights(engine, nights=nights, since=start)
    report = track_report(engine, ids, days, providers(settings), benchmark=bench)
    _show(report, fmt, _render_track, TRACK_SCHEMA)


@app.command("acknowledge")
def acknowledge_command(batch: BatchId = None) -> None:
    """Tell the rating monitor that a nightly batch starts a new normal to judge against."""
    engine = database(setup())
    typer.echo(acknowledge(engine, _batch_id(batch, engine)))
