"""Check the rating-distribution monitor: its two tests, storage, the hook and where it shows."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chi2_contingency, multivariate_hypergeom
from sqlalchemy import Engine, func, select

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from agents.data.snapshot import SnapshotProvider
from agents.graph import node_names
from app.batch.engine import BatchEngine, BatchPlan
from app.config import load_settings
from app.db.models import BatchWarning
from app.quality import monitor
from app.quality.monitor import (
    JUMP_DRAWS,
    check_batch,
    findings,
    jump_p_value,
    reference_batches,
    warnings_for,
)
from tests.fakevllm import ChatRequest, FakeServer, Reply
from tests.unit.quality_rows import SCALE, add_batch, one_each
from tests.unit.test_report import nightdesk

SIX = ["AAA", "BBB", "CCC", "DDD", "EEE", "FFF"]


def dist(**counts: int) -> dict[str, int]:
    return {r: counts.get(r, 0) for r in ("Buy", "Overweight", "Hold", "Underweight", "Sell")}


def test_grade_share_above_the_limit() -> None:
    settings = load_settings()
    (found,) = findings(dist(Hold=5, Buy=1), [], settings)  # 83% > 70%
    assert found.kind == "grade_share" and found.details["rating"] == "Hold"
    assert found.details["share"] == pytest.approx(5 / 6)
    assert "Hold is 83% of 6" in found.message
    assert findings(dist(Hold=4, Buy=1, Sell=1), [], settings) == []  # 67%
    # Fewer graded tickers than monitor_min_tickers (5): too few to judge.
    assert findings(dist(Hold=4), [], settings) == []
    strict = load_settings(monitor_max_grade_share=0.5)
    assert [f.details["rating"] for f in findings(dist(Buy=4, Sell=2), [], strict)] == ["Buy"]


def exact_p_value(current: dict[str, int], reference: dict[str, int]) -> float:
    """The jump test's p-value by enumerating every split (scipy's pmf and chi-square)."""
    night = [current[r] for r in SCALE]
    pooled = [reference[r] for r in SCALE]
    total = [a + b for a, b in zip(night, pooled, strict=True)]
    used = [i for i, t in enumerate(total) if t]

    def statistic(row: list[int]) -> float:
        table = np.array([[row[i] for i in used], [total[i] - row[i] for i in used]])
        return float(chi2_contingency(table, correction=False).statistic)

    observed, n, p = statistic(night), sum(night), 0.0
    for row in itertools.product(*(range(t + 1) for t in total)):
        if sum(row) == n and statistic(list(row)) >= observed - 1e-9:
            p += multivariate_hypergeom.pmf(list(row), m=total, n=n)
    return min(p, 1.0)  # the pmf's rounding can sum past 1


@pytest.mark.parametrize(("current", "reference"), [
    (dist(Buy=3, Overweight=2, Hold=1), dist(Overweight=2, Hold=7, Sell=3)),
    (dist(Hold=4, Buy=1, Sell=1), dist(Hold=8, Buy=2, Sell=2)),  # the same shares
    (dist(Buy=6), dist(Hold=9, Buy=3)),
])
def test_jump_p_value_matches_the_exact_test(current: dict[str, int],
                                             reference: dict[str, int]) -> None:
    exact = exact_p_value(current, reference)
    estimate = jump_p_value(current, reference)
    # Monte Carlo over JUMP_DRAWS splits: within four of its standard errors (and the +1).
    error = math.sqrt(exact * (1 - exact) / JUMP_DRAWS) + 1 / JUMP_DRAWS
    assert abs(estimate - exact) <= 4 * error, (estimate, exact)


def test_jump_flags_at_the_false_alarm_rate_and_reports_the_tvd() -> None:
    settings = load_settings(monitor_max_grade_share=1.0)
    now = dist(Buy=15, Overweight=3, Hold=2)
    trailing = [dist(Hold=14, Overweight=3, Sell=3), dist(Hold=12, Overweight=4, Buy=4)]
    pooled = dist(Buy=4, Overweight=7, Hold=26, Sell=3)
    (found,) = findings(now, trailing, settings)
    assert found.kind == "distribution_jump"
    assert found.details["trailing"] == pooled
    shares = 0.5 * sum(abs(now[r] / 20 - pooled[r] / 40) for r in SCALE)
    assert found.details["tvd"] == pytest.approx(shares)
    assert found.details["p_value"] == jump_p_value(now, pooled) <= 0.01
    assert findings(now, [now, now], settings) == []  # no movement
    assert findings(now, [], settings) == []  # nothing to compare with yet
    # The same move on 6 tickers is within chance of 12 reference grades: no warning.
    assert findings(dist(Buy=3, Overweight=2, Hold=1),
                    [dist(Hold=4, Overweight=1, Buy=1)] * 2, settings) == []


def test_check_batch_pools_only_the_trailing_nightly_batches(sqlite_engine: Engine) -> None:
    settings = load_settings(monitor_trailing_batches=2)
    add_batch(sqlite_engine, one_each(dict.fromkeys(SIX, "Sell")))  # too old to count
    hold = add_batch(sqlite_engine, one_each(dict.fromkeys(SIX, "Hold")))
    mixed = add_batch(sqlite_engine, one_each(dict(zip(SIX, ["Hold"] * 3 + ["Buy"] * 3,
                                                       strict=True))))
    add_batch(sqlite_engine, one_each(dict.fromkeys(SIX, "Buy")), kind="rerun")  # not nightly
    add_batch(sqlite_engine, one_each(dict.fromkeys(SIX, "Sell")), status="failed")
    current = add_batch(sqlite_engine, one_each(dict.fromkeys(SIX, "Buy")))
    assert reference_batches(sqlite_engine, current, settings) == [mixed, hold]
    found = check_batch(sqlite_engine, current, settings)
    jump = next(f for f in found if f.kind == "distribution_jump")
    assert jump.details["trailing"] == dist(Hold=9, Buy=3)
    assert jump.details["p_value"] == pytest.approx(exact_p_value(dist(Buy=6),
                                                                  dist(Hold=9, Buy=3)), abs=0.01)
    assert warnings_for(sqlite_engine, current) == [f.message for f in found]
    check_batch(sqlite_engine, current, settings)  # again: replaced, not doubled
    with sqlite_engine.connect() as conn:
        stored = conn.execute(select(func.count()).select_from(BatchWarning)).scalar()
    assert stored == len(found)


TWENTY = [f"T{i:02d}" for i in range(20)]
NORMAL = ["Buy"] * 3 + ["Overweight"] * 4 + ["Hold"] * 8 + ["Underweight"] * 3 + ["Sell"] * 2


def test_a_flagged_night_is_not_the_next_nights_reference(sqlite_engine: Engine) -> None:
    settings = load_settings(monitor_max_grade_share=1.0)
    normal = [add_batch(sqlite_engine, one_each(dict(zip(TWENTY, NORMAL, strict=True))))
              for _ in range(3)]
    odd = add_batch(sqlite_engine, one_each(dict.fromkeys(TWENTY, "Buy")))
    (jump,) = check_batch(sqlite_engine, odd, settings)
    assert jump.kind == "distribution_jump"
    after = add_batch(sqlite_engine, one_each(dict(zip(TWENTY, NORMAL, strict=True))))
    # The all-Buy night is left out: the normal night is compared with the normal ones.
    assert reference_batches(sqlite_engine, after, settings) == normal[::-1]
    assert check_batch(sqlite_engine, after, settings) == []
    assert warnings_for(sqlite_engine, after) == []


def all_hold(chat: ChatRequest) -> Reply | None:
    if chat.structured:
        return Reply(json.dumps({"rating": "Hold", "score": 0.0, "confidence": 0.5,
                                 "summary": "Balanced."}))
    return None


@pytest.fixture
def demo_dir(tmp_path: Path) -> Path:
    write_demo(tmp_path / "data", DEMO_AS_OF, 6)
    return tmp_path / "data"


async def run_batch(engine: Engine, demo_dir: Path, kind: str = "nightly") -> int:
    tickers = demo_tickers(6)
    settings = load_settings(check_context_length=False, retry_backoff_s=0)
    server = FakeServer(all_hold, nodes=node_names(settings), tickers=tickers)
    runner = BatchEngine(settings, engine, http_client=server.client(),
                         provider=SnapshotProvider(demo_dir), sample_metrics=False)
    outcome = await runner.run(BatchPlan(kind, DEMO_AS_OF, tickers))
    assert outcome.status == "succeeded"
    return outcome.batch_id


@pytest.mark.slow
async def test_a_nightly_batch_is_checked_when_it_finishes(
        sqlite_engine: Engine, demo_dir: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    batch = await run_batch(sqlite_engine, demo_dir)
    assert warnings_for(sqlite_engine, batch) == ["Hold is 100% of 6 graded tickers (limit 70%)"]
    rerun = await run_batch(sqlite_engine, demo_dir, kind="rerun")
    assert warnings_for(sqlite_engine, rerun) == []  # one-ticker reruns are not judged
    code, out, err = nightdesk(monkeypatch, capsys, "report", str(batch))
    assert code == 0, err
    assert "warning: Hold is 100% of 6 graded tickers" in " ".join(out.split())
    code, out, err = nightdesk(monkeypatch, capsys, "report", str(batch), "--format", "json")
    assert json.loads(out)["warnings"] == ["Hold is 100% of 6 graded tickers (limit 70%)"]
    code, out, err = nightdesk(monkeypatch, capsys, "ranking", "--batch", str(batch),
                               "--format", "json")
    assert code == 0 and len(json.loads(out)["rows"]) == 6  # stdout stays JSON
    assert f"batch {batch}: Hold is 100%" in " ".join(err.split())


async def test_a_failing_monitor_never_fails_the_batch(
        sqlite_engine: Engine, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("monitor bug")

    monkeypatch.setattr(monitor, "check_batch", broken)
    batch = await run_batch(sqlite_engine, demo_dir)
    assert warnings_for(sqlite_engine, batch) == []
