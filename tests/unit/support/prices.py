"""Price histories with known forward returns."""

from __future__ import annotations

from datetime import date, timedelta

import pandas as pd


def prices(as_of: date, forward: list[float]) -> pd.DataFrame:
    """Ten flat sessions ending at ``as_of`` (close 100), then the given forward closes."""
    history = pd.bdate_range(end=as_of, periods=10)
    ahead = pd.bdate_range(start=as_of + timedelta(days=1), periods=len(forward))
    closes = [100.0] * len(history) + forward
    index = pd.DatetimeIndex(list(history.append(ahead)), name="date")
    return pd.DataFrame({"open": closes, "high": closes, "low": closes, "close": closes,
                         "volume": [1000.0] * len(closes)}, index=index)


def path_to(end: float, days: int = 6) -> list[float]:
    """Forward closes that reach ``end`` on session 5 and stay there."""
    return [100.0 + (end - 100.0) * min(i, 5) / 5 for i in range(1, days + 1)]
