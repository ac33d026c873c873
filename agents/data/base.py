"""Define the market-data interface every provider implements and the bundle it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import Any, Protocol

import pandas as pd


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
