"""Check the prompt files: strict rendering and a shared, byte-identical context prefix."""

from __future__ import annotations

from typing import Any

import pytest
from jinja2 import UndefinedError

from agents.decision import RATINGS
from agents.prompting import PROMPTS, build_messages, render, system_message

KINDS = ["market", "sentiment", "news", "fundamentals", "bull", "bear", "research_manager",
         "trader", "aggressive", "conservative", "neutral", "portfolio_manager"]
TURNS = [{"title": "Bull researcher, round 1", "text": "Up."},
         {"title": "Bear researcher, round 1", "text": "Down."}]
VARIABLES: dict[str, dict[str, Any]] = {
    "market": {"prices": "PRICES", "indicators": "INDICATORS"},
    "sentiment": {"social": "POSTS"},
    "news": {"news": "HEADLINES"},
    "fundamentals": {"fundamentals": "FIGURES"},
    "bull": {"history": TURNS, "round": 2, "rounds": 2},
    "bear": {"history": [], "round": 1, "rounds": 2},
    "research_manager": {"history": TURNS},
    "trader": {"investment_plan": "PLAN"},
    "aggressive": {"trader_plan": "PROPOSAL", "history": [], "round": 1, "rounds": 2},
    "conservative": {"trader_plan": "PROPOSAL", "history": TURNS, "round": 1, "rounds": 2},
    "neutral": {"trader_plan": "PROPOSAL", "history": TURNS, "round": 2, "rounds": 2},
    "portfolio_manager": {"trader_plan": "PROPOSAL", "history": TURNS,
                          "investment_plan": "PLAN", "ratings": RATINGS, "bands": "BANDS",
                          "summary_max_chars": 500},
}


def context(reports: bool = True) -> dict[str, Any]:
    titles = ["Market", "Sentiment", "News", "Fundamentals"]
    return {
        "ticker": "ACME", "as_of": "2024-06-28", "source": "Source: DEMO data",
        "reports": [{"title": f"{t} report", "text": f"{t} text"} for t in titles] if reports
        else [],
    }


def test_every_node_kind_has_one_prompt_file() -> None:
    files = {p.stem for p in PROMPTS.glob("*.j2") if not p.stem.startswith("_")}
    assert set(KINDS) <= files


@pytest.mark.parametrize("kind", KINDS)
def test_each_prompt_renders_with_its_variables(kind: str) -> None:
    messages = build_messages(kind, context(reports=kind not in KINDS[:4]), **VARIABLES[kind])
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == system_message()
    assert "{{" not in messages[1]["content"] and "{%" not in messages[1]["content"]
    for value in VARIABLES[kind].values():
        if isinstance(value, str):
            assert value in messages[1]["content"]


def test_downstream_prompts_open_with_the_same_context() -> None:
    shared = render("_context.j2", **context())
    users = [build_messages(k, context(), **VARIABLES[k])[1]["content"] for k in KINDS[4:]]
    for user in users:
        assert user.startswith(shared + "\n\n")
    # The reports come in the fixed order, after instrument and date.
    assert shared.index("Market text") < shared.index("Sentiment text") \
        < shared.index("News text") < shared.index("Fundamentals text")
    assert shared.startswith("# Instrument: ACME\nAs-of date: 2024-06-28.")


def test_analysts_get_header_then_data_then_instructions() -> None:
    user = build_messages("news", context(reports=False), news="HEADLINES")[1]["content"]
    assert user.startswith(render("_context.j2", **context(reports=False)))
    assert "Analyst reports" not in user
    assert user.index("HEADLINES") < user.index("Your task: news analyst")


def test_missing_variable_raises() -> None:
    with pytest.raises(UndefinedError):
        render("trader.j2", ticker="ACME")  # no investment_plan
    incomplete = context()
    del incomplete["as_of"]
    with pytest.raises(UndefinedError):
        build_messages("trader", incomplete, investment_plan="PLAN")
    with pytest.raises(UndefinedError):
        build_messages("bull", context(), history=[], round=1)  # no rounds


def test_rendering_is_deterministic() -> None:
    first = build_messages("portfolio_manager", context(), **VARIABLES["portfolio_manager"])
    again = build_messages("portfolio_manager", context(), **VARIABLES["portfolio_manager"])
    assert first == again
    assert '"Buy", "Overweight", "Hold", "Underweight", "Sell"' in first[1]["content"]


def test_a_prompt_once_read_renders_while_its_file_is_away(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Once read, a prompt no longer depends on its file: a file away for a moment (every
    # check of it failing) changes nothing.
    first = system_message()
    monkeypatch.setattr("jinja2.loaders.os.path.isfile", lambda _: False)
    monkeypatch.setattr("jinja2.loaders.os.path.getmtime", lambda _: 0.0)
    assert system_message() == first
