"""Watch each nightly batch's rating distribution and write a warning when it looks wrong.

After every nightly batch that graded at least ``monitor_min_tickers`` tickers, three tests
(``grade_share``, ``distribution_jump``, ``concentration``) each run at a third of
``monitor_false_alarm_rate`` (``TEST_LEVEL``), so an unchanged night gets any warning on at
most that rate of nights. The reference pools the trailing ``monitor_trailing_batches``
nights not flagged as moved; ``monitor_new_normal_after`` moved nights in a row, or
``nightdesk quality acknowledge``, make a new normal. docs/quality.md ("The
rating-distribution monitor") gives each test's statistic and its calibration.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
from scipy import stats
from sqlalchemy import Engine, delete, insert, select

from agents.decision import RATINGS
from app.config import Settings
from app.db.batchsettings import BatchSettings
from app.db.models import FINISHED_STATUSES, Batch, BatchWarning
from app.errors import InputError
from app.quality.grades import load_grades
from app.quality.statistics import distribution, total_variation

TESTS = 3  # grade share, jump and concentration: they share the false-alarm rate
JUMP_DRAWS = 2000  # Monte Carlo splits per test at the default rate: p's resolution 1/2001
DRAWS_PER_RATE = 20  # at least 20/rate splits, so the smallest p is far below each test's level
MOVED = frozenset({"distribution_jump", "concentration"})  # what keeps a night out
BASELINE = frozenset({"new_normal", "acknowledged"})  # a night that starts a new normal
WRITTEN = frozenset({"grade_share", "new_normal"}) | MOVED  # what check_batch replaces


@dataclass(frozen=True)
class Finding:
    """One finding of the monitor about one batch."""

    kind: str  # grade_share | distribution_jump | concentration | new_normal
    message: str
    details: dict[str, Any]


@dataclass(frozen=True)
class NightRecord:
    """What the monitor needs to know of an earlier nightly batch."""

    batch_id: int
    distribution: dict[str, int] | None  # None: not loaded (check_batch loads it on demand)
    moved: bool  # flagged by the jump or the concentration test
    new_normal_since: int | None = None  # the batch starts a new normal since this batch

    @classmethod
    def judged(cls, batch_id: int, counts: dict[str, int],
               found: Sequence[Finding]) -> NightRecord:
        """Return the record of a night the monitor just judged."""
        since = next((f.details["since_batch"] for f in found if f.kind in BASELINE), None)
        return cls(batch_id, counts, any(f.kind in MOVED for f in found), since)


@dataclass(frozen=True)
class Window:
    """The reference nights of the next night, and the moved nights just before it."""

    nights: list[NightRecord]  # newest first
    moved_run: list[int]  # batch ids of the consecutive moved nights just before, newest first


def reference_window(history: Sequence[NightRecord], settings: Settings,
                     distribution_of: Callable[[NightRecord], dict[str, int]] | None = None,
                     ) -> Window:
    """Return the next night's reference nights from the earlier nights (oldest first).

    After the newest new normal (since batch N, declared on batch D) only nights from N on
    count; the moved nights from N to D are the new normal itself and count, later moved
    nights do not. A night that graded nothing is skipped.
    """
    def counts(record: NightRecord) -> dict[str, int]:
        if record.distribution is not None:
            return record.distribution
        if distribution_of is None:
            raise ValueError(f"no distribution for batch {record.batch_id}")
        return distribution_of(record)

    since, declared = 0, -1
    for record in history:
        if record.new_normal_since is not None:
            since, declared = record.new_normal_since, record.batch_id
    current = [r for r in history if r.batch_id >= since]
    chosen: list[NightRecord] = []
    for record in reversed(current):
        if len(chosen) == settings.quality.trailing_batches:
            break
        if record.moved and record.batch_id > declared:
            continue
        if any(counts(record).values()):
            chosen.append(NightRecord(record.batch_id, counts(record), record.moved,
                                      record.new_normal_since))
    run = []
    for record in reversed(current):
        if not record.moved or record.batch_id <= declared:
            break
        run.append(record.batch_id)
    return Window(chosen, run)


def batch_distribution(engine: Engine, batch_id: int) -> dict[str, int]:
    """Return the batch's consensus ratings per grade."""
    grades = load_grades(engine, batch_id)
    return distribution([grades.consensus(t)[0] for t in grades.tickers])


def chi_square(night: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Return Pearson's chi-square of homogeneity for 2×K tables (rows along the last axis)."""
    night, reference = np.asarray(night, dtype=float), np.asarray(reference, dtype=float)
    total = night + reference
    n, m = night.sum(axis=-1, keepdims=True), reference.sum(axis=-1, keepdims=True)
    expect_n, expect_m = total * n / (n + m), total * m / (n + m)
    used = total > 0  # a grade neither side gave adds nothing
    with np.errstate(divide="ignore", invalid="ignore"):
        cells = np.where(used, (night - expect_n) ** 2 / expect_n
                         + (reference - expect_m) ** 2 / expect_m, 0.0)
    return np.asarray(cells.sum(axis=-1))


def concentration(night: np.ndarray) -> np.ndarray:
    """Return the sum of squared counts per row: n² × the Herfindahl index of its shares."""
    night = np.asarray(night, dtype=float)
    return np.asarray((night * night).sum(axis=-1))


def split_p_values(current: dict[str, int], reference: dict[str, int], *,
                   draws: int = JUMP_DRAWS, seed: int = 0) -> tuple[float, float]:
    """Return the p-values of "same distribution" (jump) and of "no more concentrated than
    the reference" (concentration) for two count tables, over the same random splits."""
    night = np.array([current.get(r, 0) for r in RATINGS])
    pooled = np.array([reference.get(r, 0) for r in RATINGS])
    splits = np.random.default_rng(seed).multivariate_hypergeometric(
        night + pooled, int(night.sum()), size=draws)
    values = []
    for observed, simulated in (
            (float(chi_square(night, pooled)), chi_square(splits, night + pooled - splits)),
            (float(concentration(night)), concentration(splits))):
        # A tie counts as at least as extreme: the statistic is discrete, and dropping ties
        # would make the test reject more often than its rate.
        hits = int(np.sum(simulated >= observed - 1e-9 * max(1.0, observed)))
        values.append((1 + hits) / (1 + draws))
    return values[0], values[1]


def split_draws(settings: Settings) -> int:
    """Return the random splits per test: the smallest p-value, 1/(1 + draws), must lie well
    below each test's level (a third of the rate), or no night could ever be flagged."""
    return max(JUMP_DRAWS, math.ceil(DRAWS_PER_RATE / settings.quality.false_alarm_rate))


def test_level(settings: Settings) -> float:
    """Return the level each of the three tests runs at: its share of the false-alarm rate."""
    return settings.quality.false_alarm_rate / TESTS


def share_p_value(count: int, tickers: int, limit: float) -> float:
    """Return P(at least ``count`` of ``tickers``) for a desk whose true share is ``limit``."""
    return float(stats.binomtest(count, tickers, limit, alternative="greater").pvalue)


def share_findings(current: dict[str, int], settings: Settings) -> list[Finding]:
    """Return the grade-share warnings: exact binomial tests against the limit."""
    total = sum(current.values())
    limit = settings.quality.max_grade_share
    level = test_level(settings) / max(1, math.floor(1 / limit))
    found = []
    for rating in RATINGS:
        count = current.get(rating, 0)
        if count / total <= limit:
            continue  # at or below the limit: never evidence of being above it
        p_value = share_p_value(count, total, limit)
        if p_value <= level:
            found.append(Finding(
                "grade_share",
                f"{rating} is {count / total:.0%} of {total} graded tickers: p {p_value:.4f} "
                f"that a desk giving it to at most {limit:.0%} does so by chance",
                {"rating": rating, "share": count / total, "tickers": total, "limit": limit,
                 "p_value": p_value, "level": level}))
    return found


def findings(current: dict[str, int], trailing: list[dict[str, int]], settings: Settings, *,
             seed: int = 0, moved_run: Sequence[int] = (),
             batch_id: int | None = None) -> list[Finding]:
    """Return the warnings a distribution earns against its reference nights' distributions.

    ``moved_run`` (the consecutive moved nights just before, newest first) and ``batch_id``
    let a moved night declare the new normal; without ``batch_id`` it never does.
    """
    total = sum(current.values())
    if total < settings.quality.min_tickers:
        return []
    found = share_findings(current, settings)
    pooled = {r: sum(d.get(r, 0) for d in trailing) for r in RATINGS}
    tvd = total_variation(current, pooled)
    if tvd is None:
        return found
    rate = settings.quality.false_alarm_rate
    level = test_level(settings)
    jump, piled = split_p_values(current, pooled, draws=split_draws(settings), seed=seed)
    common = {"tvd": tvd, "false_alarm_rate": rate, "level": level, "current": current,
              "trailing": pooled, "trailing_batches": len(trailing)}
    if jump <= level:
        found.append(Finding(
            "distribution_jump",
            f"rating distribution moved by TVD {tvd:.2f} from the trailing {len(trailing)} "
            f"nightly batch(es): p {jump:.2g}, at most {rate:.2%} of unchanged nights "
            "get any warning", {**common, "p_value": jump}))
    if piled <= level:
        top = max(RATINGS, key=lambda r: current.get(r, 0))
        found.append(Finding(
            "concentration",
            f"grades piled up: {top} is {current.get(top, 0) / total:.0%} of {total} against "
            f"{pooled[top] / max(1, sum(pooled.values())):.0%} in the trailing "
            f"{len(trailing)} nightly batch(es): p {piled:.2g}, at most {rate:.2%} of "
            "unchanged nights get any warning", {**common, "p_value": piled}))
    moved = jump <= level or piled <= level
    if moved and batch_id is not None and len(moved_run) + 1 >= settings.quality.new_normal_after:
        since = min([*moved_run, batch_id])
        found.append(Finding(
            "new_normal",
            f"a new normal since batch {since}: {len(moved_run) + 1} nights in a row moved "
            "from the earlier ones; later nights are judged against the nights since then",
            {"since_batch": since, "nights": len(moved_run) + 1}))
    return found


def history(engine: Engine, batch_id: int) -> list[NightRecord]:
    """Return the finished nightly batches before ``batch_id``, oldest first, not loaded.

    Before by batch id (creation order), not the one order of nights (``newest_first``),
    on purpose: the monitor watches the pipeline's grades drift over the runs (a model,
    prompt or server change; a new normal the operator declares "from this night on"),
    which is the order the batches ran in; a date analyzed again later ran with the
    pipeline as it was then. See docs/lab/2026-12-06-left-alone-2.md.
    """
    with engine.connect() as conn:
        # Only the nights on the same data, DEMO or market: a move between them is the data's.
        demo = BatchSettings.read(conn.execute(select(Batch.settings)
                                               .where(Batch.id == batch_id)).scalar()).demo_data
        earlier = [i for i, done in conn.execute(
            select(Batch.id, Batch.settings).where(Batch.kind == "nightly", Batch.id < batch_id,
                                                   Batch.status.in_(FINISHED_STATUSES))
            .order_by(Batch.id)) if BatchSettings.read(done).demo_data == demo]
        marks = conn.execute(
            select(BatchWarning.batch_id, BatchWarning.kind, BatchWarning.details)
            .where(BatchWarning.batch_id < batch_id,
                   BatchWarning.kind.in_(MOVED | BASELINE))).all()
    moved = {m.batch_id for m in marks if m.kind in MOVED}
    since: dict[int, int] = {}
    for mark in marks:
        if mark.kind in BASELINE:
            since[mark.batch_id] = max(since.get(mark.batch_id, 0),
                                       int((mark.details or {})["since_batch"]))
    return [NightRecord(i, None, i in moved, since.get(i)) for i in earlier]


def _window(engine: Engine, batch_id: int, settings: Settings) -> Window:
    return reference_window(history(engine, batch_id), settings,
                            lambda record: batch_distribution(engine, record.batch_id))


def reference_batches(engine: Engine, batch_id: int, settings: Settings) -> list[int]:
    """Return the reference nightly batches the tests pool for ``batch_id``, newest first."""
    return [r.batch_id for r in _window(engine, batch_id, settings).nights]


def check_batch(engine: Engine, batch_id: int, settings: Settings) -> list[Finding]:
    """Compare the batch with its reference nightly batches and store what it finds.

    Idempotent: the batch's earlier monitor warnings are replaced, so it can be run again;
    an operator's acknowledgement on it is kept.
    """
    window = _window(engine, batch_id, settings)
    found = findings(batch_distribution(engine, batch_id),
                     [r.distribution or {} for r in window.nights], settings,
                     moved_run=window.moved_run, batch_id=batch_id)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(delete(BatchWarning).where(BatchWarning.batch_id == batch_id,
                                                BatchWarning.kind.in_(WRITTEN)))
        if found:
            conn.execute(insert(BatchWarning), [
                {"batch_id": batch_id, "kind": w.kind, "message": w.message,
                 "details": w.details, "created_at": now} for w in found])
    return found


def acknowledge(engine: Engine, batch_id: int) -> str:
    """Record the operator's word that ``batch_id`` starts a new normal; return the message.

    Later nights are judged against the nights from ``batch_id`` on. InputError when it is
    not a finished nightly batch.
    """
    with engine.connect() as conn:
        kind = conn.execute(select(Batch.kind).where(
            Batch.id == batch_id, Batch.status.in_(FINISHED_STATUSES))).scalar()
    if kind != "nightly":
        raise InputError(f"batch {batch_id} is not a finished nightly batch: only a nightly "
                         "batch can start a new normal")
    message = (f"a new normal since batch {batch_id}, acknowledged by the operator: later "
               "nights are judged against the nights since then")
    with engine.begin() as conn:
        conn.execute(delete(BatchWarning).where(BatchWarning.batch_id == batch_id,
                                                BatchWarning.kind == "acknowledged"))
        conn.execute(insert(BatchWarning).values(
            batch_id=batch_id, kind="acknowledged", message=message,
            details={"since_batch": batch_id}, created_at=datetime.now(UTC)))
    return message


def warnings_for(engine: Engine, batch_id: int) -> list[str]:
    """Return the stored warning messages of one batch, oldest first."""
    with engine.connect() as conn:
        return list(conn.execute(select(BatchWarning.message)
                                 .where(BatchWarning.batch_id == batch_id)
                                 .order_by(BatchWarning.id)).scalars())
