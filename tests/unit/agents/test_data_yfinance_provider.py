"""Test the yfinance provider against a faked yfinance.Ticker: no network."""

from __future__ import annotations

import builtins
import logging
import sys
from datetime import date
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pytest

from agents.data.freeze import freeze
from agents.data.snapshot import SnapshotProvider
from agents.data.yfinance_provider import YFinanceProvider, import_yfinance, is_rate_limit
from agents.errors import ConfigError, DataError

AS_OF = date(2026, 11, 27)


class RateLimited(Exception):
    """Stands in for yfinance.exceptions.YFRateLimitError."""


RateLimited.__name__ = "YFRateLimitError"


def _history(start: str, end: str) -> pd.DataFrame:
    days = pd.bdate_range("2025-10-01", "2027-03-01", tz="America/New_York")
    days = days[(days >= pd.Timestamp(start, tz="America/New_York"))
                & (days < pd.Timestamp(end, tz="America/New_York"))]
    close = 100 + np.arange(len(days)) * 0.5
    return pd.DataFrame({"Open": close - 0.2, "High": close + 1, "Low": close - 1,
                         "Close": close, "Volume": 1_000_000.0, "Dividends": 0.0,
                         "Stock Splits": 0.0}, index=pd.DatetimeIndex(days, name="Date"))


class FakeTicker:
    """Answers like yfinance.Ticker; ``failures`` rate-limits the first N history calls."""

    calls: ClassVar[list[str]] = []
    failures: ClassVar[int] = 0

    def __init__(self, symbol: str) -> None:
        self.symbol = symbol

    def history(self, **kwargs: Any) -> pd.DataFrame:
        FakeTicker.calls.append(f"history {kwargs['start']}..{kwargs['end']}")
        if FakeTicker.failures:
            FakeTicker.failures -= 1
            raise RateLimited("Too Many Requests. Rate limited. Try after a while.")
        if self.symbol == "GONE":
            return pd.DataFrame()
        return _history(kwargs["start"], kwargs["end"])

    @property
    def info(self) -> dict[str, Any]:
        return {"longName": "Example Inc", "marketCap": 2.5e12, "trailingPE": 30.1,
                "debtToEquity": 150.0, "sector": "Technology", "ebitda": None}

    @property
    def news(self) -> list[dict[str, Any]]:
        return [
            {"content": {"title": "Example ships a product", "pubDate": "2026-11-26T14:00:00Z",
                         "provider": {"displayName": "Newswire"}}},
            {"title": "Old-format headline", "publisher": "Old Wire",
             "providerPublishTime": 1795000000},  # 2026-11-18
            {"content": {"title": "From the future", "pubDate": "2026-12-05T10:00:00Z"}},
        ]


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    FakeTicker.calls = []
    FakeTicker.failures = 0
    import yfinance

    monkeypatch.setattr(yfinance, "Ticker", FakeTicker)
    return []


def _provider(sleeps: list[float], **kwargs: Any) -> YFinanceProvider:
    return YFinanceProvider(sleep=sleeps.append, **kwargs)


def test_load_maps_yfinance_shapes(sleeps: list[float]) -> None:
    bundle = _provider(sleeps).load("EXMP", AS_OF)
    assert list(bundle.prices.columns) == ["open", "high", "low", "close", "volume"]
    assert bundle.prices.index.tz is None
    assert bundle.prices.index.max() == pd.Timestamp(AS_OF)
    assert "close_200_sma" in bundle.indicators.columns
    assert bundle.fundamentals["name"] == "Example Inc"
    assert bundle.fundamentals["pe_ratio"] == 30.1
    assert bundle.fundamentals["debt_to_equity"] == 1.5  # Yahoo reports percent
    assert [n.headline for n in bundle.news] == ["Example ships a product", "Old-format headline"]
    assert bundle.news[1].published == date(2026, 11, 18)
    assert bundle.source == "yfinance" and not bundle.demo and bundle.social == []
    assert sleeps == []


def test_rate_limit_is_retried_with_backoff(sleeps: list[float]) -> None:
    FakeTicker.failures = 2
    bundle = _provider(sleeps, backoff_s=1.5).load("EXMP", AS_OF)
    assert len(bundle.prices) > 200
    assert sleeps == [1.5, 3.0]
    assert len(FakeTicker.calls) == 3


def test_rate_limit_gives_up_after_bounded_attempts(sleeps: list[float]) -> None:
    FakeTicker.failures = 10
    with pytest.raises(DataError, match="EXMP: yfinance history still rate-limited after 3"):
        _provider(sleeps, attempts=3, backoff_s=1.0, max_backoff_s=1.5).load("EXMP", AS_OF)
    assert sleeps == [1.0, 1.5]


def test_other_errors_are_not_retried(sleeps: list[float], monkeypatch) -> None:
    def broken(self: FakeTicker, **kwargs: Any) -> pd.DataFrame:
        raise KeyError("chart")

    monkeypatch.setattr(FakeTicker, "history", broken)
    with pytest.raises(DataError, match="EXMP: yfinance history failed: KeyError"):
        _provider(sleeps).load("EXMP", AS_OF)
    assert sleeps == []


def test_unknown_symbol(sleeps: list[float]) -> None:
    with pytest.raises(DataError, match="GONE: yfinance returned no prices"):
        _provider(sleeps).load("GONE", AS_OF)


def test_forward_prices(sleeps: list[float]) -> None:
    forward = _provider(sleeps).forward_prices("EXMP", AS_OF, 10)
    assert len(forward) == 10 and forward.index.min() > pd.Timestamp(AS_OF)


def test_closes_are_those_of_load_and_forward_prices(sleeps: list[float]) -> None:
    provider = _provider(sleeps)
    found = provider.closes("EXMP", AS_OF, 10)
    past, ahead = provider.load("EXMP", AS_OF).prices, provider.forward_prices("EXMP", AS_OF, 10)
    assert found.start == past.index[-1].date() <= AS_OF
    assert found.close == float(past["close"].iloc[-1])
    assert found.ahead == [(i.date(), float(c)) for i, c in ahead["close"].items()]
    with pytest.raises(DataError, match="GONE: yfinance returned no prices"):
        provider.closes("GONE", AS_OF, 5)


def test_http_429_counts_as_rate_limit() -> None:
    class Response:
        status_code = 429

    error = RuntimeError("boom")
    error.response = Response()  # type: ignore[attr-defined]
    assert is_rate_limit(error)
    assert not is_rate_limit(ValueError("bad symbol"))


def test_freeze_from_yfinance_round_trips(sleeps: list[float], tmp_path) -> None:
    provider = _provider(sleeps)
    result = freeze(provider, ["EXMP", "GONE"], AS_OF, tmp_path, forward_days=5)
    assert result.frozen == ["EXMP"] and "GONE" in result.failed
    stored = SnapshotProvider(tmp_path).load("EXMP", AS_OF)
    live = provider.load("EXMP", AS_OF)
    pd.testing.assert_frame_equal(stored.prices, live.prices, check_freq=False)
    assert stored.source == "yfinance" and not stored.demo
    assert len(SnapshotProvider(tmp_path).forward_prices("EXMP", AS_OF, 60)) == 5


def test_missing_extra_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_yfinance(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "yfinance":
            raise ImportError("No module named 'yfinance'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "yfinance", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_yfinance)
    with pytest.raises(ConfigError, match=r"nightdesk\[yfinance\]"):
        import_yfinance()


def test_a_symbol_without_a_session_for_weeks_is_refused(sleeps: list[float]) -> None:
    # Yahoo keeps a delisted symbol's old history: 400 days asked, months of it returned.
    with pytest.raises(DataError, match=r"^EXMP: yfinance's history ends on 2027-03-01, "
                                        r"92 days before the as-of date 2027-06-01"):
        _provider(sleeps).load("EXMP", date(2027, 6, 1))


def test_a_zero_price_in_the_history_is_refused_by_its_date(
        sleeps: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    def history(self: FakeTicker, **kwargs: Any) -> pd.DataFrame:
        frame = _history(kwargs["start"], kwargs["end"])
        frame.loc[frame.index[-2], "Close"] = 0.0
        return frame

    monkeypatch.setattr(FakeTicker, "history", history)
    with pytest.raises(DataError, match=r"^EXMP: yfinance.s history, 2026-11-26: close 0 is "
                                        "not a finite price above 0$"):
        _provider(sleeps).load("EXMP", AS_OF)


def test_a_bar_that_cannot_be_and_a_new_listing_are_refused(
        sleeps: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    # The snapshot's rules (check_usable), Yahoo's history too: a high below its low, and a
    # symbol listed days ago (three sessions: no indicator has its window).
    def history(self: FakeTicker, **kwargs: Any) -> pd.DataFrame:
        frame = _history(kwargs["start"], kwargs["end"])
        if self.symbol == "NEW":
            return frame.tail(3)
        frame.loc[frame.index[-2], "High"] = frame["Low"].iloc[-2] - 5
        return frame

    monkeypatch.setattr(FakeTicker, "history", history)
    with pytest.raises(DataError, match=r"^EXMP: yfinance.s history, 2026-11-26: high [0-9.]+ is "
                                        "below low [0-9.]+: no day's bar can be so"):
        _provider(sleeps).load("EXMP", AS_OF)
    with pytest.raises(DataError, match=r"^NEW: yfinance.s history has 3 session\(s\) up to "
                                        "2026-11-27, fewer than the 10 the shortest"):
        _provider(sleeps).load("NEW", AS_OF)


def test_a_failed_fetch_is_said_once_not_also_by_yfinance(
        sleeps: list[float], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    def history(self: FakeTicker, **kwargs: Any) -> pd.DataFrame:
        # As yfinance does with no network: its own error line, then the exception.
        logging.getLogger("yfinance").error("Failed to get ticker 'EXMP' reason: DNSError")
        raise OSError("Could not resolve host: query2.finance.yahoo.com")

    monkeypatch.setattr(FakeTicker, "history", history)
    with pytest.raises(DataError, match=r"^EXMP: yfinance history failed: OSError: Could not "):
        _provider(sleeps).load("EXMP", AS_OF)
    assert [r.getMessage() for r in caplog.records if r.name == "yfinance"] == []
