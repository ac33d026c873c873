"""Read market data from a snapshot directory: the default provider, and what every night replays.

Layout, for one as-of date::

    <data_dir>/<YYYY-MM-DD>/manifest.json      {provider, created_at, demo, tickers}
    <data_dir>/<YYYY-MM-DD>/universe.txt       optional: one ticker per line
    <data_dir>/<YYYY-MM-DD>/<TICKER>/prices.csv        date,open,high,low,close,volume
    <data_dir>/<YYYY-MM-DD>/<TICKER>/fundamentals.json {name: value}
    <data_dir>/<YYYY-MM-DD>/<TICKER>/news.json         [{published, source, headline}]
    <data_dir>/<YYYY-MM-DD>/<TICKER>/social.json       [{posted, author, text, likes}]

prices.csv may run past the as-of date: ``load`` returns rows up to and including it,
``forward_prices`` the rows after it (for scoring ratings against realized returns). A
ticker's data is refused, named, where no analysis can take it (``base.check_usable``): a
price up to the as-of date not above 0 or not finite, a negative volume, a bar whose high
is below its low or whose open or close lies outside them, a last row more than
``STALE_DAYS`` before the as-of date, fewer than ``MIN_SESSIONS`` rows up to it; and a file
over ``MAX_FILE_BYTES``. Prices are taken as given: a split not adjusted for (yfinance's
are) would read as a crash, so the prompt notes a move the size of one (``split_like``).

The snapshot holds the tickers its manifest lists: a folder it does not list (left by an
earlier freeze of the same date, whose manifest a later freeze replaced) is not read.
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_right
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from agents.data.base import (
    PRICE_COLUMNS,
    Closes,
    MarketBundle,
    NewsItem,
    SocialPost,
    check_usable,
)
from agents.data.indicators import compute_indicators
from agents.errors import DataError

# The most a snapshot file may hold: read whole, at NIGHTDESK_DATA_CONCURRENCY at once, a
# file of gigabytes would take the host's memory; a century of daily prices is under 2 MiB.
MAX_FILE_BYTES = 64 * 2**20
MANIFEST = "manifest.json"
UNIVERSE = "universe.txt"
PRICES = "prices.csv"
FUNDAMENTALS = "fundamentals.json"
NEWS = "news.json"
SOCIAL = "social.json"
# A prices.csv as write_ticker writes it: the header, then ISO dates and plain decimal numbers
# (never NaN, inf or blanks), which Python's float() and pandas read alike.
_NUMBER = r"-?[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?"
_ROW = rf"[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}(?:,{_NUMBER}){{5}}"
PLAIN_PRICES = re.compile(rf"date,open,high,low,close,volume\r?\n(?:{_ROW}(?:\r?\n|\Z))+")
PLAIN_DATE_CLOSE = re.compile(r"^([0-9-]{10}),[^,]*,[^,]*,[^,]*,([^,]*),", re.MULTILINE)


@dataclass(frozen=True)
class Manifest:
    """What a snapshot says about itself."""

    provider: str
    """Where the data came from: "demo", "yfinance", …; shown as the bundle's source."""
    created_at: str
    """ISO timestamp of the write (a demo snapshot uses its as-of date, to stay byte-stable)."""
    demo: bool
    """True for synthetic data, which must be labelled DEMO wherever it is shown."""
    tickers: list[str]
    """The tickers written, in order."""


def day_dir(data_dir: Path, as_of: date) -> Path:
    """Return the directory holding one as-of date's snapshot."""
    return Path(data_dir) / as_of.isoformat()


def ticker_dir(data_dir: Path, as_of: date, ticker: str) -> Path:
    """Return the directory holding one ticker's files for one as-of date."""
    return day_dir(data_dir, as_of) / ticker


def latest_as_of(data_dir: Path | str) -> date | None:
    """Return the newest as-of date with a manifest under ``data_dir``, or None if there is none."""
    root = Path(data_dir)
    if not root.is_dir():
        return None
    days = []
    for child in root.iterdir():
        try:
            day = date.fromisoformat(child.name)
        except ValueError:
            continue  # not a snapshot folder (a universe file, a backup, …)
        if (child / MANIFEST).is_file():
            days.append(day)
    return max(days, default=None)


def read_manifest(data_dir: Path, as_of: date) -> Manifest:
    """Read and check ``<data_dir>/<as_of>/manifest.json``; raise DataError naming the file."""
    folder = day_dir(data_dir, as_of)
    if not folder.is_dir():
        raise DataError(
            f"no snapshot for {as_of} in {data_dir} (missing {folder}; "
            "write one with `nightdesk data demo` (DEMO data), or market data "
            "(`nightdesk data freeze --help` says how))"
        )
    path = folder / MANIFEST
    raw = _read_json(path, "snapshot")
    if not isinstance(raw, dict):
        raise DataError(f"snapshot: malformed {path}: expected a JSON object")
    try:
        tickers = raw["tickers"]
        if not isinstance(tickers, list) or not all(isinstance(t, str) for t in tickers):
            raise DataError(f"snapshot: malformed {path}: tickers must be a list of strings")
        return Manifest(
            provider=str(raw["provider"]),
            created_at=str(raw["created_at"]),
            demo=bool(raw["demo"]),
            tickers=list(tickers),
        )
    except KeyError as missing:
        raise DataError(f"snapshot: malformed {path}: missing key {missing.args[0]}") from None


def read_prices(path: Path, ticker: str) -> pd.DataFrame:
    """Read a prices.csv into a frame indexed by date (ascending) with the OHLCV columns."""
    _check_size(path, ticker)
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise DataError(f"{ticker}: malformed {path}: {_first_line(error)}") from None
    frame.columns = [str(c).strip().lower() for c in frame.columns]
    for column in ["date", *PRICE_COLUMNS]:
        if column not in frame.columns:
            raise DataError(f"{ticker}: malformed {path}: missing column {column}")
    if frame.empty:
        raise DataError(f"{ticker}: malformed {path}: no rows")
    dates = pd.to_datetime(frame["date"], format="ISO8601", errors="coerce")
    if dates.isna().any():
        row = int(dates.isna().to_numpy().argmax()) + 2  # +1 header, +1 one-based
        raise DataError(f"{ticker}: malformed {path}: bad date on line {row}")
    values = frame[PRICE_COLUMNS].apply(pd.to_numeric, errors="coerce")
    bad = values.isna().any(axis=1)
    if bad.any():
        row = int(bad.to_numpy().argmax()) + 2
        raise DataError(f"{ticker}: malformed {path}: missing or non-numeric value on line {row}")
    values = values.astype("float64")  # one dtype whatever the provider, so bundles compare
    values.index = pd.DatetimeIndex(dates.dt.normalize(), name="date")
    if values.index.has_duplicates:
        dup = values.index[values.index.duplicated()][0]
        raise DataError(f"{ticker}: malformed {path}: duplicate date {dup.date()}")
    return values.sort_index()


def read_closes(path: Path, ticker: str) -> list[tuple[date, float]]:
    """Return ``read_prices``' (date, close) rows, ascending: the same rows or the same DataError.

    Scoring reads one file per ticker and night (25,000 for 250 nights of 100 tickers), and
    pandas' cost per call, not the rows, is then the time. A file in ``write_ticker``'s form
    (its header, ISO dates, plain decimal numbers in every column, no duplicate date) is parsed
    here with two regular expressions; anything else goes through ``read_prices``.
    """
    rows = _plain_closes(path)
    if rows is None:
        frame = read_prices(path, ticker)
        return [(i.date(), float(c)) for i, c in zip(frame.index, frame["close"], strict=True)]
    return rows


def _plain_closes(path: Path) -> list[tuple[date, float]] | None:
    """Parse a prices.csv in ``write_ticker``'s exact form; None for any other file."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        text = path.read_bytes().decode("ascii")
    except (OSError, UnicodeDecodeError):
        return None
    if PLAIN_PRICES.fullmatch(text) is None:
        return None
    rows = PLAIN_DATE_CLOSE.findall(text)
    try:
        days = list(map(date.fromisoformat, (day for day, _ in rows)))
    except ValueError:
        return None  # a calendar date that does not exist: pandas names its line
    if len(set(days)) != len(days):
        return None
    return sorted(zip(days, (float(close) for _, close in rows), strict=True))


def read_news(path: Path, ticker: str) -> list[NewsItem]:
    """Read a news.json list of {published, source, headline}."""
    return [
        NewsItem(
            published=_parse_date(item, "published", path, ticker),
            source=_text(item, "source", path, ticker),
            headline=_text(item, "headline", path, ticker),
        )
        for item in _read_list(path, ticker)
    ]


def read_social(path: Path, ticker: str) -> list[SocialPost]:
    """Read a social.json list of {posted, author, text, likes}."""
    posts = []
    for item in _read_list(path, ticker):
        likes = item.get("likes", 0)
        if not isinstance(likes, int) or isinstance(likes, bool):
            raise DataError(f"{ticker}: malformed {path}: likes must be an integer")
        posts.append(
            SocialPost(
                posted=_parse_date(item, "posted", path, ticker),
                author=_text(item, "author", path, ticker),
                text=_text(item, "text", path, ticker),
                likes=likes,
            )
        )
    return posts


def read_fundamentals(path: Path, ticker: str) -> dict[str, Any]:
    """Read a fundamentals.json object."""
    raw = _read_json(path, ticker)
    if not isinstance(raw, dict):
        raise DataError(f"{ticker}: malformed {path}: expected a JSON object")
    return raw


class SnapshotProvider:
    """Serve bundles from ``<data_dir>/<as_of>/<TICKER>/`` files."""

    name = "snapshot"

    def __init__(self, data_dir: Path | str) -> None:
        self.data_dir = Path(data_dir)

    def manifest(self, as_of: date) -> Manifest:
        """Return the snapshot's manifest for ``as_of``."""
        return read_manifest(self.data_dir, as_of)

    def tickers(self, as_of: date) -> list[str]:
        """Return the tickers the snapshot for ``as_of`` says it holds."""
        return self.manifest(as_of).tickers

    def missing(self, tickers: list[str], as_of: date) -> list[str]:
        """Return the tickers the snapshot lacks: without a folder, or not in its manifest (a
        folder an earlier freeze of the date left); DataError when there is no snapshot."""
        listed = set(self.manifest(as_of).tickers)
        return [t for t in tickers
                if t not in listed or not ticker_dir(self.data_dir, as_of, t).is_dir()]

    def load(self, ticker: str, as_of: date) -> MarketBundle:
        """Return the ticker's data up to and including ``as_of``; DataError names a bad file."""
        manifest = self.manifest(as_of)
        folder = self._ticker_dir(ticker, as_of)
        if ticker not in manifest.tickers:
            # Its manifest's provider and DEMO mark are another freeze's: not this data's.
            raise DataError(f"{ticker}: not in snapshot {day_dir(self.data_dir, as_of)}: "
                            f"its {MANIFEST} does not list it ({folder} is left from an "
                            "earlier freeze of the date, or was added by hand)")
        prices = read_prices(folder / PRICES, ticker)
        prices = prices[prices.index <= pd.Timestamp(as_of)]
        if prices.empty:
            raise DataError(f"{ticker}: {folder / PRICES} has no rows on or before {as_of}")
        check_usable(prices, ticker, as_of, str(folder / PRICES))
        # Items dated after the as-of date would leak the future into the analysis.
        news = [n for n in read_news(folder / NEWS, ticker) if n.published <= as_of]
        social = [p for p in read_social(folder / SOCIAL, ticker) if p.posted <= as_of]
        return MarketBundle(
            ticker=ticker,
            as_of=as_of,
            prices=prices,
            indicators=compute_indicators(prices),
            fundamentals=read_fundamentals(folder / FUNDAMENTALS, ticker),
            news=news,
            social=social,
            demo=manifest.demo,
            source=manifest.provider,
        )

    def forward_prices(self, ticker: str, as_of: date, days: int) -> pd.DataFrame:
        """Return up to ``days`` price rows strictly after ``as_of`` (fewer if the file ends)."""
        prices = read_prices(self._ticker_dir(ticker, as_of) / PRICES, ticker)
        return prices[prices.index > pd.Timestamp(as_of)].head(days)

    def closes(self, ticker: str, as_of: date, days: int) -> Closes:
        """Return the close on ``as_of`` and up to ``days`` after it from prices.csv alone."""
        path = self._ticker_dir(ticker, as_of) / PRICES
        rows = read_closes(path, ticker)
        cut = bisect_right(rows, (as_of, math.inf))
        if cut == 0:
            raise DataError(f"{ticker}: {path} has no rows on or before {as_of}")
        start, close = rows[cut - 1]
        return Closes(start, close, rows[cut:cut + days])

    def _ticker_dir(self, ticker: str, as_of: date) -> Path:
        folder = ticker_dir(self.data_dir, as_of, ticker)
        if not folder.is_dir():
            if not day_dir(self.data_dir, as_of).is_dir():
                read_manifest(self.data_dir, as_of)  # raises the "no snapshot for …" error
            raise DataError(f"{ticker}: not in snapshot {day_dir(self.data_dir, as_of)} "
                            f"(missing {folder})")
        return folder


def _check_size(path: Path, ticker: str) -> None:
    """Raise DataError when ``path`` is missing or over MAX_FILE_BYTES, before reading it."""
    if not path.is_file():
        raise DataError(f"{ticker}: missing {path}")
    if (size := path.stat().st_size) > MAX_FILE_BYTES:
        raise DataError(f"{ticker}: {path} is {size:,} bytes, over the "
                        f"{MAX_FILE_BYTES // 2**20} MiB a snapshot file may hold")


def _read_json(path: Path, ticker: str) -> Any:
    _check_size(path, ticker)
    try:
        # utf-8-sig: a file saved by a Windows editor starts with a byte-order mark.
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataError(f"{ticker}: malformed {path}: {_first_line(error)}") from None


def _read_list(path: Path, ticker: str) -> list[dict[str, Any]]:
    raw = _read_json(path, ticker)
    if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
        raise DataError(f"{ticker}: malformed {path}: expected a JSON list of objects")
    return raw


def _text(item: dict[str, Any], key: str, path: Path, ticker: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise DataError(f"{ticker}: malformed {path}: {key} missing or not a string")
    return value


def _parse_date(item: dict[str, Any], key: str, path: Path, ticker: str) -> date:
    value = _text(item, key, path, ticker)
    try:
        return datetime.fromisoformat(value).date()
    except ValueError:
        raise DataError(f"{ticker}: malformed {path}: {key} {value!r} is not an ISO date") from None


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
