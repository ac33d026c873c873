"""Make the seeded DEMO market: made-up companies, synthetic prices, fundamentals and chatter.

Every number comes from a numpy Generator seeded by (DEMO_SEED, ticker index), so the same
as-of date always gives the same data and the same snapshot bytes. Each company has a hidden
quality score that tilts its fundamentals, the tone of its news and its drift *after* the
as-of date, so a pipeline that reads the evidence well can earn a positive forward RankIC.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from agents.data.base import Closes, MarketBundle, NewsItem, SocialPost, closes_of
from agents.data.freeze import write_manifest, write_ticker
from agents.data.indicators import compute_indicators
from agents.data.snapshot import Manifest, day_dir
from agents.errors import DataError, InputError

DEMO_SEED = 20261127
DEMO_AS_OF = date(2026, 11, 27)  # fixed so that `make run` is reproducible
HISTORY_DAYS = 240  # trading days up to and including the as-of date
FORWARD_DAYS = 60  # trading days after it, for scoring ratings against realized returns
DEFAULT_TICKERS = 20

# (symbol, company word); the ".DEMO" suffix keeps them from ever passing for real symbols.
COMPANIES: list[tuple[str, str]] = [
    ("ALPH.DEMO", "Alpha"), ("BRAV.DEMO", "Bravo"), ("COBL.DEMO", "Cobalt"),
    ("DELT.DEMO", "Delta"), ("EMBR.DEMO", "Ember"), ("FALC.DEMO", "Falcon"),
    ("GRAN.DEMO", "Granite"), ("HARB.DEMO", "Harbor"), ("IRIS.DEMO", "Iris"),
    ("JUNI.DEMO", "Juniper"), ("KEST.DEMO", "Kestrel"), ("LUMN.DEMO", "Lumen"),
    ("MERI.DEMO", "Meridian"), ("NIMB.DEMO", "Nimbus"), ("ORCH.DEMO", "Orchid"),
    ("PION.DEMO", "Pioneer"), ("QRTZ.DEMO", "Quartz"), ("REDW.DEMO", "Redwood"),
    ("SUMM.DEMO", "Summit"), ("TIDL.DEMO", "Tidal"), ("UMBR.DEMO", "Umber"),
    ("VERT.DEMO", "Vertex"), ("WILO.DEMO", "Willow"), ("XENO.DEMO", "Xenon"),
]
# A night has ~100 tickers: past the 24 above, two words make a company ("Alpha Bravo",
# ALBR.DEMO), in a fixed order, so the first 24 (and every snapshot made of them) never change.
# EMBR.DEMO (Ember Bravo) would be Ember's own symbol, so a pair that repeats one is skipped.
_FIRST = [word for _, word in COMPANIES]
_TAKEN = {symbol for symbol, _ in COMPANIES}
COMPANIES += [
    pair for pair in ((f"{a[:2]}{b[:2]}".upper() + ".DEMO", f"{a} {b}")
                      for a in _FIRST for b in _FIRST if a != b)
    if pair[0] not in _TAKEN
][:96]
SECTORS: list[tuple[str, str]] = [
    ("Technology", "Software"), ("Healthcare", "Biotechnology"),
    ("Financials", "Regional Banks"), ("Energy", "Oil & Gas"),
    ("Consumer", "Specialty Retail"), ("Industrials", "Machinery"),
    ("Utilities", "Electric Utilities"), ("Materials", "Chemicals"),
]
NEWS_SOURCES = ["DEMO Wire", "DEMO Markets Daily", "DEMO Business Journal"]
GOOD_NEWS = [
    "{name} beats quarterly revenue estimates on strong demand",
    "{name} raises full-year guidance",
    "{name} wins multi-year contract with a major customer",
    "Analysts upgrade {name} after investor day",
    "{name} announces share buyback program",
    "{name} expands margins as cost program takes hold",
]
BAD_NEWS = [
    "{name} misses earnings estimates as costs rise",
    "{name} cuts full-year outlook citing weak orders",
    "Regulators open inquiry into {name} accounting",
    "{name} loses key customer to a rival",
    "Analysts downgrade {name} on slowing growth",
    "{name} chief financial officer departs unexpectedly",
]
NEUTRAL_NEWS = [
    "{name} to present at industry conference next month",
    "{name} names new head of investor relations",
    "{name} completes previously announced office relocation",
    "{name} schedules quarterly results call",
]
GOOD_POSTS = [
    "${sym} looking strong into the close, adding more",
    "Bought more ${sym} today, fundamentals keep improving",
    "${sym} breakout incoming, volume confirms it",
    "Long ${sym}, the guidance raise was underrated",
]
BAD_POSTS = [
    "Sold my ${sym}, the story is not working anymore",
    "${sym} guidance looks shaky, staying away",
    "Shorting ${sym} here, too expensive for this growth",
    "${sym} keeps making lower highs, not touching it",
]
NEUTRAL_POSTS = [
    "Anyone following ${sym}? Not sure what to make of it",
    "${sym} flat again today, waiting for earnings",
    "Watching ${sym} for a better entry",
]


@dataclass(frozen=True)
class DemoCompany:
    """One made-up company and the raw data the demo generates for it."""

    ticker: str
    prices: pd.DataFrame
    """History up to the as-of date, then FORWARD_DAYS (or more) trading days after it."""
    fundamentals: dict[str, Any]
    news: list[NewsItem]
    social: list[SocialPost]


def demo_tickers(count: int = DEFAULT_TICKERS) -> list[str]:
    """Return the first ``count`` demo symbols; InputError when asked for more than exist."""
    if not 1 <= count <= len(COMPANIES):
        raise InputError(f"demo tickers must be between 1 and {len(COMPANIES)}, got {count}")
    return [symbol for symbol, _ in COMPANIES[:count]]


@lru_cache(maxsize=64)
def demo_company(ticker: str, as_of: date, forward_days: int = FORWARD_DAYS) -> DemoCompany:
    """Generate one demo company's data for ``as_of``; DataError for a non-demo symbol."""
    index = next((i for i, (symbol, _) in enumerate(COMPANIES) if symbol == ticker), None)
    if index is None:
        raise DataError(f"{ticker}: not a demo ticker (demo tickers end in .DEMO, "
                        f"e.g. {COMPANIES[0][0]})")
    # Separate streams, so asking for more forward days never changes the history or the text.
    params, walk, text, chatter = (
        np.random.default_rng(s) for s in np.random.SeedSequence([DEMO_SEED, index]).spawn(4)
    )
    quality = float(params.normal())
    vol = float(params.uniform(0.18, 0.55))
    start = float(params.uniform(15, 400))
    prices = _prices(walk, as_of, quality, vol, start, forward_days)
    close = float(prices.loc[prices.index <= pd.Timestamp(as_of), "close"].iloc[-1])
    name = f"DEMO {COMPANIES[index][1]} Corp"
    sector, industry = SECTORS[index % len(SECTORS)]
    return DemoCompany(
        ticker=ticker,
        prices=prices,
        fundamentals=_fundamentals(params, name, sector, industry, quality, vol, close),
        news=_news(text, name, as_of, quality),
        social=_social(chatter, ticker, as_of, quality),
    )


class DemoProvider:
    """Serve the seeded demo market straight from memory (no files)."""

    name = "demo"

    def load(self, ticker: str, as_of: date) -> MarketBundle:
        """Return the demo company's data up to and including ``as_of``."""
        company = demo_company(ticker, as_of)
        prices = company.prices[company.prices.index <= pd.Timestamp(as_of)]
        return MarketBundle(
            ticker=ticker,
            as_of=as_of,
            prices=prices,
            indicators=compute_indicators(prices),
            fundamentals=dict(company.fundamentals),
            news=list(company.news),
            social=list(company.social),
            demo=True,
            source="demo",
        )

    def missing(self, tickers: list[str], as_of: date) -> list[str]:
        """Return no ticker: the demo market makes up any symbol."""
        return []

    def forward_prices(self, ticker: str, as_of: date, days: int) -> pd.DataFrame:
        """Return ``days`` synthetic trading days after ``as_of``."""
        prices = demo_company(ticker, as_of, max(days, FORWARD_DAYS)).prices
        return prices[prices.index > pd.Timestamp(as_of)].head(days)

    def closes(self, ticker: str, as_of: date, days: int) -> Closes:
        """Return the close on ``as_of`` and ``days`` synthetic closes after it."""
        found = closes_of(demo_company(ticker, as_of, max(days, FORWARD_DAYS)).prices,
                          as_of, days)
        assert found is not None  # the demo history always ends on the as-of date
        return found


def write_demo(out_dir: Path, as_of: date = DEMO_AS_OF, count: int = DEFAULT_TICKERS) -> Path:
    """Write the demo snapshot for ``as_of`` under ``out_dir``; return the as-of directory.

    The manifest's created_at is the as-of date itself, so two writes are byte-identical.
    """
    tickers = demo_tickers(count)
    for ticker in tickers:
        company = demo_company(ticker, as_of)
        write_ticker(out_dir, as_of, ticker, company.prices, company.fundamentals,
                     company.news, company.social)
    write_manifest(out_dir, as_of, Manifest(
        provider="demo",
        created_at=f"{as_of.isoformat()}T00:00:00+00:00",
        demo=True,
        tickers=tickers,
    ))
    return day_dir(out_dir, as_of)


def _prices(rng: np.random.Generator, as_of: date, quality: float, vol: float, start: float,
            forward_days: int) -> pd.DataFrame:
    history = pd.bdate_range(end=as_of, periods=HISTORY_DAYS)
    forward = pd.bdate_range(start=as_of + timedelta(days=1), periods=forward_days)
    dates = history.append(forward)
    daily_vol = vol / np.sqrt(252)
    # Past drift only hints at quality; forward drift follows it more closely.
    drift = np.concatenate([
        np.full(len(history), (0.05 + 0.10 * quality) / 252),
        np.full(len(forward), (0.04 + 0.25 * quality) / 252),
    ])
    # All history draws come first, so a longer forward window leaves the history unchanged,
    # and one day's five draws are adjacent, so forward day k never depends on the window length.
    draws = np.concatenate([rng.standard_normal((len(history), 5)),
                            rng.standard_normal((len(forward), 5))]).T
    shocks, extra = draws[0], draws[1:]
    close = start * np.exp(np.cumsum(drift - daily_vol**2 / 2 + daily_vol * shocks))
    gap = np.exp(0.3 * daily_vol * extra[0])
    open_ = np.concatenate([[start], close[:-1]]) * gap
    high = np.maximum(open_, close) * np.exp(np.abs(0.5 * daily_vol * extra[1]))
    low = np.minimum(open_, close) * np.exp(-np.abs(0.5 * daily_vol * extra[2]))
    base_volume = 10 ** (5.5 + 1.5 * (start / 400))
    volume = base_volume * np.exp(0.3 * extra[3]) * (1 + 2 * np.abs(shocks))
    frame = pd.DataFrame(
        {"open": _cents(open_), "high": _cents(high), "low": _cents(low), "close": _cents(close),
         "volume": np.rint(volume)},
        index=pd.DatetimeIndex(list(dates), name="date"),  # no freq: match a read snapshot
    )
    return frame


def _cents(values: np.ndarray) -> np.ndarray:
    # Integer cents divided by 100 is the closest float to the 2-decimal price, so it writes
    # as e.g. 101.23 and reads back as the same float.
    return np.maximum(np.rint(values * 100), 1) / 100


def _fundamentals(rng: np.random.Generator, name: str, sector: str, industry: str,
                  quality: float, vol: float, close: float) -> dict[str, Any]:
    shares = float(rng.uniform(50e6, 3e9))
    market_cap = close * shares
    revenue = market_cap / float(np.exp(rng.normal(1.0, 0.5)))  # price/sales around e
    net_margin = float(np.clip(0.08 + 0.06 * quality + rng.normal(0, 0.04), -0.25, 0.40))
    eps = revenue * net_margin / shares
    return {
        "name": name,
        "sector": sector,
        "industry": industry,
        "currency": "USD",
        "market_cap": round(market_cap),
        "shares_outstanding": round(shares),
        "pe_ratio": round(close / eps, 2) if eps > 0 else None,
        "forward_pe": round(close / (eps * (1.1 + 0.1 * quality)), 2) if eps > 0 else None,
        "price_to_book": round(float(np.exp(rng.normal(1.0, 0.5))), 2),
        "revenue_ttm": round(revenue),
        "revenue_growth_yoy": round(0.06 + 0.08 * quality + float(rng.normal(0, 0.05)), 4),
        "earnings_growth_yoy": round(0.05 + 0.15 * quality + float(rng.normal(0, 0.10)), 4),
        "gross_margin": round(float(np.clip(0.45 + 0.08 * quality + rng.normal(0, 0.08),
                                            0.05, 0.9)), 4),
        "operating_margin": round(float(np.clip(net_margin * 1.35, -0.3, 0.5)), 4),
        "net_margin": round(net_margin, 4),
        "debt_to_equity": round(float(np.exp(rng.normal(-0.3 - 0.3 * quality, 0.5))), 2),
        "return_on_equity": round(float(0.10 + 0.07 * quality + rng.normal(0, 0.04)), 4),
        "free_cash_flow": round(revenue * (net_margin + float(rng.normal(0.02, 0.03)))),
        "dividend_yield": round(float(max(rng.normal(0.012, 0.012), 0.0)), 4),
        "beta": round(vol / 0.30 * float(rng.uniform(0.7, 1.1)), 2),
    }


def _tone(rng: np.random.Generator, quality: float) -> int:
    """Return +1, 0 or -1; better companies get more good news, but not only good news."""
    draw = 0.8 * quality + float(rng.normal())
    return 1 if draw > 0.5 else -1 if draw < -0.5 else 0


def _news(rng: np.random.Generator, name: str, as_of: date, quality: float) -> list[NewsItem]:
    items = []
    for _ in range(int(rng.integers(5, 11))):
        tone = _tone(rng, quality)
        pool = GOOD_NEWS if tone > 0 else BAD_NEWS if tone < 0 else NEUTRAL_NEWS
        items.append(NewsItem(
            published=as_of - timedelta(days=int(rng.integers(0, 30))),
            source=NEWS_SOURCES[int(rng.integers(len(NEWS_SOURCES)))],
            headline=pool[int(rng.integers(len(pool)))].format(name=name),
        ))
    return sorted(items, key=lambda n: n.published, reverse=True)


def _social(rng: np.random.Generator, ticker: str, as_of: date,
            quality: float) -> list[SocialPost]:
    symbol = ticker.removesuffix(".DEMO")
    posts = []
    for _ in range(int(rng.integers(5, 11))):
        tone = _tone(rng, quality)
        pool = GOOD_POSTS if tone > 0 else BAD_POSTS if tone < 0 else NEUTRAL_POSTS
        posts.append(SocialPost(
            posted=as_of - timedelta(days=int(rng.integers(0, 14))),
            author=f"demo_user_{int(rng.integers(100, 1000))}",
            text=pool[int(rng.integers(len(pool)))].replace("{sym}", symbol),
            likes=int(rng.geometric(0.05)),
        ))
    return sorted(posts, key=lambda p: p.posted, reverse=True)
