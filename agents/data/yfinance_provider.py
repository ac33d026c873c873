"""Load market data from Yahoo Finance through yfinance (the optional ``yfinance`` extra).

yfinance is imported only when this provider is built, so the rest of nightdesk runs without
it. Yahoo rate-limits hard; every request is retried with bounded exponential backoff on a
rate-limit error (yfinance's YFRateLimitError or anything carrying HTTP 429).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta
from typing import Any, TypeVar

import pandas as pd

from agents.data.base import (
    PRICE_COLUMNS,
    Closes,
    MarketBundle,
    NewsItem,
    check_usable,
    closes_of,
)
from agents.data.indicators import compute_indicators
from agents.errors import ConfigError, DataError

T = TypeVar("T")

HISTORY_CALENDAR_DAYS = 400  # ~275 sessions: enough for a 200-session average
# A batch's preflight asks for a fortnight of prices per ticker (any market is open in it),
# a few tickers at once.
PROBE_CALENDAR_DAYS = 14
PROBE_CONCURRENCY = 8
# yfinance `info` key -> nightdesk fundamentals key (the demo uses the same names).
INFO_KEYS: dict[str, str] = {
    "longName": "name",
    "sector": "sector",
    "industry": "industry",
    "currency": "currency",
    "marketCap": "market_cap",
    "sharesOutstanding": "shares_outstanding",
    "trailingPE": "pe_ratio",
    "forwardPE": "forward_pe",
    "priceToBook": "price_to_book",
    "totalRevenue": "revenue_ttm",
    "revenueGrowth": "revenue_growth_yoy",
    "earningsGrowth": "earnings_growth_yoy",
    "grossMargins": "gross_margin",
    "operatingMargins": "operating_margin",
    "profitMargins": "net_margin",
    "debtToEquity": "debt_to_equity",
    "returnOnEquity": "return_on_equity",
    "freeCashflow": "free_cash_flow",
    "dividendYield": "dividend_yield",
    "beta": "beta",
}


def import_yfinance() -> Any:
    """Return the yfinance module, or raise ConfigError saying how to install the extra."""
    try:
        import yfinance
    except ImportError:
        raise ConfigError(
            "the yfinance data provider needs the optional extra: "
            "pip install 'nightdesk[yfinance]'"
        ) from None
    return yfinance


def is_rate_limit(error: BaseException) -> bool:
    """Tell whether ``error`` is Yahoo saying "too many requests"."""
    if type(error).__name__ == "YFRateLimitError":
        return True
    response = getattr(error, "response", None)
    if getattr(response, "status_code", None) == 429:
        return True
    text = str(error)
    return "429" in text or "Too Many Requests" in text or "Rate limited" in text


class YFinanceProvider:
    """Serve bundles fetched live from Yahoo Finance."""

    name = "yfinance"

    def __init__(
        self,
        attempts: int = 5,
        backoff_s: float = 2.0,
        max_backoff_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
        ticker_factory: Callable[[str], Any] | None = None,
    ) -> None:
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._sleep = sleep
        self._ticker = ticker_factory or import_yfinance().Ticker
        # yfinance logs a failure itself (a line per fetch, another for its cookie) before
        # raising it; the DataError raised here names it, once.
        logging.getLogger("yfinance").setLevel(logging.CRITICAL)

    def load(self, ticker: str, as_of: date) -> MarketBundle:
        """Fetch history up to ``as_of``, current fundamentals and news up to ``as_of``."""
        handle = self._ticker(ticker)
        prices = self._history(handle, ticker, as_of - timedelta(days=HISTORY_CALENDAR_DAYS),
                               as_of + timedelta(days=1))
        if prices.empty:
            raise DataError(f"{ticker}: yfinance returned no prices up to {as_of} "
                            "(unknown or delisted symbol?)")
        check_usable(prices, ticker, as_of, "yfinance's history")
        info = self._call(ticker, "info", lambda: handle.info) or {}
        news = self._call(ticker, "news", lambda: handle.news) or []
        return MarketBundle(
            ticker=ticker,
            as_of=as_of,
            prices=prices,
            indicators=compute_indicators(prices),
            fundamentals=fundamentals_from_info(info),
            news=[n for n in (news_item(raw) for raw in news) if n and n.published <= as_of],
            social=[],  # Yahoo has no social feed; the sentiment analyst sees an empty section
            demo=False,
            source="yfinance",
        )

    def missing(self, tickers: list[str], as_of: date) -> list[str]:
        """Return the tickers Yahoo has no prices for in the fortnight up to ``as_of``.

        A fetch that fails (Yahoo unreachable, still rate-limited) proves nothing: that
        ticker is not counted missing, and its own load tells at night.
        """
        def absent(ticker: str) -> bool:
            try:
                return self._history(self._ticker(ticker), ticker,
                                     as_of - timedelta(days=PROBE_CALENDAR_DAYS),
                                     as_of + timedelta(days=1)).empty
            except DataError:
                return False

        with ThreadPoolExecutor(max_workers=PROBE_CONCURRENCY) as pool:
            return [t for t, gone in zip(tickers, pool.map(absent, tickers), strict=True)
                    if gone]

    def forward_prices(self, ticker: str, as_of: date, days: int) -> pd.DataFrame:
        """Fetch up to ``days`` sessions after ``as_of`` (fewer when they have not happened)."""
        handle = self._ticker(ticker)
        # Two calendar days per session plus a margin covers weekends and holidays.
        end = as_of + timedelta(days=2 * days + 10)
        prices = self._history(handle, ticker, as_of + timedelta(days=1), end)
        return prices[prices.index > pd.Timestamp(as_of)].head(days)

    def closes(self, ticker: str, as_of: date, days: int) -> Closes:
        """Fetch the close on ``as_of`` and up to ``days`` after it (no fundamentals or news)."""
        handle = self._ticker(ticker)
        prices = self._history(handle, ticker, as_of - timedelta(days=HISTORY_CALENDAR_DAYS),
                               as_of + timedelta(days=1))
        found = closes_of(pd.concat([prices, self.forward_prices(ticker, as_of, days)]),
                          as_of, days)
        if found is None:
            raise DataError(f"{ticker}: yfinance returned no prices up to {as_of} "
                            "(unknown or delisted symbol?)")
        return found

    def _history(self, handle: Any, ticker: str, start: date, end: date) -> pd.DataFrame:
        raw = self._call(ticker, "history", lambda: handle.history(
            start=start.isoformat(), end=end.isoformat(), interval="1d", auto_adjust=True))
        return prices_from_history(raw, ticker)

    def _call(self, ticker: str, what: str, fetch: Callable[[], T]) -> T:
        """Run ``fetch``, retrying rate-limit errors with exponential backoff, a bounded number."""
        for attempt in range(1, self.attempts + 1):
            try:
                return fetch()
            except Exception as error:
                if not is_rate_limit(error):
                    raise DataError(f"{ticker}: yfinance {what} failed: "
                                    f"{type(error).__name__}: {error}") from error
                if attempt == self.attempts:
                    raise DataError(f"{ticker}: yfinance {what} still rate-limited after "
                                    f"{self.attempts} attempts") from error
                self._sleep(min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s))
        raise AssertionError("unreachable")  # the loop returns or raises


def prices_from_history(raw: pd.DataFrame | None, ticker: str) -> pd.DataFrame:
    """Turn yfinance's history frame into nightdesk's: lower-case OHLCV, naive date index."""
    if raw is None or raw.empty:
        return pd.DataFrame(columns=PRICE_COLUMNS, index=pd.DatetimeIndex([], name="date"))
    frame = raw.rename(columns=str.lower)
    missing = [c for c in PRICE_COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(f"{ticker}: yfinance history lacks column {missing[0]}")
    index = pd.DatetimeIndex(frame.index)
    if index.tz is not None:
        # Daily bars are stamped at the exchange's midnight; keep that local calendar date.
        index = index.tz_localize(None)
    frame = frame[PRICE_COLUMNS].astype("float64")
    frame.index = pd.DatetimeIndex(index.normalize(), name="date")
    frame = frame.dropna(subset=["close"])
    frame["volume"] = frame["volume"].fillna(0.0)  # indices and some funds report no volume
    return frame[~frame.index.duplicated(keep="last")].sort_index()


def fundamentals_from_info(info: dict[str, Any]) -> dict[str, Any]:
    """Pick the fundamentals nightdesk shows from yfinance's ``info`` dict.

    Yahoo's values are as of the fetch, not the as-of date; the note says so in the prompt.
    """
    picked: dict[str, Any] = {key: info[src] for src, key in INFO_KEYS.items()
                              if info.get(src) is not None}
    if "debt_to_equity" in picked:
        picked["debt_to_equity"] = round(float(picked["debt_to_equity"]) / 100, 4)  # Yahoo: %
    picked["note"] = "values as of the fetch date, not point-in-time"
    return picked


def news_item(raw: dict[str, Any]) -> NewsItem | None:
    """Turn one yfinance news entry (old flat or new ``content`` shape) into a NewsItem."""
    content = raw.get("content") if isinstance(raw.get("content"), dict) else None
    if content is not None:
        title = content.get("title")
        provider = content.get("provider") or {}
        source = provider.get("displayName") if isinstance(provider, dict) else None
        stamp = content.get("pubDate") or content.get("displayTime")
        try:
            published = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).date()
        except ValueError:
            return None
    else:
        title = raw.get("title")
        source = raw.get("publisher")
        epoch = raw.get("providerPublishTime")
        if not isinstance(epoch, int | float):
            return None
        published = datetime.fromtimestamp(epoch, tz=UTC).date()
    if not title:
        return None
    return NewsItem(published=published, source=str(source or "Yahoo Finance"),
                    headline=str(title))
