"""Watch each nightly batch's rating distribution and write a warning when it looks wrong.

Two checks, after every nightly batch that graded at least ``monitor_min_tickers`` tickers:

- **grade share**: any one grade above ``monitor_max_grade_share`` of the batch's tickers
  (default 70%: the old system's Hold took 66–80%, which says the model hedges);
- **jump**: a test of "tonight's grades come from the same distribution as the trailing
  nights'" whose false-alarm rate is ``monitor_false_alarm_rate`` at every universe size. A
  fixed limit on a distance cannot do that: the distance two draws of one distribution show
  by chance shrinks with the number of tickers, so one limit cries wolf at 6 tickers and
  sleeps at 100. The test conditions on the grades' combined counts (tonight's plus the
  reference's): under the null every split of those grades into tonight's n and the
  reference's is equally likely, so tonight's counts follow a multivariate hypergeometric
  law whatever n is. Its p-value is the Monte Carlo share of ``JUMP_DRAWS`` such splits whose
  Pearson chi-square statistic is at least the observed one, counted as (1 + hits) / (1 +
  draws), which keeps the level at or below the rate for any number of draws (R's
  ``chisq.test(simulate.p.value=TRUE)``). The reference pools the trailing
  ``monitor_trailing_batches`` nightly batches that were not themselves flagged as a jump,
  so one odd night does not make the next normal one look odd. The total-variation distance
  (the share of grades that would have to change) is reported as the size of the move.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import Engine, delete, insert, select

from agents.decision import RATINGS
from app.config import Settings
from app.db.models import FINISHED_STATUSES, Batch, BatchWarning
from app.quality.grades import load_grades
from app.quality.statistics import distribution, total_variation

JUMP_DRAWS = 2000  # Monte Carlo splits per test: the p-value's resolution is 1/2001


@dataclass(frozen=True)
class Finding:
    """One finding of the monitor about one batch."""

    kind: str  # grade_share | distribution_jump
    message: str
    details: dict[str, Any]


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


def jump_p_value(current: dict[str, int], reference: dict[str, int], *,
                 draws: int = JUMP_DRAWS, seed: int = 0) -> float:
    """Return the p-value of "same distribution" for two count tables (module notes)."""
    night = np.array([current.get(r, 0) for r in RATINGS])
    pooled = np.array([reference.get(r, 0) for r in RATINGS])
    observed = float(chi_square(night, pooled))
    splits = np.random.default_rng(seed).multivariate_hypergeometric(
        night + pooled, int(night.sum()), size=draws)
    simulated = chi_square(splits, night + pooled - splits)
    # A tie counts as at least as extreme: the statistic is discrete, and dropping ties
    # would make the test reject more often than its rate.
    hits = int(np.sum(simulated >= observed - 1e-9 * max(1.0, observed)))
    return (1 + hits) / (1 + draws)


def findings(current: dict[str, int], trailing: list[dict[str, int]],
             settings: Settings) -> list[Finding]:
    """Return the warnings a distribution earns against its trailing batches' distributions."""
    total = sum(current.values())
    if total < settings.monitor_min_tickers:
        return []
    found = []
    for rating, count in current.items():
        share = count / total
        if share > settings.monitor_max_grade_share:
            found.append(Finding(
                "grade_share",
                f"{rating} is {share:.0%} of {total} graded tickers "
                f"(limit {settings.monitor_max_grade_share:.0%})",
                {"rating": rating, "share": share, "tickers": total,
                 "limit": settings.monitor_max_grade_share}))
    pooled = {r: sum(d.get(r, 0) for d in trailing) for r in current}
    tvd = total_variation(current, pooled)
    if tvd is None:
        return found
    rate = settings.monitor_false_alarm_rate
    p_value = jump_p_value(current, pooled)
    if p_value <= rate:
        found.append(Finding(
            "distribution_jump",
            f"rating distribution moved by TVD {tvd:.2f} from the trailing {len(trailing)} "
            f"nightly batch(es): p {p_value:.4f}, at most {rate:.2%} of unchanged nights "
            "are flagged",
            {"tvd": tvd, "p_value": p_value, "false_alarm_rate": rate, "current": current,
             "trailing": pooled, "trailing_batches": len(trailing)}))
    return found


def reference_batches(engine: Engine, batch_id: int, settings: Settings) -> list[int]:
    """Return the trailing nightly batches the jump test pools, newest first.

    The ``monitor_trailing_batches`` newest finished nightly batches before ``batch_id``
    that graded a ticker and were not flagged as a jump themselves.
    """
    with engine.connect() as conn:
        earlier = conn.execute(
            select(Batch.id).where(Batch.kind == "nightly", Batch.id < batch_id,
                                   Batch.status.in_(FINISHED_STATUSES))
            .order_by(Batch.id.desc())).scalars().all()
        flagged = set(conn.execute(
            select(BatchWarning.batch_id).where(BatchWarning.kind == "distribution_jump",
                                                BatchWarning.batch_id < batch_id)
        ).scalars())
    chosen: list[int] = []
    for candidate in earlier:
        if len(chosen) == settings.monitor_trailing_batches:
            break
        if candidate not in flagged and any(batch_distribution(engine, candidate).values()):
            chosen.append(candidate)
    return chosen


def check_batch(engine: Engine, batch_id: int, settings: Settings) -> list[Finding]:
    """Compare the batch with its trailing nightly batches and store what it finds.

    Idempotent: the batch's earlier warnings are replaced, so it can be run again.
    """
    trailing = [batch_distribution(engine, i)
                for i in reference_batches(engine, batch_id, settings)]
    found = findings(batch_distribution(engine, batch_id), trailing, settings)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(delete(BatchWarning).where(BatchWarning.batch_id == batch_id))
        if found:
            conn.execute(insert(BatchWarning), [
                {"batch_id": batch_id, "kind": w.kind, "message": w.message,
                 "details": w.details, "created_at": now} for w in found])
    return found


def warnings_for(engine: Engine, batch_id: int) -> list[str]:
    """Return the stored warning messages of one batch, oldest first."""
    with engine.connect() as conn:
        return list(conn.execute(select(BatchWarning.message)
                                 .where(BatchWarning.batch_id == batch_id)
                                 .order_by(BatchWarning.id)).scalars())
