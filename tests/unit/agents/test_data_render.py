"""Test the prompt sections: deterministic text, DEMO labels, size limits."""

from __future__ import annotations

from dataclasses import replace
from datetime import date

import pandas as pd
import pytest

from agents.data.base import MarketBundle, NewsItem, SocialPost
from agents.data.demo import DEMO_AS_OF, DemoProvider
from agents.data.render import (
    render_fundamentals,
    render_indicators,
    render_news,
    render_prices,
    render_social,
)

RENDERERS = [render_prices, render_indicators, render_fundamentals, render_news, render_social]


@pytest.fixture(scope="module")
def bundle() -> MarketBundle:
    return DemoProvider().load("ALPH.DEMO", DEMO_AS_OF)


@pytest.mark.parametrize("render", RENDERERS)
def test_same_input_same_bytes(bundle: MarketBundle, render) -> None:
    again = DemoProvider().load("ALPH.DEMO", DEMO_AS_OF)
    assert render(bundle) == render(again)
    assert render(bundle).endswith("\n")


@pytest.mark.parametrize("render", RENDERERS)
def test_demo_is_labelled(bundle: MarketBundle, render) -> None:
    assert render(bundle).splitlines()[0].startswith("Source: DEMO data (synthetic")
    real = replace(bundle, demo=False, source="yfinance")
    assert render(real).splitlines()[0] == "Source: yfinance"


def test_prices_table_size(bundle: MarketBundle) -> None:
    text = render_prices(bundle, max_rows=20)
    assert "last 20 of 240 sessions" in text
    assert "2026-11-27" in text and "Summary: last close" in text
    small = render_prices(bundle, max_rows=3)
    assert len(small) < len(text)
    assert sum(line[:4].isdigit() for line in small.splitlines()) == 3


def test_indicators_list_every_column(bundle: MarketBundle) -> None:
    text = render_indicators(bundle, max_rows=0)
    for name in bundle.indicators.columns:
        assert f"- {name}: " in text
    assert "Readings:" in text and "Last " not in text
    assert "Last 5 sessions" in render_indicators(bundle)


def test_fundamentals_formatting(bundle: MarketBundle) -> None:
    text = render_fundamentals(bundle)
    assert "(DEMO Alpha Corp)" in text and "- market cap: " in text and "B USD" in text
    odd = replace(bundle, fundamentals={"zeta": 1.5, "pe_ratio": None, "alpha_note": "x"})
    assert render_fundamentals(odd).splitlines()[2:] == [
        "- P/E (trailing): n/a", "- alpha note: x", "- zeta: 1.50"]


def test_news_and_social_limits() -> None:
    news = [NewsItem(date(2026, 11, d), "Wire", f"headline {d}") for d in (3, 9, 5)]
    posts = [SocialPost(date(2026, 11, 2), "me", "line one\nline two " + "x" * 300, 4)]
    bundle = MarketBundle("EXMP", date(2026, 11, 27), pd.DataFrame(), pd.DataFrame(), {},
                          news=news, social=posts, source="snapshot")
    text = render_news(bundle, max_items=2)
    assert text.splitlines()[2:] == ["- 2026-11-09 [Wire] headline 9",
                                     "- 2026-11-05 [Wire] headline 5"]
    social = render_social(bundle, max_chars=40)
    assert "line one line two" in social and social.splitlines()[2].endswith("...")
    empty = replace(bundle, news=[], social=[])
    assert "No headlines." in render_news(empty) and "No posts." in render_social(empty)
