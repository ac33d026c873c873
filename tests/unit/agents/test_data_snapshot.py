"""Test the snapshot provider: the as-of cutoff, forward prices, indicators and file errors."""

from __future__ import annotations

import json
import re
from datetime import date
from pathlib import Path

import pandas as pd
import pytest

from agents.data.demo import write_demo
from agents.data.snapshot import SnapshotProvider, latest_as_of
from agents.errors import DataError

AS_OF = date(2026, 11, 27)
MAX_FILE_BYTES = 64 * 2**20  # agents/data/snapshot.py's: the test states it, so a change is seen
TICKER = "ALPH.DEMO"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("snap")
    write_demo(root, AS_OF, count=2)
    return root


@pytest.fixture
def copy_dir(tmp_path: Path) -> Path:
    """A private demo snapshot a test may damage."""
    write_demo(tmp_path, AS_OF, count=1)
    return tmp_path


def test_load_stops_at_as_of(data_dir: Path) -> None:
    bundle = SnapshotProvider(data_dir).load(TICKER, AS_OF)
    full = pd.read_csv(data_dir / AS_OF.isoformat() / TICKER / "prices.csv")
    assert len(full) == 300
    assert len(bundle.prices) == 240
    assert bundle.prices.index.max() == pd.Timestamp(AS_OF)
    assert list(bundle.prices.columns) == ["open", "high", "low", "close", "volume"]
    assert bundle.demo is True and bundle.source == "demo"
    assert all(n.published <= AS_OF for n in bundle.news)
    assert 5 <= len(bundle.news) <= 10 and 5 <= len(bundle.social) <= 10
    assert bundle.fundamentals["name"].startswith("DEMO ")


def test_load_on_an_earlier_date_cuts_earlier(data_dir: Path) -> None:
    # The file for 2026-11-27 read as of a week before: rows after that day stay hidden.
    provider = SnapshotProvider(data_dir)
    day = date(2026, 11, 20)
    (data_dir / day.isoformat()).symlink_to(data_dir / AS_OF.isoformat())
    bundle = provider.load(TICKER, day)
    assert bundle.prices.index.max() == pd.Timestamp(day)
    assert all(p.posted <= day for p in bundle.social)


def test_forward_prices(data_dir: Path) -> None:
    provider = SnapshotProvider(data_dir)
    forward = provider.forward_prices(TICKER, AS_OF, 20)
    assert len(forward) == 20
    assert forward.index.min() > pd.Timestamp(AS_OF)
    assert len(provider.forward_prices(TICKER, AS_OF, 500)) == 60  # the file ends


def test_indicators_present_and_aligned(data_dir: Path) -> None:
    bundle = SnapshotProvider(data_dir).load(TICKER, AS_OF)
    for name in ("close_10_sma", "close_50_sma", "close_200_sma", "rsi_14", "macd", "macds",
                 "boll", "boll_ub", "boll_lb", "atr_14", "vwma_20"):
        assert name in bundle.indicators.columns
        assert pd.notna(bundle.indicators[name].iloc[-1])
    assert bundle.indicators.index.equals(bundle.prices.index)
    assert bundle.indicators["close_10_sma"].iloc[:9].isna().all()  # warm-up rows masked
    expected = bundle.prices["close"].tail(10).mean()
    assert bundle.indicators["close_10_sma"].iloc[-1] == pytest.approx(expected)


def test_short_history_leaves_out_long_windows(copy_dir: Path) -> None:
    path = copy_dir / AS_OF.isoformat() / TICKER / "prices.csv"
    frame = pd.read_csv(path)
    frame.iloc[-120:].to_csv(path, index=False)  # 60 sessions up to as-of, 60 after
    bundle = SnapshotProvider(copy_dir).load(TICKER, AS_OF)
    assert "close_50_sma" in bundle.indicators.columns
    assert "close_200_sma" not in bundle.indicators.columns


def _ticker_file(root: Path, name: str) -> Path:
    return root / AS_OF.isoformat() / TICKER / name


def test_missing_column_names_file(copy_dir: Path) -> None:
    path = _ticker_file(copy_dir, "prices.csv")
    pd.read_csv(path).drop(columns=["close"]).to_csv(path, index=False)
    with pytest.raises(DataError) as info:
        SnapshotProvider(copy_dir).load(TICKER, AS_OF)
    assert str(info.value) == f"{TICKER}: malformed {path}: missing column close"


def test_bad_number_names_file_and_line(copy_dir: Path) -> None:
    path = _ticker_file(copy_dir, "prices.csv")
    lines = path.read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0] + ",lots"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"malformed {path}: .*line 4"):
        SnapshotProvider(copy_dir).load(TICKER, AS_OF)


@pytest.mark.parametrize("name", ["prices.csv", "fundamentals.json", "news.json", "social.json"])
def test_missing_file_named(copy_dir: Path, name: str) -> None:
    path = _ticker_file(copy_dir, name)
    path.unlink()
    with pytest.raises(DataError, match=f"{TICKER}: missing {path}"):
        SnapshotProvider(copy_dir).load(TICKER, AS_OF)


def test_malformed_json_named(copy_dir: Path) -> None:
    path = _ticker_file(copy_dir, "news.json")
    path.write_text("[{'published': oops")
    with pytest.raises(DataError, match=f"{TICKER}: malformed {path}"):
        SnapshotProvider(copy_dir).load(TICKER, AS_OF)


def test_bad_news_date_named(copy_dir: Path) -> None:
    path = _ticker_file(copy_dir, "news.json")
    path.write_text(json.dumps([{"published": "yesterday", "source": "x", "headline": "y"}]))
    with pytest.raises(DataError, match="published 'yesterday' is not an ISO date"):
        SnapshotProvider(copy_dir).load(TICKER, AS_OF)


def test_unknown_ticker_and_missing_day(copy_dir: Path) -> None:
    provider = SnapshotProvider(copy_dir)
    with pytest.raises(DataError, match="NOPE: not in snapshot"):
        provider.load("NOPE", AS_OF)
    with pytest.raises(DataError, match="no snapshot for 2020-01-02"):
        provider.load(TICKER, date(2020, 1, 2))


def test_missing_manifest_named(copy_dir: Path) -> None:
    path = copy_dir / AS_OF.isoformat() / "manifest.json"
    path.unlink()
    with pytest.raises(DataError, match=f"missing {path}"):
        SnapshotProvider(copy_dir).load(TICKER, AS_OF)


def test_no_rows_before_as_of(copy_dir: Path) -> None:
    path = _ticker_file(copy_dir, "prices.csv")
    frame = pd.read_csv(path)
    frame.iloc[-60:].to_csv(path, index=False)  # only the forward rows remain
    with pytest.raises(DataError, match="no rows on or before 2026-11-27"):
        SnapshotProvider(copy_dir).load(TICKER, AS_OF)


def test_latest_as_of(tmp_path: Path) -> None:
    assert latest_as_of(tmp_path / "none") is None
    assert latest_as_of(tmp_path) is None
    write_demo(tmp_path, date(2026, 1, 30), count=1)
    write_demo(tmp_path, AS_OF, count=1)
    (tmp_path / "2027-01-01").mkdir()  # no manifest: not a snapshot
    (tmp_path / "notes").mkdir()
    assert latest_as_of(tmp_path) == AS_OF


def _prices_ending(copy_dir: Path, last: str) -> Path:
    """Rewrite the ticker's prices to end on ``last`` (the rows before it kept); its path."""
    path = _ticker_file(copy_dir, "prices.csv")
    frame = pd.read_csv(path)
    frame["date"] = pd.bdate_range(end=last, periods=len(frame)).strftime("%Y-%m-%d")
    frame.to_csv(path, index=False)
    return path


def test_prices_that_end_long_before_the_as_of_date_are_refused(copy_dir: Path) -> None:
    # A snapshot dated past its data (a delisted symbol, a file not updated): analysts told
    # "as of 2026-11-27" would take June's close for that day's.
    path = _prices_ending(copy_dir, "2026-06-01")
    with pytest.raises(DataError) as info:
        SnapshotProvider(copy_dir).load(TICKER, AS_OF)
    assert str(info.value) == (f"{TICKER}: {path} ends on 2026-06-01, 179 days before the "
                               "as-of date 2026-11-27: no price as of it (none in 14 days)")


def test_a_holiday_closure_before_the_as_of_date_is_no_gap(copy_dir: Path) -> None:
    # A market shut nine days (the Lunar New Year) still has a price as of the date.
    _prices_ending(copy_dir, "2026-11-18")
    bundle = SnapshotProvider(copy_dir).load(TICKER, AS_OF)
    assert bundle.prices.index[-1] == pd.Timestamp("2026-11-18")


@pytest.mark.parametrize("name", ["prices.csv", "news.json"])
def test_a_file_too_large_to_be_data_is_refused_unread(copy_dir: Path, name: str) -> None:
    # Read whole at NIGHTDESK_DATA_CONCURRENCY at once, gigabytes would take the host's
    # memory. The file is sparse: its size is there, its bytes are not.
    path = _ticker_file(copy_dir, name)
    with path.open("r+b") as file:
        file.truncate(MAX_FILE_BYTES + 1)
    provider = SnapshotProvider(copy_dir)
    why = f"{TICKER}: {path} is 67,108,865 bytes, over the 64 MiB a snapshot file may hold"
    with pytest.raises(DataError) as loaded:
        provider.load(TICKER, AS_OF)
    assert str(loaded.value) == why
    if name == "prices.csv":  # scoring reads it too, the same way
        with pytest.raises(DataError, match=re.escape(why)):
            provider.closes(TICKER, AS_OF, 5)


@pytest.mark.parametrize(("value", "why"), [
    ("close=-5", "close -5 is not a finite price above 0"),  # read as a crash: "change 1d -7407.8%"
    ("open=0", "open 0 is not a finite price above 0"),  # every return divided by zero
    ("close=inf", "close inf is not a finite price above 0"),
    ("close=1e999", "close inf is not a finite price above 0"),  # past float's range
    ("volume=-100", "volume -100 is not a finite volume of 0 or more"),
])
def test_a_price_no_analysis_can_take_fails_the_ticker_by_its_date(
        copy_dir: Path, value: str, why: str) -> None:
    path = _ticker_file(copy_dir, "prices.csv")
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    column, text = value.split("=")
    at = next(i for i, line in enumerate(lines) if line.startswith("2026-11-25"))
    cells = lines[at].split(",")
    cells[header.index(column)] = text
    lines[at] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as info:
        SnapshotProvider(copy_dir).load(TICKER, AS_OF)
    assert str(info.value) == f"{TICKER}: {path}, 2026-11-25: {why}"


def _set_cells(path: Path, day: str, **cells: str) -> None:
    """Rewrite ``day``'s row of a prices.csv, its named cells set to the text given."""
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    at = next(i for i, line in enumerate(lines) if line.startswith(day))
    row = lines[at].split(",")
    for column, text in cells.items():
        row[header.index(column)] = text
    lines[at] = ",".join(row)
    path.write_text("\n".join(lines) + "\n")


# 2026-11-25 of ALPH.DEMO's demo prices: open 383.07, high 386.11, low 363.66, close 367.7.
@pytest.mark.parametrize(("cells", "why"), [
    ({"high": "363.66", "low": "386.11"}, "high 363.66 is below low 386.11"),  # swapped
    ({"close": "390"}, "close 390 is above high 386.11"),
    ({"open": "360"}, "open 360 is below low 363.66"),
    ({"close": "1.5"}, "close 1.5 is below low 363.66"),  # a price in other units
])
def test_a_bar_that_cannot_be_fails_the_ticker_by_its_date(
        copy_dir: Path, cells: dict[str, str], why: str) -> None:
    # Analyzed without a word before: a high below its low, a close above its high.
    path = _ticker_file(copy_dir, "prices.csv")
    _set_cells(path, "2026-11-25", **cells)
    with pytest.raises(DataError) as info:
        SnapshotProvider(copy_dir).load(TICKER, AS_OF)
    assert str(info.value) == (f"{TICKER}: {path}, 2026-11-25: {why}: no day's bar can be so "
                               "(its high is at least its low, its open and close between)")


@pytest.mark.parametrize("cells", [
    {"close": "386.12"},  # a cent above its high: a vendor's rounding
    {"close": "388", "open": "362"},  # within half a percent: an auction printed apart
])
def test_a_bar_a_rounding_away_from_whole_is_analyzed(
        copy_dir: Path, cells: dict[str, str]) -> None:
    _set_cells(_ticker_file(copy_dir, "prices.csv"), "2026-11-25", **cells)
    bundle = SnapshotProvider(copy_dir).load(TICKER, AS_OF)
    assert bundle.prices.loc["2026-11-25", "close"] == float(cells["close"])


def test_a_bar_after_the_as_of_date_is_not_the_analysis_s(copy_dir: Path) -> None:
    # Scoring reads the rows after the date apart (closes): a bad bar there fails nothing.
    _set_cells(_ticker_file(copy_dir, "prices.csv"), "2026-12-01", high="1")
    assert len(SnapshotProvider(copy_dir).load(TICKER, AS_OF).prices) == 240


@pytest.mark.parametrize("sessions", [1, 2, 9])
def test_a_history_shorter_than_the_shortest_indicator_is_refused(
        copy_dir: Path, sessions: int) -> None:
    # A one-session ticker was rated on one price, its prompt saying "No indicators" and
    # its ranking row nothing. Ten sessions (close_10_sma's window) give it one.
    path = _ticker_file(copy_dir, "prices.csv")
    frame = pd.read_csv(path)
    frame[frame["date"] <= AS_OF.isoformat()].tail(sessions).to_csv(path, index=False)
    with pytest.raises(DataError) as info:
        SnapshotProvider(copy_dir).load(TICKER, AS_OF)
    assert str(info.value) == (
        f"{TICKER}: {path} has {sessions} session(s) up to {AS_OF}, fewer than the 10 the "
        "shortest indicator needs: too little history to rate")
    frame[frame["date"] <= AS_OF.isoformat()].tail(10).to_csv(path, index=False)
    bundle = SnapshotProvider(copy_dir).load(TICKER, AS_OF)
    assert list(bundle.indicators.columns) == ["close_10_sma", "close_10_ema"]
