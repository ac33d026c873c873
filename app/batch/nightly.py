"""Run one night: the entry point that `nightdesk run`, the scheduler daemon and the timer share.

A nightly run takes the single-instance lock before it writes anything, decides its as-of
date and universe, and runs the batch; the lock is let go when the batch row is final.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path

import structlog
from sqlalchemy import Engine, select

from agents.data.snapshot import UNIVERSE, day_dir, latest_as_of
from agents.tickers import choose_tickers, read_universe
from app.batch.engine import BatchEngine, BatchOutcome, BatchPlan
from app.batch.lock import nightly_lock
from app.batch.signals import run_batch
from app.config import Settings
from app.db.engine import ready_engine, session_factory
from app.db.models import Batch
from app.errors import InputError, NightdeskError
from serving.facts import batch_server_facts

log = structlog.get_logger(__name__)

# A nightly batch in one of these states did not finish: the night is owed a resume.
# "running" counts too because it is only ever looked at under the lock, where no live
# run can own it: its process died without a word.
UNFINISHED = ("crashed", "interrupted", "running")
FINISHED = ("succeeded", "partial")


class ResumeUnavailableError(NightdeskError):
    """A cut-short night needs a resume that this build cannot do."""


@dataclass
class NightlyRequest:
    """What one night analyzes; every field left empty takes the settings' default."""

    as_of: date | None = None
    tickers: str | None = None
    universe: Path | None = None
    limit: int | None = None
    samples: int | None = None
    strategy: str = "adaptive"


@dataclass
class NightlyResult:
    """What a nightly run did: its batch's outcome (None: skipped, the night was done)."""

    outcome: BatchOutcome | None
    tickers: int = 0


def default_as_of(settings: Settings) -> date:
    """Return the as-of date of a run given none: the newest snapshot, or today (live data)."""
    if settings.data_provider != "snapshot":
        return date.today()
    newest = latest_as_of(settings.data_dir)
    if newest is None:
        raise InputError(f"no snapshot under {settings.data_dir}: run `nightdesk data demo` "
                         "or `nightdesk data freeze` first, or pass --as-of")
    return newest


def nightly_tickers(settings: Settings, as_of: date, tickers: str | None = None,
                    universe: Path | None = None) -> tuple[list[str], list[str]]:
    """Return the night's tickers and notes: the options, else NIGHTDESK_UNIVERSE_FILE,
    else the snapshot's own universe.txt."""
    if tickers is not None or universe is not None:
        return choose_tickers(tickers, universe)
    notes: list[str] = []
    if settings.universe_file is not None:
        return read_universe(settings.universe_file, notes), notes
    snapshot_universe = day_dir(settings.data_dir, as_of) / UNIVERSE
    if settings.data_provider == "snapshot" and snapshot_universe.is_file():
        return read_universe(snapshot_universe, notes), notes
    raise InputError("no universe: give --tickers or --universe, or set "
                     "NIGHTDESK_UNIVERSE_FILE")


def unfinished_batch(engine: Engine, as_of: date) -> Batch | None:
    """Return the newest nightly batch of ``as_of`` that did not finish (call under the lock)."""
    with session_factory(engine)() as session:
        return session.scalars(select(Batch)
                               .where(Batch.kind == "nightly", Batch.as_of == as_of,
                                      Batch.status.in_(UNFINISHED))
                               .order_by(Batch.id.desc()).limit(1)).first()


def finished_since(engine: Engine, as_of: date, since: datetime) -> int | None:
    """Return a nightly batch of ``as_of`` that started at or after ``since`` and finished."""
    with engine.connect() as conn:
        return conn.execute(select(Batch.id)
                            .where(Batch.kind == "nightly", Batch.as_of == as_of,
                                   Batch.status.in_(FINISHED), Batch.started_at >= since)
                            .order_by(Batch.id.desc()).limit(1)).scalar()


def execute_plan(settings: Settings, engine: Engine, plan: BatchPlan) -> BatchOutcome:
    """Run one batch to its final row; SIGTERM or Ctrl-C end it as interrupted."""
    facts = batch_server_facts(settings.server_profile, settings.base_url,
                               settings.server_dir)
    return run_batch(BatchEngine(settings, engine, server_facts=facts).run(plan))


def resume_batch(settings: Settings, engine: Engine, batch: Batch) -> BatchOutcome:
    """Continue a cut-short nightly batch from where it stopped.

    Resuming at node granularity (checkpoints, ``nightdesk run --resume``) belongs to the
    reliability work; until it is in this build, a cut-short night is reported and left for
    the operator rather than silently run a second time.
    """
    raise ResumeUnavailableError(
        f"batch {batch.id} (nightly, as of {batch.as_of}) did not finish ({batch.status}) "
        "and this build cannot resume it: run `nightdesk run` to start the night again")


def run_nightly(settings: Settings, request: NightlyRequest | None = None, *,
                engine: Engine | None = None, resume: bool = False,
                skip_if_finished_since: datetime | None = None) -> NightlyResult:
    """Run tonight's batch under the single-instance lock and say what it did.

    ``resume``: continue an unfinished nightly batch of the same as-of date instead of
    starting a second one. ``skip_if_finished_since``: run nothing when a nightly batch of
    that date has finished since then (a scheduled run that fired again after its batch was
    done). Raise AlreadyRunningError when another run holds the lock: then no batch row is
    written and no LLM call made.
    """
    request = request or NightlyRequest()
    engine = engine or ready_engine(settings.database_url)
    with nightly_lock(engine):
        as_of = request.as_of or default_as_of(settings)
        if skip_if_finished_since is not None:
            done = finished_since(engine, as_of, skip_if_finished_since)
            if done is not None:
                log.info("night already done", batch_id=done, as_of=str(as_of))
                return NightlyResult(None)
        if resume:
            unfinished = unfinished_batch(engine, as_of)
            if unfinished is not None:
                log.info("resuming the night", batch_id=unfinished.id,
                         status=unfinished.status, as_of=str(as_of))
                return NightlyResult(resume_batch(settings, engine, unfinished),
                                     unfinished.tickers_total)
        symbols, notes = nightly_tickers(settings, as_of, request.tickers, request.universe)
        for note in notes:
            log.warning("universe note", note=note)
        symbols = symbols[:request.limit] if request.limit else symbols
        plan = BatchPlan("nightly", as_of, symbols, request.samples or settings.samples,
                         request.strategy)
        return NightlyResult(execute_plan(settings, engine, plan), len(symbols))
