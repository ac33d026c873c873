"""What to do about a batch that ended short: the nightdesk commands that fit it.

The one place advice is made: the digest, the ranking page's banner, ``nightdesk ranking``
and ``nightdesk report`` all show ``next_steps``. It asks the same question ``run --resume``
asks (``app.morning.summary.tickers_left``), so when resume's rules change the advice follows:
a batch with tickers left is resumed; one whose tickers all finished but some failed has
those reruns; one that runs, or has nothing to redo, gets none.

Stored errors may carry the hint their writer had in mind (``resume with `nightdesk run
--resume N```); ``app.morning.summary`` reads them without it, so a message names one command, the
fitting one, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime

from sqlalchemy import Engine, select

from agents.data.snapshot import latest_as_of
from app.config import Settings
from app.db.models import Batch, TickerRun
from app.home import unwritable
from app.morning.numbers import counted
from app.morning.summary import (
    RESUMABLE_KINDS,
    BatchSummary,
    Seen,
    batch_summary,
    failed_tickers,
    rated_by_reruns,
    tickers_left,
)

# What a morning with no night since the due time is advised (the timer's own command).
START_NIGHT = "nightdesk run --continue-night"


@dataclass(frozen=True)
class Advice:
    """One command line to run as is, and what it does for the batch."""

    command: str
    does: str

    def __str__(self) -> str:
        return f"{self.command} ({self.does})"


def next_steps(engine: Engine, batch: BatchSummary, stale_s: float,
               seen: Seen | None = None) -> list[Advice]:
    """Return the commands that fit ``batch`` (its status as ``summary.Seen.status`` says,
    with ``stale_s``, ``heartbeat_stale_s``).

    A nightly batch or rerun that no longer runs and has tickers ``run --resume`` takes up:
    resume it; a nightly one once the nightly batch running now (which holds the lock the
    resume takes) has ended; a partial one not where later reruns have rated all of them
    (``rated_by_reruns``). A failed nightly batch: resume it retrying its failed tickers
    (the ranking shows no failed night, so applies no rerun of one). Else, each ticker that
    failed and no later rerun (of the same date) has redone: rerun it for the batch's date
    and samples. ``seen``: the request's (``summary.Seen``), where it has one.
    """
    if batch.status == "running" or batch.kind not in RESUMABLE_KINDS:
        return []
    with engine.connect() as conn:
        left = tickers_left(conn, batch.id)
        # Of those, the ones that ended failed (by the server or the database): they did
        # finish, and are taken up again, not continued.
        failed = set(conn.execute(select(TickerRun.ticker).where(
            TickerRun.batch_id == batch.id, TickerRun.status == "failed")).scalars())
    if rated_by_reruns(engine, batch.id, batch.as_of, batch.status, left):
        left = []
    if left:
        again = sum(1 for ticker in left if ticker in failed)
        parts = [f"continues its {counted(len(left) - again, 'ticker')} not finished"] \
            if len(left) > again else []
        if again:
            parts.append(f"runs again {'the' if parts else 'its'} {counted(again, 'ticker')} the "
                         "server or database failed")
        does = " and ".join(parts)
        holder = running_night(engine, stale_s, seen) if batch.kind == "nightly" else None
        if holder is not None and holder != batch.id:
            # Until then the resume answers `already running: batch M` (exit 4).
            does += f", once batch {holder}, running now, has ended"
        return [Advice(f"nightdesk run --resume {batch.id}", does)]
    if batch.status in ("interrupted", "crashed"):
        # Every ticker finished, its end not stored (the disk full as it ended, a kill just
        # before): the resume writes it (app.runs.resumable's UNENDED), and the night is ranked.
        return [Advice(f"nightdesk run --resume {batch.id}",
                       "writes the end it lacks: every ticker finished")]
    if batch.kind == "nightly" and batch.status == "failed" and failed:
        # No ranking shows a failed night, so none would apply a rerun of its tickers (the
        # rerun's digest: "no finished night of D to apply it to"): they run again in it.
        return [Advice(f"nightdesk run --resume {batch.id} --retry-failed",
                       f"runs its {counted(len(failed), 'ticker')} again in this batch, which the "
                       "ranking then shows; a rerun of a failed night is applied to no ranking")]
    samples = f" --samples {batch.samples}" if batch.samples and batch.samples > 1 else ""
    # A later rerun that succeeded has redone a ticker, for its night or a rerun before it.
    return [Advice(f"nightdesk rerun {failed.ticker} --as-of {batch.as_of}{samples}",
                   f"runs {failed.ticker} again; the ranking applies it")
            for failed in failed_tickers(engine, batch.id)
            if failed.status == "failed" and failed.rated_by is None]


def first_night(settings: Settings) -> list[Advice]:
    """Return what a database with no night yet is advised: ``nightdesk run``, after
    ``nightdesk data demo`` where there is no snapshot to run it on (it would refuse), once
    the home takes writes where it does not (the run would refuse that too)."""
    if why := unwritable(settings.paths.home):
        return [Advice("nightdesk run", f"runs the first night once the data home is writable: "
                       f"{why}; remount it read-write, or set NIGHTDESK_HOME to a "
                       "writable folder")]
    if settings.agents.data_provider == "snapshot" and latest_as_of(
            settings.paths.data_dir) is None:
        return [Advice("nightdesk data demo", f"writes a seeded DEMO snapshot, synthetic "
                       f"data, under {settings.paths.data_dir}; `nightdesk data freeze` "
                       "writes market data instead"),
                Advice("nightdesk run", "then runs the first night on it")]
    return [Advice("nightdesk run", "runs the first night")]


def missed_night(settings: Settings, latest: date | None,
                 analyzed: date | None = None) -> list[Advice]:
    """Return what a stale morning whose latest night (of as-of ``latest``) leaves nothing
    to do is advised: the night that did not come, by the timer's own command; but where
    that would only say again that its date was analyzed (``analyzed``: the date a standing
    notice names; else the newest snapshot's, when it is ``latest``), the command that
    analyzes that date again, and where newer data comes from."""
    if analyzed is None and settings.agents.data_provider == "snapshot" \
            and latest is not None and latest_as_of(settings.paths.data_dir) == latest:
        analyzed = latest
    if analyzed is None:
        return [Advice(START_NIGHT, "starts the night that did not come; first see why the "
                                    "timer or daemon did not")]
    return [Advice(f"nightdesk run --as-of {analyzed}",
                   f"analyzes {analyzed} again as a new nightly batch; no newer snapshot came "
                   "to run a night on: `nightdesk data freeze --help` says how to write one")]


def running_night(engine: Engine, stale_s: float, seen: Seen | None = None) -> int | None:
    """Return the newest nightly batch that runs (``Seen.status``), if any."""
    now, seen = datetime.now(UTC), seen or Seen(engine)
    with engine.connect() as conn:
        rows = conn.execute(select(Batch.id, Batch.heartbeat_at, Batch.started_at, Batch.settings)
                            .where(Batch.kind == "nightly", Batch.status == "running")
                            .order_by(Batch.id.desc())).all()
    return next((int(row.id) for row in rows if seen.status(
        row.id, "running", "nightly", row.settings, row.heartbeat_at, row.started_at, stale_s,
        now)[0] == "running"), None)


def advise(engine: Engine, batch_id: int, stale_s: float, seen: Seen | None = None) -> str:
    """Return ``next_steps`` of batch ``batch_id`` as one clause ("" when none fits);
    ``seen``: the request's, where it has one."""
    seen = seen or Seen(engine)
    steps = next_steps(engine, batch_summary(engine, batch_id, stale_s, seen), stale_s, seen)
    return "; ".join(f"`{step.command}` {step.does}" for step in steps)
