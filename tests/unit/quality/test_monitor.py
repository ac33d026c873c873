"""Check the rating-distribution monitor: its three tests, the new normal, storage, the hook and
where it shows."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom, chi2_contingency, multivariate_hypergeom
from sqlalchemy import Engine, func, select

from agents.data.demo import DEMO_AS_OF, demo_tickers
from agents.graph import node_names
from app.batch.engine import BatchPlan
from app.config import load_settings
from app.db.models import BatchWarning
from app.quality import monitor
from app.quality.monitor import (
    JUMP_DRAWS,
    check_batch,
    findings,
    reference_batches,
    split_p_values,
    warnings_for,
)
from tests.fakevllm import ChatRequest, FakeServer, Reply
from tests.unit.support.clirun import nightdesk
from tests.unit.support.engines import make_engine
from tests.unit.support.quality_rows import SCALE, add_batch, one_each

SIX = ["AAA", "BBB", "CCC", "DDD", "EEE", "FFF"]

pytestmark = pytest.mark.demo_tickers(6)  # run_batch's night of six


def dist(**counts: int) -> dict[str, int]:
    return {r: counts.get(r, 0) for r in ("Buy", "Overweight", "Hold", "Underweight", "Sell")}


def test_grade_share_is_a_binomial_test_against_the_limit() -> None:
    settings = load_settings()  # limit 70%, rate 1%: each of the three tests at 1/3%
    # Hold 20 of 20: P(X ≥ 20) for a desk at 70% is 0.0008 (scipy's binomial tail), ≤ 1/3%.
    (found,) = findings(dist(Hold=20), [], settings)
    assert found.kind == "grade_share" and found.details["rating"] == "Hold"
    assert found.details["share"] == pytest.approx(1.0)
    assert found.details["p_value"] == pytest.approx(binom.sf(19, 20, 0.7))
    assert found.details["level"] == pytest.approx(0.01 / 3)
    assert "Hold is 100% of 20 graded tickers: p 0.0008" in found.message
    # 19 of 20 (95%) has p 0.0076: below the whole rate, not below the share test's third.
    assert findings(dist(Hold=19, Buy=1), [], settings) == []
    # 18 of 20 (90%) is above the limit but within chance of a desk at 70%: p 0.035.
    assert findings(dist(Hold=18, Buy=2), [], settings) == []
    # 5 of 6 (83%) was flagged by the old fixed limit; a 70% desk shows it 42% of the time.
    assert findings(dist(Hold=5, Buy=1), [], settings) == []
    # Fewer graded tickers than monitor_min_tickers (5): too few to judge.
    assert findings(dist(Hold=4), [], settings) == []
    # At a limit of 50% two grades can sit at the limit at once: each is tested at 1/6%.
    strict = load_settings(monitor_max_grade_share=0.5)
    (buy,) = findings(dist(Buy=17, Sell=3), [], strict)
    assert binom.sf(16, 20, 0.5) <= 0.01 / 6 and buy.details["rating"] == "Buy"
    assert buy.details["level"] == pytest.approx(0.01 / 6)
    # 16 of 20 has p 0.0059: below 1%, not below the 1/6% each grade gets.
    assert findings(dist(Buy=16, Sell=4), [], strict) == []


def chi2(table: np.ndarray) -> float:
    return float(chi2_contingency(table, correction=False).statistic)


def herfindahl(table: np.ndarray) -> float:
    share = table[0] / table[0].sum()
    return float((share * share).sum())


def exact_p_value(current: dict[str, int], reference: dict[str, int],
                  statistic_of: Callable[[np.ndarray], float] = chi2) -> float:
    """A split test's p-value by enumerating every split (scipy's pmf; chi-square by default)."""
    night = [current[r] for r in SCALE]
    pooled = [reference[r] for r in SCALE]
    total = [a + b for a, b in zip(night, pooled, strict=True)]
    used = [i for i, t in enumerate(total) if t]

    def statistic(row: list[int]) -> float:
        return statistic_of(np.array([[row[i] for i in used],
                                      [total[i] - row[i] for i in used]]))

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
    estimate = split_p_values(current, reference)[0]
    # Monte Carlo over JUMP_DRAWS splits: within four of its standard errors (and the +1).
    error = math.sqrt(exact * (1 - exact) / JUMP_DRAWS) + 1 / JUMP_DRAWS
    assert abs(estimate - exact) <= 4 * error, (estimate, exact)


@pytest.mark.parametrize(("current", "reference"), [
    (dist(Hold=5, Buy=1), dist(Hold=6, Buy=2, Overweight=2, Sell=2)),
    (dist(Hold=3, Buy=1, Sell=2), dist(Hold=7, Buy=3, Sell=2)),
])
def test_concentration_p_value_matches_the_exact_test(current: dict[str, int],
                                                      reference: dict[str, int]) -> None:
    exact = exact_p_value(current, reference, herfindahl)
    estimate = split_p_values(current, reference)[1]
    error = math.sqrt(exact * (1 - exact) / JUMP_DRAWS) + 1 / JUMP_DRAWS
    assert abs(estimate - exact) <= 4 * error, (estimate, exact)


def test_concentration_sees_the_hold_pile_up_the_jump_test_misses() -> None:
    settings = load_settings(monitor_max_grade_share=1.0)
    # Tonight 38 of 40 Hold against 60% Hold over the reference nights.
    tonight = dist(Buy=1, Hold=38, Sell=1)
    trailing = [dist(Buy=2, Overweight=6, Hold=24, Underweight=6, Sell=2)] * 5
    kinds = {f.kind for f in findings(tonight, trailing, settings)}
    assert "concentration" in kinds
    piled = next(f for f in findings(tonight, trailing, settings)
                 if f.kind == "concentration")
    assert "Hold is 95% of 40 against 60%" in piled.message
    # A move that spreads the grades out is no pile-up.
    spread = dist(Buy=8, Overweight=8, Hold=8, Underweight=8, Sell=8)
    assert "concentration" not in {f.kind for f in findings(spread, trailing, settings)}


def test_jump_flags_at_the_false_alarm_rate_and_reports_the_tvd() -> None:
    settings = load_settings(monitor_max_grade_share=1.0)
    now = dist(Buy=15, Overweight=3, Hold=2)
    trailing = [dist(Hold=14, Overweight=3, Sell=3), dist(Hold=12, Overweight=4, Buy=4)]
    pooled = dist(Buy=4, Overweight=7, Hold=26, Sell=3)
    found = next(f for f in findings(now, trailing, settings)
                 if f.kind == "distribution_jump")
    assert found.details["trailing"] == pooled
    shares = 0.5 * sum(abs(now[r] / 20 - pooled[r] / 40) for r in SCALE)
    assert found.details["tvd"] == pytest.approx(shares)
    # At most a third of the rate.
    assert found.details["p_value"] == split_p_values(now, pooled)[0] <= 0.01 / 3
    assert findings(now, [now, now], settings) == []  # no movement
    assert findings(now, [], settings) == []  # nothing to compare with yet
    # The same move on 6 tickers is within chance of 12 reference grades: no warning.
    assert findings(dist(Buy=3, Overweight=2, Hold=1),
                    [dist(Hold=4, Overweight=1, Buy=1)] * 2, settings) == []


def test_a_low_false_alarm_rate_still_lets_a_clear_move_through() -> None:
    # At a rate of 0.1% each test runs at 0.033%, below 1/2001 (the smallest p-value of 2,000
    # random splits): with that many draws no jump or pile-up could ever be flagged, however
    # plain. The draws grow with the rate's inverse so the p-value can reach the level.
    settings = load_settings(monitor_false_alarm_rate=0.001)
    trailing = [dist(Buy=4, Overweight=8, Hold=16, Underweight=8, Sell=4)] * 5
    found = {f.kind: f for f in findings(dist(Buy=40), trailing, settings)}
    assert {"distribution_jump", "concentration"} <= set(found), found
    for kind in ("distribution_jump", "concentration"):
        assert found[kind].details["p_value"] <= found[kind].details["level"]
        assert "p 0.0000" not in found[kind].message  # its resolution, not a zero
    # An unchanged night is still left alone.
    assert findings(trailing[0], trailing, settings) == []


def test_check_batch_pools_only_the_trailing_nightly_batches(sqlite_engine: Engine) -> None:
    # The exact p is 0.009: flagged at a rate of 3% (each of the three tests at 1%).
    settings = load_settings(monitor_trailing_batches=2, monitor_false_alarm_rate=0.03)
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


def test_a_night_is_judged_against_the_nights_on_the_same_data(sqlite_engine: Engine) -> None:
    # Demo runs, then the first market night: before, the demo nights were its reference
    # and a move between synthetic data and market data read as the pipeline's.
    settings = load_settings(monitor_trailing_batches=2)
    demo = {"samples": 1, "demo_data": True}
    market = add_batch(sqlite_engine, one_each(dict.fromkeys(SIX, "Hold")))
    runs = [add_batch(sqlite_engine, one_each(dict.fromkeys(SIX, "Buy")), settings=demo)
            for _ in range(2)]
    current = add_batch(sqlite_engine, one_each(dict.fromkeys(SIX, "Hold")))
    assert reference_batches(sqlite_engine, current, settings) == [market]
    later = add_batch(sqlite_engine, one_each(dict.fromkeys(SIX, "Buy")), settings=demo)
    assert reference_batches(sqlite_engine, later, settings) == runs[::-1]


TWENTY = [f"T{i:02d}" for i in range(20)]
NORMAL = ["Buy"] * 3 + ["Overweight"] * 4 + ["Hold"] * 8 + ["Underweight"] * 3 + ["Sell"] * 2


def test_a_flagged_night_is_not_the_next_nights_reference(sqlite_engine: Engine) -> None:
    settings = load_settings(monitor_max_grade_share=1.0)
    normal = [add_batch(sqlite_engine, one_each(dict(zip(TWENTY, NORMAL, strict=True))))
              for _ in range(3)]
    odd = add_batch(sqlite_engine, one_each(dict.fromkeys(TWENTY, "Buy")))
    kinds = {f.kind for f in check_batch(sqlite_engine, odd, settings)}
    assert kinds == {"distribution_jump", "concentration"}
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


async def run_batch(engine: Engine, demo_dir: Path, kind: str = "nightly") -> int:
    tickers = demo_tickers(6)
    # At a limit of 30%, 6 of 6 Hold has p 0.3⁶ = 0.0007: below the rate over ⌊1/0.3⌋ grades.
    settings = load_settings(check_context_length=False, retry_backoff_s=0,
                             monitor_max_grade_share=0.3)
    server = FakeServer(all_hold, nodes=node_names(settings.pipeline()), tickers=tickers)
    runner = make_engine(engine, demo_dir, server, settings)
    outcome = await runner.run(BatchPlan(kind, DEMO_AS_OF, tickers))
    assert outcome.status == "succeeded"
    return outcome.batch_id


@pytest.mark.slow
async def test_a_nightly_batch_is_checked_when_it_finishes(
        sqlite_engine: Engine, demo_dir: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    batch = await run_batch(sqlite_engine, demo_dir)
    expected = ("Hold is 100% of 6 graded tickers: p 0.0007 that a desk giving it to at most "
                "30% does so by chance")
    assert warnings_for(sqlite_engine, batch) == [expected]
    rerun = await run_batch(sqlite_engine, demo_dir, kind="rerun")
    assert warnings_for(sqlite_engine, rerun) == []  # one-ticker reruns are not judged
    code, out, err = nightdesk(monkeypatch, capsys, "report", str(batch))
    assert code == 0, err
    assert "warning: Hold is 100% of 6 graded tickers" in " ".join(out.split())
    code, out, err = nightdesk(monkeypatch, capsys, "report", str(batch), "--format", "json")
    assert json.loads(out)["warnings"] == [expected]
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


SHIFTED = ["Buy"] * 15 + ["Overweight"] * 2 + ["Hold"] + ["Underweight"] + ["Sell"]


def test_a_lasting_change_becomes_the_new_normal(sqlite_engine: Engine) -> None:
    settings = load_settings(monitor_max_grade_share=1.0, monitor_new_normal_after=3)
    for _ in range(3):
        add_batch(sqlite_engine, one_each(dict(zip(TWENTY, NORMAL, strict=True))))
    moved = [add_batch(sqlite_engine, one_each(dict(zip(TWENTY, SHIFTED, strict=True))))
             for _ in range(3)]
    kinds = [{f.kind for f in check_batch(sqlite_engine, b, settings)} for b in moved]
    assert all("distribution_jump" in k for k in kinds)
    # Said once, on the third moved night, naming the first.
    assert ["new_normal" in k for k in kinds] == [False, False, True]
    said = [m for m in warnings_for(sqlite_engine, moved[2]) if "new normal" in m]
    assert said == [f"a new normal since batch {moved[0]}: 3 nights in a row moved from the "
                    "earlier ones; later nights are judged against the nights since then"]
    # The next night of the new mix is judged against the new normal, not flagged for ever.
    later = add_batch(sqlite_engine, one_each(dict(zip(TWENTY, SHIFTED, strict=True))))
    assert reference_batches(sqlite_engine, later, settings) == moved[::-1]
    assert check_batch(sqlite_engine, later, settings) == []
    # Judging the declaring night again declares it again, once (replaced, not doubled).
    check_batch(sqlite_engine, moved[2], settings)
    assert sum("new normal" in m for m in warnings_for(sqlite_engine, moved[2])) == 1
    # An old-mix night is now the odd one, and is flagged against the new normal.
    back = add_batch(sqlite_engine, one_each(dict(zip(TWENTY, NORMAL, strict=True))))
    assert "distribution_jump" in {f.kind for f in check_batch(sqlite_engine, back, settings)}


def test_moved_nights_apart_do_not_make_a_new_normal(sqlite_engine: Engine) -> None:
    settings = load_settings(monitor_max_grade_share=1.0, monitor_new_normal_after=2)
    normal = dict(zip(TWENTY, NORMAL, strict=True))
    for _ in range(3):
        add_batch(sqlite_engine, one_each(normal))
    for mix in (SHIFTED, NORMAL, SHIFTED):
        batch = add_batch(sqlite_engine, one_each(dict(zip(TWENTY, mix, strict=True))))
        assert "new_normal" not in {f.kind for f in check_batch(sqlite_engine, batch, settings)}


def test_the_operator_acknowledges_a_new_normal(sqlite_engine: Engine,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    settings = load_settings(monitor_max_grade_share=1.0)
    for _ in range(3):
        add_batch(sqlite_engine, one_each(dict(zip(TWENTY, NORMAL, strict=True))))
    first = add_batch(sqlite_engine, one_each(dict(zip(TWENTY, SHIFTED, strict=True))))
    assert "distribution_jump" in {f.kind for f in check_batch(sqlite_engine, first, settings)}
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "acknowledge", "--batch",
                               str(first))
    assert code == 0, err
    assert f"a new normal since batch {first}, acknowledged by the operator" in out
    check_batch(sqlite_engine, first, settings)  # judging it again keeps the acknowledgement
    assert any("acknowledged" in m for m in warnings_for(sqlite_engine, first))
    later = add_batch(sqlite_engine, one_each(dict(zip(TWENTY, SHIFTED, strict=True))))
    assert reference_batches(sqlite_engine, later, settings) == [first]
    assert check_batch(sqlite_engine, later, settings) == []
    rerun = add_batch(sqlite_engine, one_each(dict(zip(TWENTY, NORMAL, strict=True))),
                      kind="rerun")
    for bad, message in ((str(rerun), "not a finished nightly batch"),
                         ("99999", "not a finished nightly batch"), ("x", "batch")):
        code, out, err = nightdesk(monkeypatch, capsys, "quality", "acknowledge", "--batch",
                                   bad)
        assert code == 2 and out == "", err
        assert len(err.strip().splitlines()) == 1 and message in err, err
