"""Check the rating-distribution monitor: its two tests, storage, the hook and where it shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from agents.data.snapshot import SnapshotProvider
from agents.graph import node_names
from app.batch.engine import BatchEngine, BatchPlan
from app.bench.fakeserver import ChatRequest, FakeServer, Reply
from app.config import load_settings
from app.db.models import BatchWarning
from app.quality import monitor
from app.quality.monitor import check_batch, findings, warnings_for
from tests.unit.quality_rows import add_batch, one_each
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


def test_jump_is_the_total_variation_from_the_pooled_trailing_batches() -> None:
    settings = load_settings()
    now = dist(Buy=3, Overweight=2, Hold=1)
    trailing = [dist(Hold=4, Sell=2), dist(Hold=3, Overweight=2, Sell=1)]
    # pooled: Overweight 2, Hold 7, Sell 3 of 12; now: Buy 3, Overweight 2, Hold 1 of 6.
    tvd = 0.5 * (abs(3 / 6 - 0) + abs(2 / 6 - 2 / 12) + abs(1 / 6 - 7 / 12) + abs(0 - 3 / 12))
    (found,) = findings(now, trailing, settings)
    assert found.kind == "distribution_jump"
    assert found.details["tvd"] == pytest.approx(tvd)
    assert found.details["trailing"] == dist(Overweight=2, Hold=7, Sell=3)
    assert findings(now, [now, now], settings) == []  # no movement
    assert findings(now, [], settings) == []  # nothing to compare with yet
    assert findings(now, trailing, load_settings(monitor_max_tvd=0.9)) == []


def test_check_batch_pools_only_the_trailing_nightly_batches(sqlite_engine: Engine) -> None:
    settings = load_settings(monitor_trailing_batches=2)
    add_batch(sqlite_engine, one_each(dict.fromkeys(SIX, "Sell")))  # too old to count
    add_batch(sqlite_engine, one_each(dict.fromkeys(SIX, "Hold")))
    add_batch(sqlite_engine, one_each(dict(zip(SIX, ["Hold"] * 3 + ["Buy"] * 3, strict=True))))
    add_batch(sqlite_engine, one_each(dict.fromkeys(SIX, "Buy")), kind="rerun")  # not nightly
    add_batch(sqlite_engine, one_each(dict.fromkeys(SIX, "Sell")), status="failed")
    current = add_batch(sqlite_engine, one_each(dict(zip(SIX, ["Buy"] * 4 + ["Overweight"] * 2,
                                                          strict=True))))
    found = check_batch(sqlite_engine, current, settings)
    jump = next(f for f in found if f.kind == "distribution_jump")
    assert jump.details["trailing"] == dist(Hold=9, Buy=3)
    # shares now (4/6 Buy, 2/6 Overweight) vs (3/12 Buy, 9/12 Hold):
    assert jump.details["tvd"] == pytest.approx(0.5 * (abs(4 / 6 - 3 / 12) + 2 / 6 + 9 / 12))
    assert warnings_for(sqlite_engine, current) == [f.message for f in found]
    check_batch(sqlite_engine, current, settings)  # again: replaced, not doubled
    with sqlite_engine.connect() as conn:
        stored = conn.execute(select(func.count()).select_from(BatchWarning)).scalar()
    assert stored == len(found)


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
    assert code == 0 and len(json.loads(out)) == 6  # stdout stays JSON
    assert f"batch {batch}: Hold is 100%" in " ".join(err.split())


async def test_a_failing_monitor_never_fails_the_batch(
        sqlite_engine: Engine, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("monitor bug")

    monkeypatch.setattr(monitor, "check_batch", broken)
    batch = await run_batch(sqlite_engine, demo_dir)
    assert warnings_for(sqlite_engine, batch) == []
