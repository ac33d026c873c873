"""Check that ``closes`` gives what ``load`` and ``forward_prices`` give, on good and bad files.

Scoring (``quality forward``, ``quality track``) reads only ``closes``; it must keep the close
on the as-of date (never a later row) and the same closes after it, or the same error.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agents.data.base import Closes
from agents.data.demo import DEMO_AS_OF, DemoProvider, demo_tickers, write_demo
from agents.data.freeze import write_manifest, write_ticker
from agents.data.snapshot import PRICES, Manifest, SnapshotProvider, _plain_closes, ticker_dir
from agents.errors import DataError

AS_OF = date(2025, 3, 14)


def by_load(provider: SnapshotProvider | DemoProvider, ticker: str, as_of: date,
            days: int) -> Closes:
    """The closes as the first track report read them: the full bundle, then the rows after."""
    past = provider.load(ticker, as_of).prices
    ahead = provider.forward_prices(ticker, as_of, days)
    return Closes(past.index[-1].date(), float(past["close"].iloc[-1]),
                  [(i.date(), float(c)) for i, c in zip(ahead.index, ahead["close"],
                                                        strict=True)])


def random_snapshot(root: Path, tickers: list[str]) -> None:
    """Closes of a random walk at full float precision (repr in the file), 30 + 25 sessions."""
    rng = np.random.default_rng(7)
    days = pd.bdate_range(end=AS_OF, periods=30).append(
        pd.bdate_range(start="2025-03-15", periods=25))
    for ticker in tickers:
        values = 100 * np.exp(np.cumsum(rng.normal(0, 0.02, len(days))))
        frame = pd.DataFrame({c: values for c in ("open", "high", "low", "close")}
                             | {"volume": 1.0}, index=pd.DatetimeIndex(days, name="date"))
        write_ticker(root, AS_OF, ticker, frame, {}, [], [])
    write_manifest(root, AS_OF, Manifest("snapshot", "x", False, tickers))


@pytest.mark.parametrize("days", [1, 5, 20, 500])
def test_snapshot_closes_equal_the_loaded_ones(tmp_path: Path, days: int) -> None:
    tickers = [f"T{i}" for i in range(8)]
    random_snapshot(tmp_path, tickers)
    write_demo(tmp_path, DEMO_AS_OF, 4)
    provider = SnapshotProvider(tmp_path)
    for ticker, as_of in [(t, AS_OF) for t in tickers] + [(t, DEMO_AS_OF)
                                                          for t in demo_tickers(4)]:
        found = provider.closes(ticker, as_of, days)
        assert found == by_load(provider, ticker, as_of, days)
        assert found.start <= as_of < (found.ahead[0][0] if found.ahead else date.max)


def test_demo_closes_equal_the_loaded_ones() -> None:
    provider = DemoProvider()
    for ticker in demo_tickers(3):
        for days in (5, 90):  # within and beyond the demo's 60 forward sessions
            assert provider.closes(ticker, DEMO_AS_OF, days) == by_load(
                provider, ticker, DEMO_AS_OF, days)


def test_a_night_between_sessions_takes_the_last_close_before_it(tmp_path: Path) -> None:
    random_snapshot(tmp_path, ["T0"])
    saturday = date(2025, 3, 15)
    (tmp_path / saturday.isoformat()).mkdir()
    for name in ("T0", "manifest.json"):
        source = tmp_path / AS_OF.isoformat() / name
        (tmp_path / saturday.isoformat() / name).symlink_to(source)
    provider = SnapshotProvider(tmp_path)
    found = provider.closes("T0", saturday, 3)
    assert found == by_load(provider, "T0", saturday, 3)
    assert found.start == AS_OF and found.ahead[0][0] == date(2025, 3, 17)


# Files that are not plainly well-formed: read by pandas, as before, with its answer or error.
# Ten sessions up to the as-of date at least, each a bar that can be: the load takes no fewer.
EARLIER = "".join(f"2025-03-{day:02d},1,1,1,1,5{{extra}}\n" for day in (3, 4, 5, 6, 7, 10, 11, 12))
ODD_FILES = {
    "unsorted rows": "date,open,high,low,close,volume\n2025-03-14,2,2,2,2,5\n"
                     + EARLIER.format(extra="") + "2025-03-13,1,1,1,1,5\n2025-03-17,3,3,3,3,5\n",
    # After the as-of date: one up to it is no price the analysis takes (check_usable).
    "an infinite close": "date,open,high,low,close,volume\n" + EARLIER.format(extra="")
                         + "2025-03-13,1,1,1,1,5\n2025-03-14,2,2,2,2,5\n2025-03-17,1,1,1,inf,5\n",
    "blanks and a timestamp": "Date, Open,High,Low,Close,Volume\n" + EARLIER.format(extra="")
                              + "2025-03-13,1,1,1,1,5\n2025-03-14 00:00:00, 2,2,2,2,5\n"
                              "2025-03-17,3,3,3,3,5\n",
    "extra column": "date,open,high,low,close,volume,adj\n" + EARLIER.format(extra=",x")
                    + "2025-03-13,1,1,1,1,5,x\n2025-03-14,2,2,2,2,5,x\n2025-03-17,3,3,3,3,5,y\n",
}
BAD_FILES = {
    "a missing value": ("date,open,high,low,close,volume\n2025-03-14,1,1,1,,5\n",
                        "missing or non-numeric value on line 2"),
    "a NaN volume": ("date,open,high,low,close,volume\n2025-03-14,1,1,1,2,nan\n",
                     "missing or non-numeric value on line 2"),
    "underscores": ("date,open,high,low,close,volume\n2025-03-14,1,1,1,1_000,5\n",
                    "missing or non-numeric value on line 2"),
    "a duplicate date": ("date,open,high,low,close,volume\n2025-03-14,1,1,1,2,5\n"
                         "2025-03-14,1,1,1,3,5\n", "duplicate date 2025-03-14"),
    "a bad date": ("date,open,high,low,close,volume\n2025-13-14,1,1,1,2,5\n", "bad date on line 2"),
    "no close column": ("date,open,high,low,volume\n2025-03-14,1,1,1,5\n", "missing column close"),
    "no rows": ("date,open,high,low,close,volume\n", "no rows"),
    "only later rows": ("date,open,high,low,close,volume\n2025-03-17,1,1,1,2,5\n",
                        "has no rows on or before 2025-03-14"),
}


def snapshot_with(root: Path, text: str) -> SnapshotProvider:
    random_snapshot(root, ["T0"])
    (ticker_dir(root, AS_OF, "T0") / PRICES).write_text(text)
    return SnapshotProvider(root)


@pytest.mark.parametrize("name", sorted(ODD_FILES))
def test_an_odd_file_gives_what_pandas_reads(tmp_path: Path, name: str) -> None:
    provider = snapshot_with(tmp_path, ODD_FILES[name])
    assert provider.closes("T0", AS_OF, 5) == by_load(provider, "T0", AS_OF, 5)


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_a_bad_file_gives_the_same_error(tmp_path: Path, name: str) -> None:
    text, why = BAD_FILES[name]
    provider = snapshot_with(tmp_path, text)
    with pytest.raises(DataError) as loaded:
        by_load(provider, "T0", AS_OF, 5)
    with pytest.raises(DataError) as read:
        provider.closes("T0", AS_OF, 5)
    assert str(read.value) == str(loaded.value)
    assert why in str(read.value)


def test_a_missing_ticker_or_night_gives_the_same_error(tmp_path: Path) -> None:
    random_snapshot(tmp_path, ["T0"])
    provider = SnapshotProvider(tmp_path)
    for ticker, as_of in (("NOPE", AS_OF), ("T0", date(2025, 3, 20))):
        with pytest.raises(DataError) as loaded:
            by_load(provider, ticker, as_of, 5)
        with pytest.raises(DataError) as read:
            provider.closes(ticker, as_of, 5)
        assert str(read.value) == str(loaded.value)


def test_files_as_written_are_read_without_pandas(tmp_path: Path) -> None:
    # The equality tests above would pass trivially if every file went through pandas.
    random_snapshot(tmp_path, ["T0"])
    write_demo(tmp_path, DEMO_AS_OF, 1)
    for as_of, ticker in ((AS_OF, "T0"), (DEMO_AS_OF, demo_tickers(1)[0])):
        assert _plain_closes(ticker_dir(tmp_path, as_of, ticker) / PRICES) is not None
    for name, text in {**ODD_FILES, **{k: v for k, (v, _) in BAD_FILES.items()}}.items():
        if name not in ("unsorted rows", "only later rows"):
            path = tmp_path / f"{name}.csv"
            path.write_text(text)
            assert _plain_closes(path) is None, name
