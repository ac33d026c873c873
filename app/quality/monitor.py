"""Watch each nightly batch's rating distribution and write a warning when it looks wrong.

Two checks, after every nightly batch that graded at least ``monitor_min_tickers`` tickers:

- **grade share**: any one grade above ``monitor_max_grade_share`` of the batch's tickers
  (default 70%: the old system's Hold took 66–80%, which says the model hedges);
- **jump**: the total-variation distance between this batch's distribution and the pooled
  distribution of the trailing ``monitor_trailing_batches`` nightly batches above
  ``monitor_max_tvd``. TVD = ½·Σ|p−q| is the share of grades that would have to change
  to turn one distribution into the other. It is used rather than a chi-square test
  because a night has tens of tickers, so expected counts per grade are often below the
  five a chi-square approximation needs, and a p-value would depend on the universe size
  while TVD reads the same at 6 or 100 tickers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, delete, insert, select

from app.batch.store import FINISHED_STATUSES
from app.config import Settings
from app.db.models import Batch, BatchWarning
from app.quality.grades import load_grades
from app.quality.statistics import distribution, total_variation


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
    if tvd is not None and tvd > settings.monitor_max_tvd:
        found.append(Finding(
            "distribution_jump",
            f"rating distribution moved by TVD {tvd:.2f} from the trailing {len(trailing)} "
            f"nightly batch(es) (limit {settings.monitor_max_tvd:.2f})",
            {"tvd": tvd, "limit": settings.monitor_max_tvd, "current": current,
             "trailing": pooled, "trailing_batches": len(trailing)}))
    return found


def check_batch(engine: Engine, batch_id: int, settings: Settings) -> list[Finding]:
    """Compare the batch with its trailing nightly batches and store what it finds.

    Idempotent: the batch's earlier warnings are replaced, so it can be run again.
    """
    with engine.connect() as conn:
        earlier = conn.execute(
            select(Batch.id).where(Batch.kind == "nightly", Batch.id < batch_id,
                                   Batch.status.in_(FINISHED_STATUSES))
            .order_by(Batch.id.desc()).limit(settings.monitor_trailing_batches)
        ).scalars().all()
    trailing = [d for d in (batch_distribution(engine, i) for i in earlier) if sum(d.values())]
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
