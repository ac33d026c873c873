"""Define the market-data interface every provider implements and the bundle it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import Any, Protocol

import numpy as np
import pandas as pd

from agents.errors import DataError

PRICE_COLUMNS = ["open", "high", "low", "close", "volume"]
# A ticker whose last session is older than this before the as-of date has no price as of
# it (delisted, halted, or a snapshot dated past its data). Two weeks spans the longest
# closure of any market (the Lunar New Year's nine days), as the yfinance probe's fortnight.
STALE_DAYS = 14


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
    """
    values = prices[PRICE_COLUMNS].to_numpy(dtype="float64")
    bad = ~np.isfinite(values)
    bad[:, :4] |= values[:, :4] <= 0
    bad[:, 4] |= values[:, 4] < 0
    rows = bad.any(axis=1)
    if not rows.any():
        return None
    position = int(rows.argmax())
    column = int(bad[position].argmax())
    name = PRICE_COLUMNS[column]
    need = "a finite volume of 0 or more" if name == "volume" else "a finite price above 0"
    return position, f"{name} {values[position, column]:g} is not {need}"


def check_usable(prices: pd.DataFrame, ticker: str, as_of: date, where: str) -> None:
    """Raise DataError unless ``prices`` (the rows up to ``as_of``, ascending, not empty) can
    be analyzed as of it: every value as ``bad_value`` wants, the last session at most
    STALE_DAYS before ``as_of`` (analysts told "as of" it would take old prices for its
    own). Scoring reads the rows after it apart, and takes a bad close as no return."""
    if (found := bad_value(prices)) is not None:
        raise DataError(f"{ticker}: {where}, {prices.index[found[0]].date()}: {found[1]}")
    last = prices.index[-1].date()
    if (as_of - last).days > STALE_DAYS:
        raise DataError(f"{ticker}: {where} ends on {last}, {(as_of - last).days} days before "
                        f"the as-of date {as_of}: no price as of it (none in {STALE_DAYS} days)")


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
