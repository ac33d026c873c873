"""Check `quality track` on constructed nights with a known answer, against an outside computation.

The outside computation: scipy.stats.spearmanr per night; at h = 1 scipy's one-sample t-test,
and at h > 1 the bound on the mean's variance computed from the interleaved sub-series
themselves (every h-th night), not the pooled formula app/quality/statistics.py uses.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient
from scipy import stats
from sqlalchemy import Engine

from agents.data.base import Closes
from agents.data.freeze import write_manifest, write_ticker
from agents.data.snapshot import Manifest
from app.quality.track import (
    NOT_JUDGED,
    TRACK_MIN_TICKERS,
    NightReturns,
    horizon_record,
    min_nights,
    one_per_session,
    running_mean,
    track_nights,
)
from tests.unit.support.clirun import nightdesk
from tests.unit.support.quality_rows import add_batch, band_by_hand, spearman_by_hand
from tests.unit.support.webclient import AUTH, USER, web_client


def overlap_by_subseries(values: list[float], days: int) -> tuple[float, float]:
    """t and p of the mean, its variance bounded by the shortest interleaved sub-series'.

    The sub-series are values[k::days]; the shortest has K = T // days values, so the mean's
    variance is at most σ²/K. σ² pools every value's squared deviation over T − days.
    """
    x = np.array(values)
    if days == 1:
        result = stats.ttest_1samp(x, 0.0)
        return float(result.statistic), float(result.pvalue)
    shortest = min(len(x[k::days]) for k in range(days))
    squares = sum(float(((x[k::days] - x.mean()) ** 2).sum()) for k in range(days))
    t = float(x.mean() / math.sqrt(squares / (len(x) - days) / shortest))
    return t, float(2 * stats.t.sf(abs(t), shortest - 1))


def make_nights(scores: np.ndarray, returns: np.ndarray) -> list[NightReturns]:
    start = date(2025, 1, 1)
    return [NightReturns(i, (start + timedelta(days=i)).isoformat(),
                         [band_by_hand(float(s)) for s in night_scores],
                         [float(s) for s in night_scores], [float(r) for r in night_returns])
            for i, (night_scores, night_returns) in enumerate(zip(scores, returns,
                                                                  strict=True))]


def scores_for(rng: np.random.Generator, nights: int, tickers: int) -> np.ndarray:
    return np.clip(rng.normal(0, 0.45, size=(nights, tickers)), -1, 1)


def test_perfect_ratings() -> None:
    scores = scores_for(np.random.default_rng(1), 30, 12)
    record = horizon_record(make_nights(scores, 0.08 * scores + 0.001 * scores**3), 1)
    assert record.judged == 30 and record.mean_ic == pytest.approx(1.0)
    assert record.t_stat is None and record.p_value is None  # no spread: t is infinite
    assert record.hit_rate == 1.0 and record.positive_share == 1.0
    assert record.long_short is not None and record.long_short > 0
    assert "every night the same IC (+1.00)" in record.verdict


def test_reversed_ratings() -> None:
    scores = scores_for(np.random.default_rng(2), 30, 12)
    record = horizon_record(make_nights(scores, -0.05 * scores), 1)
    assert record.mean_ic == pytest.approx(-1.0) and record.positive_share == 0.0
    assert record.hit_rate == 0.0
    assert record.long_short is not None and record.long_short < 0
    by_rating = {b.rating: b.mean_return for b in record.by_rating}
    assert by_rating["Buy"] < 0 < by_rating["Sell"]  # type: ignore[operator]


def check_against_outside(record_nights: list[NightReturns], days: int) -> tuple[float, float]:
    """Compare the record with scipy and the sub-series bound; return its mean IC and t."""
    record = horizon_record(record_nights, days)
    outside = [float(stats.spearmanr(n.scores, n.returns).statistic) for n in record_nights]
    assert [n.ic for n in record.nights] == pytest.approx(outside, abs=1e-12)
    assert record.mean_ic == pytest.approx(float(np.mean(outside)), abs=1e-12)
    t, p = overlap_by_subseries(outside, days)
    assert record.t_stat == pytest.approx(t, rel=1e-9)
    assert record.p_value == pytest.approx(p, rel=1e-9, abs=1e-15)
    calls = [(r, x) for n in record_nights for r, x in zip(n.ratings, n.returns, strict=True)
             if r != "Hold"]
    hits = sum((r in ("Buy", "Overweight")) == (x > 0) for r, x in calls if x != 0)
    assert record.hit_rate == pytest.approx(hits / len(calls))
    assert record.mean_ic is not None and record.t_stat is not None
    return record.mean_ic, record.t_stat


def test_random_ratings_show_no_skill() -> None:
    rng = np.random.default_rng(3)
    scores = scores_for(rng, 250, 30)
    nights = make_nights(scores, rng.normal(0, 0.02, size=(250, 30)))
    mean_ic, t = check_against_outside(nights, 1)
    assert abs(t) < 3 and abs(mean_ic) < 0.03
    record = horizon_record(nights, 1)
    assert record.p_value is not None and record.p_value > 0.05
    # The verdict says at what level it holds (the rate at which it is wrong on a null desk).
    assert record.verdict.startswith("no evidence at the 5% level that the ratings predict")


def test_a_weak_true_signal_of_ic_005_over_250_nights() -> None:
    rng = np.random.default_rng(4)
    # Normal scores and returns with correlation rho have Spearman (6/π)·asin(rho/2): 0.05.
    rho = 2 * math.sin(0.05 * math.pi / 6)
    latent = rng.normal(size=(250, 100))
    returns = rho * latent + math.sqrt(1 - rho * rho) * rng.normal(size=(250, 100))
    nights = make_nights(np.tanh(latent / 2), 0.02 * returns)  # tanh keeps the order
    mean_ic, t = check_against_outside(nights, 1)
    # One night's IC over 100 tickers has sd ≈ 1/√99: the mean over 250 is ±0.0064.
    assert abs(mean_ic - 0.05) < 3 / math.sqrt(99 * 250)
    assert t > 3
    assert ("the ratings predicted returns: mean IC above 0 at the 5% level"
            in horizon_record(nights, 1).verdict)


def test_overlapping_horizons_get_a_wider_error() -> None:
    # Each night's 5-session return shares 4 sessions with the next night's, and a ticker's
    # score persists from night to night (as a model's view does): neighbouring nights' ICs
    # are then correlated, and the plain t, which assumes they are not, overstates.
    rng = np.random.default_rng(5)
    nights_n, tickers, horizon = 150, 40, 5
    scores = np.empty((nights_n + horizon, tickers))
    scores[0] = rng.normal(size=tickers)
    for i in range(1, len(scores)):
        scores[i] = 0.9 * scores[i - 1] + math.sqrt(1 - 0.81) * rng.normal(size=tickers)
    daily = 0.05 * np.roll(scores, 1, axis=0) + rng.normal(size=scores.shape)
    forward = np.array([daily[i + 1:i + 1 + horizon].sum(axis=0) for i in range(nights_n)])
    nights = make_nights(np.tanh(scores[:nights_n] / 2), 0.01 * forward)
    _, t = check_against_outside(nights, horizon)
    ics = [n.ic for n in horizon_record(nights, horizon).nights]
    plain = float(stats.ttest_1samp(ics, 0.0).statistic)
    assert abs(t) < 0.5 * abs(plain)  # about 1/√5: 30 independent nights, not 150


def test_too_few_nights_to_judge() -> None:
    scores = scores_for(np.random.default_rng(6), 19, 12)
    record = horizon_record(make_nights(scores, 0.05 * scores), 1)
    assert min_nights(1) == 20 and min_nights(5) == 25 and min_nights(20) == 100
    assert record.verdict == "too few nights to judge: 19 of the 20 needed"
    assert record.mean_ic == pytest.approx(1.0)  # the figures are still shown
    # ... but no t, no p: beside "too few nights", a p of 0.000 read as the verdict withheld.
    assert record.withheld
    assert (record.t_stat, record.p_value, record.long_short_t) == (None, None, None)
    rng = np.random.default_rng(6)
    twenty = scores_for(rng, 20, 12)
    judged = horizon_record(make_nights(twenty, twenty + rng.normal(size=twenty.shape)), 1)
    assert not judged.withheld and judged.p_value is not None and judged.t_stat is not None


def test_running_mean_and_its_band() -> None:
    rng = np.random.default_rng(7)
    scores = scores_for(rng, 40, 20)
    nights = make_nights(scores, 0.02 * scores + rng.normal(0, 0.02, size=scores.shape))
    record = horizon_record(nights, 3)
    points = running_mean(record)
    ics = [n.ic for n in record.nights]
    assert [p.ic for p in points] == ics
    for i, point in enumerate(points, start=1):
        assert point.mean == pytest.approx(float(np.mean(ics[:i])))  # type: ignore[arg-type]
    last = points[-1]
    t, _ = overlap_by_subseries(ics, 3)  # type: ignore[arg-type]
    half = stats.t.ppf(0.975, 40 // 3 - 1) * last.mean / t
    assert last.low == pytest.approx(last.mean - half) and last.high == pytest.approx(
        last.mean + half)
    assert points[0].low is None and points[18].low is None  # under 20 nights: no band
    assert points[19].low is not None


def test_the_band_starts_where_the_verdict_does() -> None:
    # Nights of 4 tickers: before 20 nights the band held a null desk's 0 on 93.7% of 4,000
    # desks at 3 and 5 nights (docs/lab/2026-12-07-verdicts-outside-2.md), and a band clear of
    # zero is the verdict the record withholds there.
    rng = np.random.default_rng(9)
    scores = scores_for(rng, 25, 4)
    record = horizon_record(make_nights(scores, rng.normal(size=scores.shape)), 1)
    points = running_mean(record)
    assert record.min_nights == 20 and len(points) == 25
    assert all(p.low is None and p.high is None for p in points[:19])
    assert all(p.low is not None and p.high is not None for p in points[19:])


# --- through the database and the command line ---------------------------------------

FIRST_NIGHT = date(2026, 11, 23)  # a Monday: nights on five consecutive sessions


def write_night(data: Path, as_of: date, closes: dict[str, tuple[float, list[float]]]) -> None:
    for ticker, (close, ahead) in closes.items():
        history = pd.bdate_range(end=as_of, periods=5)
        future = pd.bdate_range(start=as_of + timedelta(days=1), periods=len(ahead))
        values = [close] * len(history) + ahead
        index = pd.DatetimeIndex(list(history.append(future)), name="date")
        frame = pd.DataFrame({c: values for c in ("open", "high", "low", "close")} |
                             {"volume": [1.0] * len(values)}, index=index)
        write_ticker(data, as_of, ticker, frame, {}, [], [])
    write_manifest(data, as_of, Manifest("test", "x", False, list(closes)))


NIGHT_SCORES = [
    {"AAA": 0.8, "BBB": 0.3, "CCC": 0.0, "DDD": -0.4, "EEE": -0.9},
    {"AAA": -0.2, "BBB": 0.6, "CCC": 0.1, "DDD": 0.4, "EEE": -0.6},
    {"AAA": 0.1, "BBB": -0.7, "CCC": 0.9, "DDD": 0.2, "EEE": -0.3},
]
# Closes one and two sessions after each night (the close on the night is 100).
NIGHT_AHEAD = [
    {"AAA": [104, 107], "BBB": [101, 99], "CCC": [100.5, 103], "DDD": [97, 98], "EEE": [95, 96]},
    {"AAA": [99, 97], "BBB": [103, 101], "CCC": [98, 100], "DDD": [102, 104], "EEE": [101, 95]},
    # The last night has one session of prices after it: pending at 2 sessions.
    {"AAA": [102], "BBB": [96], "CCC": [99], "DDD": [101], "EEE": [100]},
]


@pytest.fixture
def three_nights(sqlite_engine: Engine, tmp_path: Path) -> list[int]:
    ids = []
    for i, (scores, ahead) in enumerate(zip(NIGHT_SCORES, NIGHT_AHEAD, strict=True)):
        as_of = FIRST_NIGHT + timedelta(days=i)
        write_night(tmp_path / "data", as_of,
                    {t: (100.0, [float(x) for x in ahead[t]]) for t in scores})
        if i == 1:  # an older batch of the same night: the newest one is the night
            add_batch(sqlite_engine, {t: [("Hold", 0.0)] for t in scores}, as_of=as_of,
                      settings={"samples": 1, "data_provider": "snapshot"})
        ids.append(add_batch(sqlite_engine, {t: [(band_by_hand(s), s)] for t, s in
                                             scores.items()}, as_of=as_of,
                             settings={"samples": 1, "data_provider": "snapshot"}))
    return ids


def test_cli_track_json_by_hand(three_nights: list[int], monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "track", "--horizon", "1d,2d",
                               "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["nights"] == 3 and data["first"] == "2026-11-23"
    assert next(iter(data)) == "schema" and data["schema"] == "quality-track/2"
    one, two = data["horizons"]
    assert [n["batch_id"] for n in one["nights"]] == three_nights
    for horizon, record in ((0, one), (1, two)):
        expected = []
        for scores, ahead in zip(NIGHT_SCORES, NIGHT_AHEAD, strict=True):
            if len(ahead["AAA"]) <= horizon:
                continue
            tickers = sorted(scores)
            expected.append(spearman_by_hand([scores[t] for t in tickers],
                                             [ahead[t][horizon] / 100 - 1 for t in tickers]))
        assert [n["ic"] for n in record["nights"]] == pytest.approx(expected)
        assert record["mean_ic"] == pytest.approx(sum(expected) / len(expected))
        assert record["verdict"].startswith("too few nights to judge")
    assert list(two["pending"]) == ["2026-11-25"]
    assert "only 1 of 2 sessions" in two["pending"]["2026-11-25"]
    assert two["decay"] == pytest.approx(two["mean_ic"] / one["mean_ic"])
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "track", "--nights", "1",
                               "--horizon", "1d", "--format", "json")
    assert [n["batch_id"] for n in json.loads(out)["horizons"][0]["nights"]] == three_nights[2:]
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "track", "--since", "2026-11-24",
                               "--horizon", "1d", "--format", "json")
    assert json.loads(out)["nights"] == 2
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "track", "--horizon", "1d,2d")
    assert code == 0, err
    assert "too few nights to judge" in out and "rank IC per night" in out
    row = next(line for line in out.splitlines() if line.lstrip("│ ").startswith("1d"))
    assert row.count("withheld") == 3, row  # t, p and the long − short t
    assert "no 2d returns for the night of 2026-11-25" in " ".join(out.split())


def test_nights_scored_from_one_session_count_once(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # The default schedule runs every night; with live data a Friday's, Saturday's and
    # Sunday's as-of all score from Friday's close over the same sessions, so their ICs are
    # one observation. Counted three times, the verdict's t (nights one session apart)
    # claimed skill on 1d far above 5% of null desks (docs/lab/2026-12-06-verdicts-outside.md).
    friday = date(2026, 11, 27)
    ahead = {"AAA": [104.0], "BBB": [101.0], "CCC": [99.0], "DDD": [97.0], "EEE": [95.0]}
    scores = {"AAA": 0.8, "BBB": 0.3, "CCC": 0.0, "DDD": -0.4, "EEE": -0.9}
    ids = []
    for offset in range(4):  # Friday, Saturday, Sunday, Monday
        as_of = friday + timedelta(days=offset)
        write_night(tmp_path / "data", as_of, {t: (100.0, a) for t, a in ahead.items()})
        ids.append(add_batch(sqlite_engine, {t: [(band_by_hand(s), s)] for t, s in
                                             scores.items()}, as_of=as_of,
                             settings={"samples": 1, "data_provider": "snapshot"}))
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "track", "--horizon", "1d",
                               "--format", "json")
    assert code == 0, err
    record = json.loads(out)["horizons"][0]
    assert [n["batch_id"] for n in record["nights"]] == [ids[2], ids[3]]  # Sunday, Monday
    assert record["judged"] == 2
    for as_of in ("2026-11-27", "2026-11-28"):
        assert record["pending"][as_of] == ("its returns start from 2026-11-27, as the night "
                                            "of 2026-11-29's do: counted once, as that night")
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "track", "--horizon", "1d")
    assert "no 1d returns for the night of 2026-11-28: its returns start" in " ".join(out.split())


@pytest.mark.parametrize(("args", "message"), [
    (["--nights", "2", "--since", "2026-11-01"], "give one"),
    (["--since", "24/11/2026"], "--since takes a date"),
    (["--horizon", "5d,x"], "--horizon takes trading days"),
    (["--horizon", ","], "--horizon takes trading days"),
    (["--nights", "0"], "--nights"),
    (["--since", "2030-01-01"], "no finished nightly batch since 2030-01-01"),
])
def test_cli_track_bad_input_is_one_line_exit_2(
        three_nights: list[int], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "track", *args)
    assert code == 2 and out == "", err
    assert len(err.strip().splitlines()) == 1 and message in err, err


@pytest.fixture
def web(sqlite_engine: Engine) -> Iterator[TestClient]:
    with web_client(sqlite_engine) as client:
        yield client


def test_the_track_record_page(three_nights: list[int], web: TestClient) -> None:
    page = web.get("/track?horizon=1d,2d", auth=AUTH)
    assert page.status_code == 200
    html = page.text
    assert "<h1>Track record</h1>" in html and 'href="/track"' in html
    for days in ("1d", "2d"):
        assert f'aria-label="track-{days}"' in html  # the plot, drawn as inline SVG
        assert f'id="track-{days}-mean"' in html and f'id="track-{days}-nights"' in html
    assert "too few nights to judge: 3 of the 20 needed" in html
    track_row = html.split('data-horizon="1"')[1].split("</tr>")[0]
    assert track_row.count(">withheld<") == 2, track_row  # t and p: no verdict, no test
    assert "2026-11-25 (only 1 of 2 sessions" in html
    assert '<table id="scored">' in html and 'data-rating="Buy"' in html
    # Buy: AAA, BBB and CCC on nights 1–3; 3 at 1d, 2 at 2d (the third night pending).
    row = html.split('data-rating="Buy"')[1].split("</tr>")[0]
    assert "too few: 3 of 30 scored" in row and "too few: 2 of 30 scored" in row
    assert web.get("/track?horizon=5x", auth=AUTH).status_code == 400
    assert web.get("/track", auth=(USER, "wrong")).status_code == 401


def test_the_track_record_page_before_any_night(sqlite_engine: Engine,
                                                web: TestClient) -> None:
    page = web.get("/track", auth=AUTH)
    assert page.status_code == 200 and "No finished nightly batch yet" in page.text


def test_constant_scores_say_ic_undefined_not_too_few_nights() -> None:
    rng = np.random.default_rng(8)
    nights = make_nights(np.zeros((30, 12)), rng.normal(0, 0.02, size=(30, 12)))
    record = horizon_record(nights, 1)
    assert record.judged == 0 and record.mean_ic is None
    assert record.verdict.startswith("IC undefined on all 30 scored nights")


def test_the_scored_record_pools_every_scored_rating() -> None:
    # 40 nights of 5 tickers, one per rating; Buy rose on 30 nights of 40.
    nights = []
    for i in range(40):
        buy = 0.01 if i < 30 else -0.02
        nights.append(NightReturns(i, f"n{i}", ["Buy", "Overweight", "Hold", "Underweight",
                                                "Sell"], [0.8, 0.3, 0.0, -0.3, -0.8],
                                   [buy, 0.002, 0.0, -0.001, 0.003]))
    nights += [NightReturns(40, "n40", ["Buy"] * 3, [0.7, 0.8, 0.9], [0.01, 0.02, 0.03])]
    record = horizon_record(nights, 1)
    by = {r.rating: r for r in record.by_rating}
    assert by["Buy"].scored == 43 and by["Buy"].hit_rate == pytest.approx(33 / 43)
    assert by["Buy"].mean_return == pytest.approx((30 * 0.01 - 10 * 0.02 + 0.06) / 43)
    assert by["Sell"].hit_rate == 0.0 and by["Sell"].mean_return == pytest.approx(0.003)
    assert by["Hold"].hit_rate is None and by["Hold"].mean_return == 0.0  # no direction
    short = horizon_record(nights[:29], 1)
    buy = next(r for r in short.by_rating if r.rating == "Buy")
    assert (buy.scored, buy.needed, buy.hit_rate, buy.mean_return) == (29, 30, None, None)


class CountingProvider:
    """A snapshot provider that counts its reads of closes (and would count full loads)."""

    name = "snapshot"

    def __init__(self, data: Path) -> None:
        from agents.data.snapshot import SnapshotProvider

        self.inner = SnapshotProvider(data)
        self.loads: list[tuple[str, date]] = []
        self.reads: list[tuple[str, date]] = []

    def load(self, ticker: str, as_of: date) -> object:
        self.loads.append((ticker, as_of))
        return self.inner.load(ticker, as_of)

    def forward_prices(self, ticker: str, as_of: date, days: int) -> pd.DataFrame:
        return self.inner.forward_prices(ticker, as_of, days)

    def closes(self, ticker: str, as_of: date, days: int) -> Closes:
        self.reads.append((ticker, as_of))
        return self.inner.closes(ticker, as_of, days)


def test_track_reads_each_tickers_prices_once_per_night(
        three_nights: list[int], sqlite_engine: Engine, tmp_path: Path) -> None:
    from app.quality.track import track_report

    provider = CountingProvider(tmp_path / "data")
    report = track_report(sqlite_engine, three_nights, [1, 2], lambda _: provider)  # type: ignore[arg-type,return-value]
    assert len(report.horizons) == 2
    assert len(provider.reads) == len(set(provider.reads)) == 3 * 5
    assert provider.loads == []  # no bundle, no indicators: only the closes


def test_track_lists_a_ticker_left_out_and_warns_nothing_on_stderr(
        three_nights: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], sqlite_engine: Engine) -> None:
    as_of = FIRST_NIGHT + timedelta(days=5)
    closes = {t: (100.0, [101.0, 102.0]) for t in ("AAA", "BBB", "CCC", "DDD")}
    closes["EEE"] = (math.inf, [101.0, 102.0])  # an infinite close: its return is undefined
    write_night(tmp_path / "data", as_of, closes)
    add_batch(sqlite_engine, {t: [(band_by_hand(s), s)] for t, s in NIGHT_SCORES[0].items()},
              as_of=as_of, settings={"samples": 1, "data_provider": "snapshot"})
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "track", "--horizon", "1d")
    assert code == 0, err
    assert "RuntimeWarning" not in err and err.strip() == "", err
    assert ("left out of the night of 2026-11-28 at 1d: EEE: return undefined"
            in " ".join(out.split()))
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "track", "--horizon", "1d",
                               "--format", "json")
    left = json.loads(out)["horizons"][0]["left_out"]
    assert list(left) == ["2026-11-28"] and list(left["2026-11-28"]) == ["EEE"]


def test_track_with_an_unknown_benchmark_is_one_line_exit_2(
        three_nights: list[int], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "track", "--horizon", "1d",
                               "--benchmark", "NOPE")
    assert code == 2 and out == "", err
    assert len(err.strip().splitlines()) == 1
    assert "benchmark NOPE: no prices on any of the 3 nights" in err, err


def test_the_track_record_page_with_a_benchmark_without_prices(
        three_nights: list[int], web: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.config import get_settings

    monkeypatch.setenv("NIGHTDESK_QUALITY_BENCHMARK", "NOPE")
    get_settings.cache_clear()
    try:
        page = web.get("/track?horizon=1d", auth=AUTH)
    finally:
        get_settings.cache_clear()
    assert page.status_code == 400
    assert "benchmark NOPE: no prices on any of the 3 nights" in page.text


class LoadingProvider(CountingProvider):
    """Closes as the first track report read them: the whole prices.csv, then forward_prices.

    The file is read here as that report's full load read it, before a night's load refused
    a price no analysis can take (a zero close up to the as-of date, ``check_usable``), which
    scoring must still see as a return left out, not as missing data."""

    def closes(self, ticker: str, as_of: date, days: int) -> Closes:
        self.loads.append((ticker, as_of))
        prices = pd.read_csv(self.inner._ticker_dir(ticker, as_of) / "prices.csv",
                             index_col="date", parse_dates=True)
        past = prices[prices.index <= pd.Timestamp(as_of)]
        ahead = self.forward_prices(ticker, as_of, days)
        return Closes(past.index[-1].date(), float(past["close"].iloc[-1]),
                      [(i.date(), float(c)) for i, c in ahead["close"].items()])


def test_track_report_is_what_the_full_loads_gave(sqlite_engine: Engine,
                                                  tmp_path: Path) -> None:
    from app.quality.track import track_report

    # 45 nights of 12 random walks at full float precision, one ticker with a zero close.
    rng = np.random.default_rng(11)
    days = pd.bdate_range("2026-01-05", periods=45 + 50)
    tickers = [f"R{i:02d}" for i in range(12)]
    walks = 50 * np.exp(np.cumsum(rng.normal(0, 0.02, (len(days), len(tickers))), axis=0))
    walks[60, 3] = 0.0
    ids = []
    for night in range(45):
        at = 20 + night
        as_of = days[at].date()
        for i, ticker in enumerate(tickers):
            frame = pd.DataFrame({c: walks[at - 20:at + 25, i] for c in ("open", "high", "low",
                                                                        "close")}
                                 | {"volume": 1.0},
                                 index=pd.DatetimeIndex(days[at - 20:at + 25], name="date"))
            write_ticker(tmp_path / "data", as_of, ticker, frame, {}, [], [])
        write_manifest(tmp_path / "data", as_of, Manifest("snapshot", "x", False, tickers))
        scores = np.clip(rng.normal(0, 0.5, len(tickers)), -1, 1)
        ids.append(add_batch(sqlite_engine, {t: [(band_by_hand(float(s)), float(s))]
                                             for t, s in zip(tickers, scores, strict=True)},
                             as_of=as_of, settings={"samples": 1,
                                                    "data_provider": "snapshot"}))
    for benchmark in (None, "R00"):
        new = CountingProvider(tmp_path / "data")
        old = LoadingProvider(tmp_path / "data")
        fast = track_report(sqlite_engine, ids, [1, 5, 20], lambda _, p=new: p,  # type: ignore[misc]
                            benchmark=benchmark)
        full = track_report(sqlite_engine, ids, [1, 5, 20], lambda _, p=old: p,  # type: ignore[misc]
                            benchmark=benchmark)
        assert new.loads == [] and len(old.loads) == 45 * 12
        assert fast == full
        assert [h.judged for h in fast.horizons] == [45, 45, 45]
        assert any(night for h in fast.horizons for night in h.left_out.values())  # the 0 close


def test_the_track_record_is_of_the_newest_nights_data_demo_apart(
        three_nights: list[int], sqlite_engine: Engine, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        web: TestClient) -> None:
    # A DEMO night run before the market nights: before, the track record counted it among
    # them (4 nights, synthetic returns beside real ones) and no surface said DEMO.
    demo = {"samples": 1, "data_provider": "snapshot", "demo_data": True}
    before = FIRST_NIGHT - timedelta(days=1)
    write_night(tmp_path / "data", before, {"AAA": (100.0, [101.0]), "BBB": (100.0, [99.0])})
    first = add_batch(sqlite_engine, {"AAA": [("Buy", 0.7)], "BBB": [("Sell", -0.7)]},
                      as_of=before, settings=demo)
    assert track_nights(sqlite_engine) == three_nights
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "track", "--horizon", "1d",
                               "--format", "json")
    assert code == 0, err
    assert (json.loads(out)["nights"], json.loads(out)["demo"]) == (3, False)
    # A DEMO night is the newest: the record is of the DEMO nights, and says so.
    after = FIRST_NIGHT + timedelta(days=5)
    write_night(tmp_path / "data", after, {"AAA": (100.0, [102.0]), "BBB": (100.0, [98.0])})
    last = add_batch(sqlite_engine, {"AAA": [("Buy", 0.7)], "BBB": [("Sell", -0.7)]},
                     as_of=after, settings=demo)
    assert track_nights(sqlite_engine) == [first, last]
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "track", "--horizon", "1d")
    assert code == 0, err
    assert out.startswith("DEMO DATA — track record: 2 nights"), out
    html = web.get("/track?horizon=1d", auth=AUTH).text
    assert '<h1>Track record <span class="demo"' in html


def test_nights_of_three_tickers_are_not_judged() -> None:
    # An IC of 3 takes four values (±1, ±0.5): the t on such nights' mean called skill on
    # 5.4% of null desks at 20–25 nights (docs/quality.md, "Nights of three tickers"). The
    # nights are listed, their IC not judged, and the verdict says why, not "IC undefined".
    scores = scores_for(np.random.default_rng(9), 30, 3)
    record = horizon_record(make_nights(scores, 0.05 * scores), 1)
    assert len(record.nights) == 30 and all(n.n == 3 for n in record.nights)
    assert all(n.ic is None and n.not_judged == NOT_JUDGED for n in record.nights)
    assert record.judged == 0 and record.mean_ic is None and record.withheld
    assert record.t_stat is None and record.p_value is None
    assert record.verdict == (
        f"no night judged: 30 of the 30 scored nights had fewer than {TRACK_MIN_TICKERS} "
        "tickers with a return and are not judged (an IC of 3 takes four values; a t-test "
        "on them runs over its 5%)")
    assert "undefined" not in record.verdict
    assert running_mean(record) == []  # no band either
    assert record.hit_rate == 1.0  # the nights' directional calls still count


def test_a_mixed_desk_judges_only_its_nights_of_four_tickers_or_more() -> None:
    rng = np.random.default_rng(10)
    wide = scores_for(rng, 25, 5)
    wide_returns = 0.02 * wide + rng.normal(0, 0.02, size=wide.shape)
    narrow = scores_for(rng, 10, 3)
    nights = make_nights(wide, wide_returns)
    start = date(2025, 6, 1)
    nights += [NightReturns(100 + i, (start + timedelta(days=i)).isoformat(),
                            [band_by_hand(float(s)) for s in row], [float(s) for s in row],
                            [float(s) for s in row])  # IC +1 each: would swamp the test
               for i, row in enumerate(narrow)]
    record = horizon_record(nights, 1)
    wide_ics = [float(stats.spearmanr(s, r).statistic)
                for s, r in zip(wide, wide_returns, strict=True)]
    assert record.judged == 25 and not record.withheld
    assert record.mean_ic == pytest.approx(np.mean(wide_ics))
    t, p = overlap_by_subseries(wide_ics, 1)
    assert record.t_stat == pytest.approx(t) and record.p_value == pytest.approx(p)
    assert record.verdict.endswith(
        f"; 10 of the 35 scored nights had fewer than {TRACK_MIN_TICKERS} tickers with a "
        "return and are not judged (an IC of 3 takes four values; a t-test on them runs "
        "over its 5%)")
    points = running_mean(record)
    assert [p.as_of for p in points] == [n.as_of for n in nights[:25]]
    assert [n.not_judged for n in record.nights] == [""] * 25 + [NOT_JUDGED] * 10


def test_cli_and_page_show_a_night_of_three_tickers_not_judged(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], web: TestClient) -> None:
    for i, (scores, ahead) in enumerate(zip(NIGHT_SCORES[:2], NIGHT_AHEAD[:2], strict=True)):
        as_of = FIRST_NIGHT + timedelta(days=i)
        kept = list(scores)[:3] if i == 0 else list(scores)  # the first night: 3 tickers
        write_night(tmp_path / "data", as_of, {t: (100.0, [float(ahead[t][0])]) for t in kept})
        add_batch(sqlite_engine, {t: [(band_by_hand(scores[t]), scores[t])] for t in kept},
                  as_of=as_of, settings={"samples": 1, "data_provider": "snapshot"})
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "track", "--horizon", "1d",
                               "--format", "json")
    assert code == 0, err
    first, second = json.loads(out)["horizons"][0]["nights"]
    assert first["ic"] is None and first["n"] == 3 and first["not_judged"] == NOT_JUDGED
    assert second["ic"] is not None and second["not_judged"] == ""
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "track", "--horizon", "1d")
    assert code == 0, err
    flat = " ".join(out.split())
    assert "not judged (n 3)" in out
    assert f"IC not judged at 1d (1 of the 2 nights: 2026-11-23): {NOT_JUDGED}" in flat
    html = web.get("/track?horizon=1d", auth=AUTH).text
    assert f"IC not judged at 1d (1 of the 2 nights: 2026-11-23): {NOT_JUDGED}" in html
    assert "too few nights to judge: 1 of the 20 needed; 1 of the 2 scored nights" in html


def test_nights_without_a_session_are_each_their_own() -> None:
    # Simulated nights carry no session; two with one as-of date were taken for one session
    # and the reason for the one dropped looked up under "" (KeyError).
    nights = [NightReturns(i, "2026-01-05", ["Buy", "Hold", "Sell", "Hold"],
                           [0.5, 0.0, -0.5, 0.1], [0.01, 0.0, -0.01, 0.02]) for i in (1, 2)]
    assert one_per_session(nights) == (nights, {})
    dated = [NightReturns(i, f"2026-01-0{i}", ["Buy"], [0.5], [0.01], session="2026-01-02")
             for i in (2, 3)]
    kept, why = one_per_session(dated)
    assert kept == dated[1:] and list(why) == ["2026-01-02"]
