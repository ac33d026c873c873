"""The morning digest: a short message about a nightly batch or rerun that has just ended.

``send_digest`` is called once at the end of every nightly batch and every rerun
(``app.runs.nightly``, whatever path ran it: ``nightdesk run``, ``--resume``, the timer,
the scheduler daemon, ``nightdesk rerun`` and the web page's Rerun) and sends ``build_digest``
to ``NIGHTDESK_NOTIFY``. The digest reads only what is stored once the batch row is final:
its status and tickers n/m, the top and bottom five of the ranking it belongs to, the rating
changes since the night before (``app.morning.changes``), the tickers that failed and why, the
night's duration and batch-level output tok/s (``app.morning.accounting``), and a link to the page.
Nothing here can fail the batch: any error is logged and the night goes on.
``send_refusal`` tells of a night refused at its start, which has no batch to read
(``app.runs.nightly``, both the timer's and the daemon's path).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Protocol

import structlog
from sqlalchemy import Engine, select

from app.config import Settings
from app.db.models import FINISHED_STATUSES, Batch, nights_newest_first
from app.errors import InputError, first_line
from app.morning.accounting import BatchReport, calls_said, throughput
from app.morning.advice import next_steps
from app.morning.changes import NO_NIGHT_BEFORE, TickerChange, compare_nights
from app.morning.nightstatus import span
from app.morning.ranking import RankRow, from_reruns, ranking
from app.morning.summary import (
    BatchSummary,
    FailedTicker,
    Seen,
    batch_summary,
    failed_tickers,
)
from app.notify import Level, Message, send

log = structlog.get_logger(__name__)

KINDS = ("nightly", "rerun")
DEMO = "DEMO DATA — "  # what begins the title of a digest of a night on DEMO data
TOP = 5  # tickers named at each end of the ranking


class Ended(Protocol):
    """A batch that has just ended (``app.batch.engine.BatchOutcome`` is one)."""

    @property
    def batch_id(self) -> int: ...
LISTED = 10  # changes and failures named before "… and N more"
ERROR_CHARS = 200  # of each failure's error
LEVELS: dict[str, Level] = {"succeeded": "success", "partial": "warning"}


@dataclass(frozen=True)
class Digest:
    """The message, and the batch it is about."""

    batch_id: int
    message: Message


def _night_of(engine: Engine, rerun: BatchSummary) -> int | None:
    """Return the finished nightly batch a rerun applies to: of its as-of date, started
    before it, the newest in the one order of nights (as the ranking picks its night)."""
    with engine.connect() as conn:
        return conn.execute(nights_newest_first(
            Batch.as_of == rerun.as_of, Batch.status.in_(FINISHED_STATUSES),
            Batch.id < rerun.id).with_only_columns(Batch.id).limit(1)).scalar()


def _row(row: RankRow) -> str:
    flag = " !" if row.contradicting else ""
    return f"{row.rank}. {row.ticker} {row.rating}{flag} {row.score:+.2f}"


def _change(change: TickerChange) -> str:
    if change.change == "new":
        return f"{change.ticker}: new, {change.rating} {change.score:+.2f} ({change.why})"
    if change.change == "dropped":
        return f"{change.ticker}: dropped, was {change.previous_rating} ({change.why})"
    move = "" if change.score_move is None else f", {change.score_move:+.2f}"
    return (f"{change.ticker}: {change.previous_rating} → {change.rating} "
            f"({change.previous_score:+.2f} → {change.score:+.2f}{move}) {change.change}; "
            f"{change.why}")


def _paused(rate: BatchReport) -> str:
    """Name the pauses the tok/s figure leaves out (a resumed night's time stopped)."""
    if not rate.pauses:
        return ""
    return (f"; {span(rate.paused_seconds)} paused in {rate.pauses} "
            f"pause{'s' if rate.pauses > 1 else ''}, not counted")


def _rate(rate: BatchReport) -> str:
    """Say the output and its rate: ``80.0 tok/s (16000 tokens over 3 min 20 s of calls)``;
    of calls too brief for one (``BatchReport.brief``), the tokens and the time alone."""
    over = f"{rate.completion_tokens} tokens over {span(rate.active_seconds)} of calls"
    if rate.brief:
        return f"{over}, too brief for a rate{_paused(rate)}"
    return f"{rate.output_tokens_per_s:.1f} tok/s ({over}{_paused(rate)})"


def _more(lines: list[str], hint: str) -> list[str]:
    """Return the first LISTED lines, then how many more there are and where to read them."""
    more = [f"… and {len(lines) - LISTED} more ({hint})"] if len(lines) > LISTED else []
    return lines[:LISTED] + more


def build_digest(engine: Engine, settings: Settings, batch_id: int) -> Digest:
    """Build the digest of a nightly batch or rerun from its stored rows."""
    seen = Seen(engine)  # the nightly lock read once for the whole digest
    batch = batch_summary(engine, batch_id, settings.batch.heartbeat_stale_s, seen)
    night_id = batch.id if batch.kind == "nightly" else _night_of(engine, batch)
    ended = batch.status in FINISHED_STATUSES
    rate = throughput(engine, batch.id)
    demo = DEMO if batch.demo else ""
    what = f"nightly batch #{batch.id}" if batch.kind == "nightly" else f"rerun #{batch.id}"
    title = (f"{demo}nightdesk: {what} (as of {batch.as_of}) {batch.status.upper()}, "
             f"{batch.tickers} tickers")
    lines = [f"Status: {batch.status}: {batch.outcome}"
             + (f" — {batch.error}" if batch.error else ""),
             f"Duration: {span(batch.duration_s)}; output {_rate(rate)}; {calls_said(rate)}"]
    # What the ranking shows beside the night: its universe's notes (a ticker left out).
    lines.extend(f"Universe note: {note}" for note in batch.notes)
    steps = next_steps(engine, batch, settings.batch.heartbeat_stale_s, seen)
    lines.extend(_more([f"Next: {step}" for step in steps], f"nightdesk report {batch.id}"))
    rows_of_rerun: list[str] = []
    if batch.kind == "rerun":
        rerun_lines, rows_of_rerun = _rerun_lines(engine, batch, night_id,
                                                  settings.batch.heartbeat_stale_s, seen)
        lines.extend(rerun_lines)
    ranked_id = night_id if night_id is not None else batch.id
    lines.extend(_ends(engine, ranked_id,
                       "" if ranked_id == batch.id else f" (the ranking of batch #{ranked_id})"))
    if night_id is not None or batch.kind == "nightly":
        # A rerun with no night to apply it to changes no ranking: its few tickers beside
        # the night before would read as every other ticker "dropped".
        lines.extend(_change_lines(engine, ranked_id, ended or batch.kind == "rerun"))
    failures = failed_tickers(engine, batch.id, dead=batch.status == "crashed")
    for head, group in (("Failed", [f for f in failures if f.status == "failed"]),
                        ("Not finished", [f for f in failures if f.status != "failed"])):
        if group:
            lines.append(f"{head} ({len(group)}):")
            lines.extend(_more(_by_reason(group), f"nightdesk report {batch.id}"))
    base = settings.web.base_url
    page = (f"{base}/" if batch.kind == "nightly"
            else f"{base}/ticker/{rows_of_rerun[0]}" if rows_of_rerun else f"{base}/")
    lines.append(f"Page: {page} (this batch: {base}/batches/{batch.id})")
    return Digest(batch.id, Message(title, "\n".join(lines),
                                    LEVELS.get(batch.status, "failure")))


def _by_reason(failures: list[FailedTicker]) -> list[str]:
    """Return one line per distinct reason, its tickers named (the most common first)."""
    groups: dict[str, list[str]] = {}
    for failure in failures:
        reason = " ".join((failure.error or "no error recorded").split())[:ERROR_CHARS]
        groups.setdefault(reason, []).append(failure.ticker)
    lines = []
    for reason, tickers in sorted(groups.items(), key=lambda item: -len(item[1])):
        named = ", ".join(tickers[:LISTED]) + (f" and {len(tickers) - LISTED} more"
                                                if len(tickers) > LISTED else "")
        lines.append(f"  {named}: {reason}" if len(tickers) == 1
                     else f"  {len(tickers)} tickers ({named}): {reason}")
    return lines


def _ends(engine: Engine, batch_id: int, of: str) -> list[str]:
    """Return the top five and the bottom five of a batch's ranking (none twice)."""
    _, rows = ranking(engine, batch_id)
    rated = [r for r in rows if r.rank is not None]
    if not rated:
        return []
    lines = [f"Top {min(TOP, len(rated))}{of}: " + "; ".join(map(_row, rated[:TOP]))]
    if len(rated) > TOP:
        lines.append(f"Bottom {min(TOP, len(rated) - TOP)}: "
                     + "; ".join(map(_row, rated[max(TOP, len(rated) - TOP):])))
    # As `nightdesk ranking` and the page say it: a rating that is a rerun's, not the night's.
    reruns = from_reruns(batch_id, rows)
    if reruns:
        lines.append("Reruns applied: " + ", ".join(reruns))
    return lines


def _unfinished_night(engine: Engine, rerun: BatchSummary, stale_s: float, seen: Seen
                      ) -> BatchSummary | None:
    """Return the newest nightly batch of the rerun's date started before it and not finished
    (running, stopped, failed): the night whose ranking will apply the rerun if it ends ranked."""
    with engine.connect() as conn:
        found = conn.execute(nights_newest_first(
            Batch.as_of == rerun.as_of, Batch.id < rerun.id).with_only_columns(Batch.id)
            .limit(1)).scalar()
    return None if found is None else batch_summary(engine, found, stale_s, seen)


def _rerun_lines(engine: Engine, rerun: BatchSummary, night_id: int | None, stale_s: float,
                 seen: Seen) -> tuple[list[str], list[str]]:
    """Return the rerun's result lines and its tickers."""
    _, own = ranking(engine, rerun.id)
    lines = [f"Rerun: {row.ticker} {row.rating} {row.score:+.2f}" if row.rank is not None
             else f"Rerun: {row.ticker} {row.status}" for row in own]
    rated = [row.ticker for row in own if row.rank is not None]
    pending = (_unfinished_night(engine, rerun, stale_s, seen) if night_id is None and rated
               else None)
    if pending is not None:  # the ranking applies a rerun started after its night, once ended
        lines.append(f"Not applied yet: nightly batch #{pending.id} of {rerun.as_of} is "
                     f"{pending.status}, not ranked; its ranking applies this rerun once it "
                     "ends succeeded or partial")
    elif night_id is None:
        lines.append(f"No finished night of {rerun.as_of} to apply it to")
    elif rated:
        # The ranking applies a rerun only to a ticker its night has: one of another
        # universe (or left out by --limit) is rated here and shown nowhere.
        shown = any(r.batch_id == rerun.id for r in ranking(engine, night_id)[1])
        lines.append(f"Applied to the ranking of nightly batch #{night_id}" if shown else
                     f"Not applied: the ranking of nightly batch #{night_id} has no row for "
                     f"{', '.join(rated)} (not in its universe)")
    else:  # the ranking applies only a rerun's ratings: the night's own result stands
        lines.append(f"Not applied: the ranking of nightly batch #{night_id} keeps "
                     f"{', '.join(row.ticker for row in own)}'s earlier result")
    return lines, [row.ticker for row in own]


def _change_lines(engine: Engine, batch_id: int, whole: bool) -> list[str]:
    """Say which ratings changed since the night before; of a night that did not finish, only
    up/downgrades (its missing tickers are not news) "so far", over the tickers compared."""
    try:
        night = compare_nights(engine, batch_id)
    except InputError as error:  # the night before was of another universe
        return [f"Changes: not compared ({error})"]
    if night.against_id is None:
        return [f"Changes: {NO_NIGHT_BEFORE}"]
    changes = [c for c in night.changes if whole or c.change in ("upgrade", "downgrade")]
    head = f"Rating changes since {night.against_as_of} (batch #{night.against_id})"
    if not whole:  # "none" of a night that did not finish: say over how many it is known
        tonight = [t for t in night.tickers if t.status != "absent"]
        compared = sum(t.change in ("upgrade", "downgrade", "same") for t in tonight)
        open_ = any(t.status not in ("succeeded", "failed") for t in tonight)
        head += (f", {compared} of {len(tonight)} tickers rated on both nights"
                 f"{' so far' if open_ else ''}")
    if not changes:
        return [f"{head}: none"]
    return [f"{head}: {len(changes)}",
            *_more([f"  {_change(c)}" for c in changes], f"nightdesk changes --batch {batch_id}")]


def send_digest(settings: Settings, engine: Engine, outcome: Ended) -> None:
    """Send the digest of a batch that has just ended to ``NIGHTDESK_NOTIFY``; never raise.

    A batch that is neither nightly nor a rerun, or no destination set, sends nothing.
    """
    if not settings.notify.urls:
        return
    try:
        with engine.connect() as conn:
            kind = conn.execute(select(Batch.kind).where(Batch.id == outcome.batch_id)).scalar()
        if kind not in KINDS:
            return
        digest = build_digest(engine, settings, outcome.batch_id)
    except Exception as error:  # a digest must never fail the night
        log.error("digest not built", batch_id=outcome.batch_id,
                  error=first_line(error, 1000, typed=True))
        return
    delivery = send(settings.notify.urls, digest.message, settings.notify.timeout_s)
    log.info("digest sent", batch_id=outcome.batch_id, delivered=delivery.sent,
             destinations=delivery.total)


def refusal_digest(settings: Settings, as_of: date | None, why: str, advice: str,
                   outcome: str = "no batch run", headline: str | None = None, *,
                   stored: bool = True, demo: bool = False,
                   level: Level = "failure") -> Message:
    """Build the digest of a night refused at its start: it holds only why (one line) and
    what to do; a failure, as a failed night's digest is. ``outcome``: what did not happen
    (no batch row exists, or a recorded batch was not continued); ``headline``: what befell
    the night instead of being refused (a night the daemon missed); ``stored`` False: the
    database did not take the refusal, so the page does not show it; ``demo``: the night
    would have run on DEMO data, and its title says so first as every digest of one does;
    ``level``: how bad the news is (a notice that nothing was refused: no failure)."""
    base = settings.web.base_url
    page = f"{base}/" if stored else (f"{base}/ does not show this refusal: the database "
                                      "did not store it")
    return Message(f"{DEMO if demo else ''}nightdesk: {refusal_title(as_of, outcome, headline)}",
                   "\n".join([f"Why: {why}", f"What to do: {advice}", f"Page: {page}"]),
                   level)


def refusal_title(as_of: date | None, outcome: str, headline: str | None = None,
                  demo: bool = False) -> str:
    """Return what befell a refused night, as its digest's title says it (and the status,
    which stores it: ``demo`` begins it with the DEMO label, as the digest's title)."""
    night = f"night of {as_of}" if as_of is not None else "the night"
    return f"{DEMO if demo else ''}{headline or f'{night} REFUSED at its start'}, {outcome}"


def send_refusal(settings: Settings, as_of: date | None, why: str, advice: str,
                 outcome: str = "no batch run", headline: str | None = None, *,
                 stored: bool = True, demo: bool = False, level: Level = "failure") -> None:
    """Send ``refusal_digest`` to ``NIGHTDESK_NOTIFY`` (nothing when unset); never raise."""
    if not settings.notify.urls:
        return
    message = refusal_digest(settings, as_of, why, advice, outcome, headline, stored=stored,
                             demo=demo, level=level)
    delivery = send(settings.notify.urls, message, settings.notify.timeout_s)
    # Named by what befell the night, as the batch digest's line by its batch: not all are
    # refusals (a date already analyzed: "nothing run", news "info").
    log.info("digest sent", as_of=None if as_of is None else str(as_of), outcome=outcome,
             news=level, delivered=delivery.sent, destinations=delivery.total)
