"""Render a MarketBundle as compact, deterministic prompt sections for the four analysts.

Same bundle and arguments, byte-identical text: the prompts share a prefix cache and are
replayed, so nothing here may depend on the clock, the locale or dict ordering. The size
arguments (``max_rows``, ``max_items``, ``max_chars``) let the caller fit an 8k-token CPU
model as well as a 34k-token GPU model. Every section opens with its source line, which says
DEMO for synthetic data.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from agents.data.base import MarketBundle, split_like
from agents.data.indicators import INDICATORS

# fundamentals key -> (label, kind); rendered in this order, unknown keys after, sorted.
FUNDAMENTAL_LABELS: dict[str, tuple[str, str]] = {
    "name": ("name", "text"),
    "sector": ("sector", "text"),
    "industry": ("industry", "text"),
    "currency": ("currency", "text"),
    "market_cap": ("market cap", "money"),
    "shares_outstanding": ("shares outstanding", "count"),
    "pe_ratio": ("P/E (trailing)", "multiple"),
    "forward_pe": ("P/E (forward)", "multiple"),
    "price_to_book": ("price/book", "multiple"),
    "revenue_ttm": ("revenue (trailing 12 months)", "money"),
    "revenue_growth_yoy": ("revenue growth (year over year)", "percent"),
    "earnings_growth_yoy": ("earnings growth (year over year)", "percent"),
    "gross_margin": ("gross margin", "percent"),
    "operating_margin": ("operating margin", "percent"),
    "net_margin": ("net margin", "percent"),
    "debt_to_equity": ("debt/equity", "multiple"),
    "return_on_equity": ("return on equity", "percent"),
    "free_cash_flow": ("free cash flow", "money"),
    "dividend_yield": ("dividend yield", "percent"),
    "beta": ("beta", "number"),
    "note": ("note", "text"),
}


def source_line(bundle: MarketBundle) -> str:
    """Return the first line of every section: where the data came from."""
    if bundle.demo:
        return "Source: DEMO data (synthetic, not real market data)"
    return f"Source: {bundle.source or 'unknown provider'}"


def render_prices(bundle: MarketBundle, max_rows: int = 20) -> str:
    """Render the last ``max_rows`` sessions as a table, then summary statistics."""
    prices = bundle.prices
    shown = prices.tail(max_rows) if max_rows > 0 else prices.iloc[0:0]
    lines = [
        source_line(bundle),
        f"Daily prices of {bundle.ticker}: last {len(shown)} of {len(prices)} sessions "
        f"up to {bundle.as_of.isoformat()}.",
    ]
    if len(shown):
        lines.append(f"{'date':<10}  {'open':>9}  {'high':>9}  {'low':>9}  {'close':>9}  "
                     f"{'volume':>8}")
        for day, row in shown.iterrows():
            lines.append(
                f"{_day(day):<10}  {_price(row['open']):>9}  {_price(row['high']):>9}  "
                f"{_price(row['low']):>9}  {_price(row['close']):>9}  "
                f"{_compact(row['volume']):>8}"
            )
    if prices.empty:
        lines.append("No price history.")
    else:
        lines.append("Summary: " + "; ".join(_price_summary(prices)) + ".")
        lines.extend(split_notes(prices))
    return "\n".join(lines) + "\n"


def split_notes(prices: pd.DataFrame) -> list[str]:
    """Say of each move the size of a share split (``split_like``) that it may be one: the
    prices are taken as given, and one not adjusted for reads as a crash (or a surge)."""
    return [
        f"Note: on {move.day.isoformat()} the price opened at {move.factor:.3f} of the close "
        f"before ({_pct(move.factor - 1, signed=True)}) and share volume moved "
        f"x{move.volume:.2f}, as a {move.split} share split moves them. If these prices are "
        "not adjusted for such a split, that move is no change in value, and every change, "
        "range, volatility and indicator across it is distorted; if no split took place, "
        "it is a real move. The news and fundamentals may tell which."
        for move in split_like(prices)]


def render_indicators(bundle: MarketBundle, max_rows: int = 5, lookback: int = 5) -> str:
    """Render each indicator's latest value, its value ``lookback`` sessions earlier and a trend.

    ``max_rows`` > 0 adds a table of the last sessions of the moving averages, RSI and MACD.
    """
    ind = bundle.indicators
    lines = [
        source_line(bundle),
        f"Technical indicators of {bundle.ticker} on {bundle.as_of.isoformat()} "
        f"(computed with stockstats from {len(bundle.prices)} sessions):",
    ]
    if ind.empty or not len(ind.columns):
        lines.append("No indicators: too little price history.")
        return "\n".join(lines) + "\n"
    for name in ind.columns:
        series = ind[name].dropna()
        description = INDICATORS.get(name, (0, name))[1]
        if series.empty:
            lines.append(f"- {name}: n/a ({description})")
            continue
        latest = float(series.iloc[-1])
        text = f"- {name}: {_num(latest)}"
        if len(series) > lookback:
            earlier = float(series.iloc[-1 - lookback])
            text += f" ({lookback} sessions earlier {_num(earlier)}, {_trend(earlier, latest)})"
        lines.append(f"{text}; {description}")
    lines.extend(_readings(bundle))
    table_cols = [c for c in ("close_10_sma", "close_50_sma", "rsi_14", "macd", "macds")
                  if c in ind.columns]
    if max_rows > 0 and table_cols:
        lines.append(f"Last {min(max_rows, len(ind))} sessions:")
        lines.append(f"{'date':<10}  " + "  ".join(f"{c:>12}" for c in table_cols))
        for day, row in ind[table_cols].tail(max_rows).iterrows():
            lines.append(f"{_day(day):<10}  " + "  ".join(f"{_num(row[c]):>12}"
                                                         for c in table_cols))
    return "\n".join(lines) + "\n"


def render_fundamentals(bundle: MarketBundle, max_items: int | None = None) -> str:
    """Render the fundamentals, known fields first in a fixed order, then the rest sorted."""
    facts = bundle.fundamentals
    keys = [k for k in FUNDAMENTAL_LABELS if k in facts]
    keys += sorted(k for k in facts if k not in FUNDAMENTAL_LABELS)
    if max_items is not None:
        keys = keys[:max_items]
    title = f" ({facts['name']})" if isinstance(facts.get("name"), str) else ""
    lines = [source_line(bundle), f"Fundamentals of {bundle.ticker}{title}:"]
    if not keys:
        lines.append("No fundamentals available.")
    currency = str(facts.get("currency") or "")
    for key in keys:
        label, kind = FUNDAMENTAL_LABELS.get(key, (key.replace("_", " "), "auto"))
        lines.append(f"- {label}: {_fact(facts[key], kind, currency)}")
    return "\n".join(lines) + "\n"


def render_news(bundle: MarketBundle, max_items: int = 10, max_chars: int = 200) -> str:
    """Render up to ``max_items`` headlines, newest first."""
    items = sorted(bundle.news, key=lambda n: n.published, reverse=True)[:max(max_items, 0)]
    lines = [
        source_line(bundle),
        f"News headlines about {bundle.ticker} up to {bundle.as_of.isoformat()} "
        f"({len(items)} of {len(bundle.news)}, newest first):",
    ]
    if not items:
        lines.append("No headlines.")
    for item in items:
        lines.append(f"- {item.published.isoformat()} [{_clip(item.source, 40)}] "
                     f"{_clip(item.headline, max_chars)}")
    return "\n".join(lines) + "\n"


def render_social(bundle: MarketBundle, max_items: int = 10, max_chars: int = 200) -> str:
    """Render up to ``max_items`` social posts, newest first, each clipped to ``max_chars``."""
    posts = sorted(bundle.social, key=lambda p: p.posted, reverse=True)[:max(max_items, 0)]
    lines = [
        source_line(bundle),
        f"Social media posts about {bundle.ticker} up to {bundle.as_of.isoformat()} "
        f"({len(posts)} of {len(bundle.social)}, newest first):",
    ]
    if not posts:
        lines.append("No posts.")
    for post in posts:
        lines.append(f"- {post.posted.isoformat()} @{_clip(post.author, 30)} "
                     f"({post.likes} likes): {_clip(post.text, max_chars)}")
    return "\n".join(lines) + "\n"


def _price_summary(prices: pd.DataFrame) -> list[str]:
    close = prices["close"]
    last = float(close.iloc[-1])
    parts = [f"last close {_price(last)} on {_day(close.index[-1])}"]
    changes = [f"{n}d {_pct(last / float(close.iloc[-1 - n]) - 1, signed=True)}"
               for n in (1, 5, 20, 60) if len(close) > n]
    if changes:
        parts.append("change " + ", ".join(changes))
    window = close.tail(252)
    high, low = float(window.max()), float(window.min())
    where = (last - low) / (high - low) if high > low else 0.5
    parts.append(f"{len(window)}-session high {_price(high)}, low {_price(low)} "
                 f"(close at {where * 100:.0f}% of range)")
    returns = np.log(close.tail(21)).diff().dropna()
    if len(returns) >= 5:
        parts.append(f"annualized volatility (20d) {_pct(float(returns.std()) * math.sqrt(252))}")
    parts.append(f"average volume (20d) {_compact(float(prices['volume'].tail(20).mean()))}")
    return parts


def _readings(bundle: MarketBundle) -> list[str]:
    """Spell out the plain readings a small model might miss (position vs averages, RSI zone)."""
    ind = bundle.indicators.iloc[-1]
    close = float(bundle.prices["close"].iloc[-1])
    out = []
    for name in ("close_10_sma", "close_50_sma", "close_200_sma"):
        value = ind.get(name)
        if value is not None and not pd.isna(value) and value:
            side = "above" if close >= value else "below"
            out.append(f"close is {side} {name} by {_pct(abs(close / value - 1))}")
    rsi = ind.get("rsi_14")
    if rsi is not None and not pd.isna(rsi):
        zone = "overbought (>70)" if rsi > 70 else "oversold (<30)" if rsi < 30 else "neutral"
        out.append(f"RSI {zone}")
    macd, signal = ind.get("macd"), ind.get("macds")
    if macd is not None and signal is not None and not (pd.isna(macd) or pd.isna(signal)):
        out.append(f"MACD {'above' if macd >= signal else 'below'} its signal line")
    upper, lower = ind.get("boll_ub"), ind.get("boll_lb")
    if (upper is not None and lower is not None and not (pd.isna(upper) or pd.isna(lower))
            and upper > lower):
        out.append(f"close at {(close - lower) / (upper - lower) * 100:.0f}% "
                   "of the Bollinger band")
    return [f"Readings: {'; '.join(out)}."] if out else []


def _trend(earlier: float, latest: float) -> str:
    scale = max(abs(earlier), abs(latest), 1e-9)
    change = (latest - earlier) / scale
    return "rising" if change > 0.005 else "falling" if change < -0.005 else "flat"


def _fact(value: Any, kind: str, currency: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _clip(str(value), 200)
    if kind == "money":
        return f"{_compact(value)} {currency}".rstrip()
    if kind == "count":
        return _compact(value)
    if kind == "percent":
        return _pct(value, signed=False)
    if kind == "multiple":
        return f"{value:.2f}x"
    return f"{value:.2f}" if kind == "number" else _num(value)


def _day(stamp: Any) -> str:
    return pd.Timestamp(stamp).strftime("%Y-%m-%d")


def _price(value: float) -> str:
    return f"{float(value):.2f}"


def _num(value: Any) -> str:
    if value is None or pd.isna(value):
        return "n/a"
    value = float(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.4f}"


def _pct(value: float, signed: bool = False) -> str:
    return f"{value * 100:+.1f}%" if signed else f"{value * 100:.1f}%"


def _compact(value: float) -> str:
    value = float(value)
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= size:
            return f"{value / size:.2f}{suffix}"
    return f"{value:.0f}"


def _clip(text: str, limit: int) -> str:
    flat = " ".join(text.split())  # newlines in a post would break the one-item-per-line shape
    return flat if len(flat) <= limit else flat[: max(limit - 3, 0)] + "..."
