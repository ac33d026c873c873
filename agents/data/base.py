"""Define the market-data interface every provider implements and the bundle it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import Any, Protocol

import numpy as np
import pandas as pd

from agents.data.indicators import INDICATORS
from agents.errors import DataError

PRICE_COLUMNS = ["open", "high", "low", "close", "volume"]
# A ticker whose last session is older than this before the as-of date has no price as of
# it (delisted, halted, or a snapshot dated past its data). Two weeks spans the longest
# closure of any market (the Lunar New Year's nine days), as the yfinance probe's fortnight.
STALE_DAYS = 14
# Fewer sessions than the shortest indicator's window leave the market analyst no indicator
# at all: a ticker listed days ago (or a snapshot cut short) is refused, not rated on a price.
MIN_SESSIONS = min(rows for rows, _ in INDICATORS.values())
# How far a bar's open or close may lie outside its low and high, or its high below its low:
# a cent, or half a percent of the price, whichever is more (a vendor's rounding, a closing
# auction printed apart from the day's trades). Past it the bar cannot be.
BAR_SLACK, BAR_SLACK_CENTS = 0.005, 0.01
# Share splits a one-session move is matched against (N-for-1 and 1-for-N). 3-for-2 is left
# out: a third off at the open is a move real news makes, and a note would excuse it.
SPLIT_RATIOS = (2, 3, 4, 5, 6, 8, 10, 15, 20, 25, 30, 40, 50, 100)
SPLIT_GAP = 0.02  # how near the open must come to the previous close times the split's factor


@dataclass
class NewsItem:
    published: date
    source: str
    headline: str


@dataclass
class SocialPost:
    posted: date
    author: str
    text: str
    likes: int = 0


@dataclass
class MarketBundle:
    """Everything the four analysts see for one ticker on one as-of date.

    ``prices`` holds daily OHLCV rows up to and including ``as_of`` only (never later:
    forward prices are for evaluation, read through ``DataProvider.forward_prices``).
    """

    ticker: str
    as_of: date
    prices: pd.DataFrame  # index: date; columns: open, high, low, close, volume
    indicators: pd.DataFrame  # index: date; technical indicator columns, same dates as prices
    fundamentals: dict[str, Any]
    news: list[NewsItem] = field(default_factory=list)
    social: list[SocialPost] = field(default_factory=list)
    demo: bool = False  # True when the data came from the seeded demo snapshot
    source: str = ""  # provider name, shown wherever data is shown


def bad_value(prices: pd.DataFrame) -> tuple[int, str] | None:
    """Return the position of the first row no analysis can take, and why; None if none.

    A price (open, high, low, close) must be finite and above 0, a volume finite and not
    below 0: a zero close divides every return by zero, a negative one reads as a crash.
    Then every bar must be one that can be (``bad_bar``).
    """
    values = prices[PRICE_COLUMNS].to_numpy(dtype="float64")
    bad = ~np.isfinite(values)
    bad[:, :4] |= values[:, :4] <= 0
    bad[:, 4] |= values[:, 4] < 0
    rows = bad.any(axis=1)
    if rows.any():
        position = int(rows.argmax())
        column = int(bad[position].argmax())
        name = PRICE_COLUMNS[column]
        need = "a finite volume of 0 or more" if name == "volume" else "a finite price above 0"
        return position, f"{name} {values[position, column]:g} is not {need}"
    return bad_bar(values)


def bad_bar(values: np.ndarray) -> tuple[int, str] | None:
    """Return the position of the first bar that cannot be, and why; None if none.

    ``values``: OHLCV rows of finite prices above 0. A day's high is at least its low, and
    its open and close lie between them, to within ``BAR_SLACK``.
    """
    open_, high, low, close = values[:, 0], values[:, 1], values[:, 2], values[:, 3]
    slack = np.maximum(BAR_SLACK * high, BAR_SLACK_CENTS)
    checks = [(low - high > slack, "high", high, "below low", low)]
    for name, price in (("open", open_), ("close", close)):
        checks.append((price - high > slack, name, price, "above high", high))
        checks.append((low - price > slack, name, price, "below low", low))
    first = min(((int(bad.argmax()), i) for i, (bad, *_) in enumerate(checks) if bad.any()),
                default=None)
    if first is None:
        return None
    position, which = first
    _, name, price, where, bound = checks[which]
    return position, (f"{name} {price[position]:g} is {where} {bound[position]:g}: no day's "
                      "bar can be so (its high is at least its low, its open and close between)")


def check_usable(prices: pd.DataFrame, ticker: str, as_of: date, where: str) -> None:
    """Raise DataError unless ``prices`` (the rows up to ``as_of``, ascending, not empty) can
    be analyzed as of it: every value and bar as ``bad_value`` wants, the last session at
    most STALE_DAYS before ``as_of`` (analysts told "as of" it would take old prices for its
    own), at least MIN_SESSIONS sessions. Scoring reads the rows after it apart, and takes a
    bad close as no return."""
    if (found := bad_value(prices)) is not None:
        raise DataError(f"{ticker}: {where}, {prices.index[found[0]].date()}: {found[1]}")
    last = prices.index[-1].date()
    if (as_of - last).days > STALE_DAYS:
        raise DataError(f"{ticker}: {where} ends on {last}, {(as_of - last).days} days before "
                        f"the as-of date {as_of}: no price as of it (none in {STALE_DAYS} days)")
    if len(prices) < MIN_SESSIONS:
        raise DataError(f"{ticker}: {where} has {len(prices)} session(s) up to {as_of}, fewer "
                        f"than the {MIN_SESSIONS} the shortest indicator needs: too little "
                        "history to rate")


@dataclass(frozen=True)
class SplitLike:
    """A one-session move the size of a share split, in prices that may not be adjusted."""

    day: date
    factor: float  # the open over the previous close
    ratio: int  # N of an N-for-1 split (factor about 1/N), or of a 1-for-N one (about N)
    volume: float  # share volume since, over before (medians)

    @property
    def split(self) -> str:
        return f"{self.ratio}-for-1" if self.factor < 1 else f"1-for-{self.ratio}"


def split_like(prices: pd.DataFrame) -> list[SplitLike]:
    """Return the sessions whose open is the previous close times a split's factor (within
    ``SPLIT_GAP``) and whose share volume moved as that split moves it, by at least the
    square root of its ratio: up for an N-for-1, down for a 1-for-N (medians of up to five
    sessions from it, and of the twenty before). Prices that are not adjusted for a split
    show one so; a real move of that size shows the same, which these prices cannot tell."""
    open_ = prices["open"].to_numpy(dtype="float64")
    close = prices["close"].to_numpy(dtype="float64")
    volume = prices["volume"].to_numpy(dtype="float64")
    found = []
    least = np.log(min(SPLIT_RATIOS) / (1 + SPLIT_GAP))
    for i in np.flatnonzero(np.abs(np.log(open_[1:] / close[:-1])) >= least) + 1:
        factor = float(open_[i] / close[i - 1])
        size = 1 / factor if factor < 1 else factor
        ratio = min(SPLIT_RATIOS, key=lambda n: abs(np.log(size / n)))
        if abs(size / ratio - 1) > SPLIT_GAP:
            continue
        before, since = volume[max(i - 20, 0):i], volume[i:i + 5]
        moved = max(float(np.median(since)), 1.0) / max(float(np.median(before)), 1.0)
        if (moved if factor < 1 else 1 / moved) >= np.sqrt(ratio):
            found.append(SplitLike(prices.index[int(i)].date(), factor, ratio, moved))
    return found


@dataclass(frozen=True)
class Closes:
    """What scoring a rating needs of one ticker's prices around an as-of date."""

    start: date  # the last session on or before the as-of date
    close: float  # its close
    ahead: list[tuple[date, float]]  # the closes of the sessions after it, oldest first


def closes_of(prices: pd.DataFrame, as_of: date, days: int) -> Closes | None:
    """Return the ``Closes`` of an OHLCV frame (sorted by date); None when none is ≤ ``as_of``."""
    cut = prices.index <= pd.Timestamp(as_of)
    past, after = prices[cut], prices[~cut].head(days)
    if past.empty:
        return None
    return Closes(past.index[-1].date(), float(past["close"].iloc[-1]),
                  [(i.date(), float(c)) for i, c in zip(after.index, after["close"],
                                                        strict=True)])


class DataProvider(Protocol):
    """Load one ticker's data for an as-of date; raise DataError naming what failed."""

    name: str

    def load(self, ticker: str, as_of: date) -> MarketBundle: ...

    def forward_prices(self, ticker: str, as_of: date, days: int) -> pd.DataFrame: ...

    def closes(self, ticker: str, as_of: date, days: int) -> Closes:
        """Return the close on ``as_of`` and up to ``days`` closes after it, as ``load`` and
        ``forward_prices`` would give them, without the rest of the bundle (no indicators)."""
        ...

    def missing(self, tickers: list[str], as_of: date) -> list[str]:
        """Return the tickers it has no data for on ``as_of`` (a batch's preflight asks)."""
        ...
