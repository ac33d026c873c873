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


def _split(bundle: MarketBundle, factor: float, moved: float, back: int = 5) -> MarketBundle:
    """Return ``bundle`` with a move ``back`` sessions before its end, as an unadjusted
    history shows a split: the prices after it ``factor`` times those before, the shares
    traded ``moved`` times."""
    prices = bundle.prices.copy()
    prices.iloc[:-back, :4] /= factor
    prices.iloc[:-back, 4] /= moved
    return replace(bundle, prices=prices)


@pytest.mark.parametrize(("factor", "moved", "move", "split"), [
    (0.25, 4.0, "opened at 0.249 of the close before (-75.1%)", "4-for-1"),
    (4.0, 0.25, "opened at 3.978 of the close before (+297.8%)", "1-for-4"),
    (0.1, 10.0, "opened at 0.099 of the close before (-90.1%)", "10-for-1"),
])
def test_a_move_the_size_of_a_split_is_said_to_be_one_maybe(
        bundle: MarketBundle, factor: float, moved: float, move: str, split: str) -> None:
    # A 4:1 split left in the prices read as a 75% crash, the analysts told nothing else.
    text = render_prices(_split(bundle, factor, moved))
    [note] = [line for line in text.splitlines() if line.startswith("Note:")]
    assert note.startswith(f"Note: on 2026-11-23 the price {move} and share volume moved x")
    assert f"as a {split} share split moves them. If these prices are not adjusted" in note
    assert "if no split took place, it is a real move" in note


@pytest.mark.parametrize(("factor", "moved"), [
    (0.25, 1.0),  # the volume stayed: a split of four multiplies the shares traded
    (4.0, 4.0),  # up fourfold and volume up too: a move, not a reverse split
    (0.4, 2.5),  # -60% is no split's factor (1/2 and 1/3 are 2% from it at most)
    (2 / 3, 1.5),  # a 3-for-2's third off is left out: real news makes such moves
])
def test_a_move_no_split_makes_has_no_note(bundle: MarketBundle, factor: float,
                                           moved: float) -> None:
    assert "Note:" not in render_prices(_split(bundle, factor, moved))
    assert "Note:" not in render_prices(bundle)
