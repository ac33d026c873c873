"""Check `quality forward`: returns, rank IC and its t, hit rates, buckets, listed gaps."""

from __future__ import annotations

import json
import math
from datetime import date
from pathlib import Path

import pytest
from sqlalchemy import Engine

from agents.data.freeze import write_manifest, write_ticker
from agents.data.snapshot import Manifest, SnapshotProvider
from app.errors import InputError
from app.quality.forward import forward_report, parse_horizon
from tests.unit.support.clirun import nightdesk
from tests.unit.support.prices import path_to, prices
from tests.unit.support.quality_rows import AS_OF, add_batch, band_by_hand, spearman_by_hand

# ticker -> (rating, score, close 5 sessions after the as-of date; the as-of close is 100)
GRADED = {
    "AAA": ("Buy", 0.8, 105.0),
    "BBB": ("Overweight", 0.3, 98.0),
    "CCC": ("Hold", 0.0, 101.0),
    "DDD": ("Sell", -0.7, 96.0),
    "EEE": ("Underweight", -0.2, 103.0),
}
BENCHMARK_CLOSE = 101.0


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    data = tmp_path / "data"  # where the isolated settings point NIGHTDESK_DATA_DIR
    for ticker, (_, _, end) in GRADED.items():
        write_ticker(data, AS_OF, ticker, prices(AS_OF, path_to(end)), {}, [], [])
    write_ticker(data, AS_OF, "SHORT", prices(AS_OF, [101.0, 102.0, 103.0]), {}, [], [])
    write_ticker(data, AS_OF, "BMK", prices(AS_OF, path_to(BENCHMARK_CLOSE)), {}, [], [])
    write_manifest(data, AS_OF, Manifest("test", "2026-11-27T00:00:00+00:00", False,
                                         [*GRADED, "SHORT", "BMK"]))
    return data


def graded_batch(engine: Engine) -> int:
    grades = {t: [(r, s)] for t, (r, s, _) in GRADED.items()}
    grades["SHORT"] = [("Buy", 0.9)]
    grades["GONE"] = [("Hold", 0.0)]  # graded, but not in the snapshot
    return add_batch(engine, grades, failed=("FAIL",),
                     settings={"samples": 1, "data_provider": "snapshot"})


def test_returns_ic_t_and_buckets_by_hand(sqlite_engine: Engine, snapshot: Path) -> None:
    batch = graded_batch(sqlite_engine)
    report = forward_report(sqlite_engine, SnapshotProvider(snapshot), batch, 5)
    returns = {t: end / 100.0 - 1 for t, (_, _, end) in GRADED.items()}
    assert {t.ticker: t.forward_return for t in report.tickers} == pytest.approx(returns)
    assert {t.end for t in report.tickers} == {"2026-12-04"}  # 5 sessions after Fri Nov 27
    assert {t.start for t in report.tickers} == {"2026-11-27"}
    scores = [GRADED[t][1] for t in GRADED]
    ic = spearman_by_hand(scores, [returns[t] for t in GRADED])
    assert report.n == 5 and report.rank_ic == pytest.approx(ic)
    assert report.t_stat == pytest.approx(ic * math.sqrt(3 / (1 - ic * ic)))
    # Directional calls: Buy +5% right, Overweight −2% wrong, Sell −4% right,
    # Underweight +3% wrong.
    assert report.hit_rate == pytest.approx(0.5)
    buckets = {b.rating: b for b in report.buckets}
    assert buckets["Buy"].n == 1 and buckets["Buy"].hit_rate == 1.0
    assert buckets["Overweight"].mean_return == pytest.approx(-0.02)
    assert buckets["Hold"].n == 1 and buckets["Hold"].hit_rate is None
    assert buckets["Underweight"].hit_rate == 0.0
    assert report.missing == {
        "FAIL": "no decision in this batch",
        "GONE": report.missing["GONE"],  # checked below
        "SHORT": "only 3 of 5 sessions after 2026-11-27",
    }
    assert report.missing["GONE"].startswith("not in snapshot")


def test_excess_over_a_benchmark(sqlite_engine: Engine, snapshot: Path) -> None:
    batch = graded_batch(sqlite_engine)
    report = forward_report(sqlite_engine, SnapshotProvider(snapshot), batch, 5,
                            benchmark="BMK")
    bench = BENCHMARK_CLOSE / 100 - 1
    assert report.benchmark_return == pytest.approx(bench)
    excess = {t: end / 100 - 1 - bench for t, (_, _, end) in GRADED.items()}
    assert {t.ticker: t.excess_return for t in report.tickers} == pytest.approx(excess)
    # Against +1%: Overweight −3% still wrong, Underweight +2% still wrong.
    assert report.hit_rate == pytest.approx(0.5)
    assert {b.rating: b.mean_return for b in report.buckets}["Hold"] == pytest.approx(0.0)
    with pytest.raises(InputError, match="benchmark SHORT: only 3 of 5"):
        forward_report(sqlite_engine, SnapshotProvider(snapshot), batch, 5, benchmark="SHORT")


def test_too_few_tickers_leave_the_ic_undefined(sqlite_engine: Engine,
                                                snapshot: Path) -> None:
    batch = add_batch(sqlite_engine, {"AAA": [("Buy", 0.8)], "BBB": [("Overweight", 0.3)]})
    report = forward_report(sqlite_engine, SnapshotProvider(snapshot), batch, 5)
    assert report.n == 2 and report.rank_ic is None and report.t_stat is None


def test_a_small_night_gets_its_exact_p_value(sqlite_engine: Engine, snapshot: Path) -> None:
    # Returns rank DDD < BBB < CCC < EEE < AAA. Five tickers have 120 orders: one adjacent
    # swap from the returns' order (IC 0.9) or closer comes by chance in 10 of them (2 perfect,
    # 8 one swap, either sign), a perfect order in 2. Those are the two-sided p-values.
    # Student's t on 3 df gave 0.037 and 1e-24: a 5-ticker night without skill got p < 0.05
    # on 10 of 120 orders (8.3%).
    one_swap = {"DDD": -0.8, "BBB": -0.1, "CCC": 0.4, "EEE": 0.2, "AAA": 0.9}
    perfect = {"DDD": -0.8, "BBB": -0.3, "CCC": 0.0, "EEE": 0.3, "AAA": 0.9}
    for scores, ic, p in ((one_swap, 0.9, 10 / 120), (perfect, 1.0, 2 / 120)):
        batch = add_batch(sqlite_engine, {t: [(band_by_hand(s), s)] for t, s in scores.items()},
                          settings={"samples": 1, "data_provider": "snapshot"})
        report = forward_report(sqlite_engine, SnapshotProvider(snapshot), batch, 5)
        assert report.rank_ic == pytest.approx(ic)
        assert report.p_value == pytest.approx(p)


def test_an_as_of_on_a_weekend_starts_from_friday(sqlite_engine: Engine,
                                                  tmp_path: Path) -> None:
    saturday = date(2026, 11, 28)
    write_ticker(tmp_path / "d", saturday, "AAA", prices(saturday, path_to(110.0)), {}, [], [])
    write_manifest(tmp_path / "d", saturday, Manifest("test", "x", False, ["AAA"]))
    batch = add_batch(sqlite_engine, {"AAA": [("Buy", 0.8)]}, as_of=saturday)
    report = forward_report(sqlite_engine, SnapshotProvider(tmp_path / "d"), batch, 5)
    (row,) = report.tickers
    assert (row.start, row.end) == ("2026-11-27", "2026-12-04")
    assert row.forward_return == pytest.approx(0.10)


@pytest.mark.parametrize("text", ["5", "5days", "0d", "d", "-5d", "5w", "1000d"])
def test_bad_horizons(text: str) -> None:
    with pytest.raises(InputError, match="--horizon takes trading days like 5d"):
        parse_horizon(text)


def test_horizons() -> None:
    assert parse_horizon("5d") == 5 and parse_horizon("20D") == 20


def test_cli_forward_json_and_bad_horizon(
        sqlite_engine: Engine, snapshot: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    batch = graded_batch(sqlite_engine)
    monkeypatch.setenv("NIGHTDESK_QUALITY_BENCHMARK", "BMK")
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "forward", "--batch", str(batch),
                               "--horizon", "5d", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["benchmark"] == "BMK" and data["n"] == 5
    assert next(iter(data)) == "schema" and data["schema"] == "quality-forward/1"
    assert set(data["missing"]) == {"FAIL", "GONE", "SHORT"}
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "forward", "--batch", str(batch),
                               "--horizon", "5days")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "forward", "--batch", str(batch))
    assert code == 0, err
    assert "no forward return for SHORT: only 3 of 5 sessions" in out
