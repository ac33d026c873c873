"""Compute the technical indicators the market analyst sees, with stockstats."""

from __future__ import annotations

import pandas as pd
import stockstats

# stockstats name -> (minimum rows for a meaningful value, what it is). The minimum masks the
# warm-up rows: stockstats fills them from fewer observations, which would look like real values.
INDICATORS: dict[str, tuple[int, str]] = {
    "close_10_sma": (10, "10-session simple moving average of close"),
    "close_50_sma": (50, "50-session simple moving average of close"),
    "close_200_sma": (200, "200-session simple moving average of close"),
    "close_10_ema": (10, "10-session exponential moving average of close"),
    "rsi_14": (15, "14-session relative strength index (0-100)"),
    "macd": (26, "MACD line (12/26 EMA difference)"),
    "macds": (35, "MACD signal line (9-session EMA of MACD)"),
    "macdh": (35, "MACD histogram (MACD minus signal)"),
    "boll": (20, "Bollinger middle band (20-session SMA)"),
    "boll_ub": (20, "Bollinger upper band (+2 standard deviations)"),
    "boll_lb": (20, "Bollinger lower band (-2 standard deviations)"),
    "atr_14": (15, "14-session average true range"),
    "vwma_20": (20, "20-session volume-weighted moving average"),
    "mfi_14": (15, "14-session money flow index (0-1)"),
}


def compute_indicators(prices: pd.DataFrame) -> pd.DataFrame:
    """Return one column per indicator in INDICATORS, indexed like ``prices``.

    An indicator whose window needs more rows than exist is left out entirely (a 200-session
    average over 150 sessions would mislead); warm-up rows of the others are NaN.
    """
    columns = ["open", "high", "low", "close", "volume"]
    frame = prices[columns].astype("float64").copy()
    frame.index = pd.RangeIndex(len(frame))  # stockstats re-indexes by a 'date' column if present
    stock = stockstats.wrap(frame)
    result = pd.DataFrame(index=prices.index)
    for name, (min_rows, _) in INDICATORS.items():
        if len(prices) < min_rows:
            continue
        values = pd.Series(stock[name].to_numpy(dtype="float64"), index=prices.index)
        values.iloc[: min_rows - 1] = float("nan")
        result[name] = values
    return result
