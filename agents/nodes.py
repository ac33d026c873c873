"""Define the pipeline's nodes: plain async functions of (state, runtime), one LLM call each.

A node reads its dependencies (client, config, bundle) from ``runtime.context`` and
returns a partial state update. Debate and risk nodes work out their round from the
history already in the state, so one function serves every round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

import structlog
from langgraph.runtime import Runtime

from agents.chat import CallTag, ChatResult
from agents.data import render
from agents.decision import RATINGS, SUMMARY_MAX_CHARS, bands_text, decide
from agents.fitting import DEBATE_TURN, NEWS_ITEM, SOCIAL_POST, Prompt, Render, droppable, left_out
from agents.prompting import build_messages
from agents.state import NodeOutput, RunContext, TickerState, Turn

# Fixed order: the shared context lists the reports in it, byte-identical in every prompt.
ANALYSTS: tuple[str, ...] = ("market", "sentiment", "news", "fundamentals")
DEBATERS: tuple[str, ...] = ("bull", "bear")
RISK_ANALYSTS: tuple[str, ...] = ("aggressive", "conservative", "neutral")

TITLES: dict[str, str] = {
    "market": "Market analyst",
    "sentiment": "Social sentiment analyst",
    "news": "News analyst",
    "fundamentals": "Fundamentals analyst",
    "bull": "Bull researcher",
    "bear": "Bear researcher",
    "aggressive": "Aggressive risk analyst",
    "conservative": "Conservative risk analyst",
    "neutral": "Neutral risk analyst",
}

Update = dict[str, Any]

# News items and social posts shown to their analyst at most (render's default as well).
SHOWN_ITEMS = 10


def round_node(kind: str, round_: int) -> str:
    """Name a debating node for one round, e.g. ``bull_r2``; also its ``llm_calls.node``."""
    return f"{kind}_r{round_}"


class Report(TypedDict):
    title: str
    text: str


class SharedContext(TypedDict):
    """The variables of the shared context template (``_context.j2``)."""

    ticker: str
    as_of: str  # ISO date
    source: str  # names DEMO data
    reports: list[Report]  # the four analysts' reports, in order; empty for the analysts


def shared_context(state: TickerState, runtime: Runtime[RunContext], *,
                   with_reports: bool) -> SharedContext:
    """Return the shared context variables; downstream nodes get all four reports, in order."""
    bundle = runtime.context.bundle
    reports: list[Report] = []
    if with_reports:
        reports = [Report(title=TITLES[kind] + " report", text=state["reports"][kind].strip())
                   for kind in ANALYSTS]
    return SharedContext(ticker=state["ticker"], as_of=state["as_of"].isoformat(),
                         source=render.source_line(bundle), reports=reports)


def _output(node: str, result: ChatResult, attempts: int | None = None) -> NodeOutput:
    return NodeOutput(
        node=node, text=result.content, prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens, cached_tokens=result.cached_tokens,
        finish_reason=result.finish_reason, attempts=attempts or result.attempts,
    )


def _tag(state: TickerState, runtime: Runtime[RunContext], node: str) -> CallTag:
    return CallTag(batch_id=runtime.context.batch_id, ticker=state["ticker"], node=node,
                   sample=state["sample"])


async def _ask(state: TickerState, runtime: Runtime[RunContext], node: str, group: str,
               render_with: Render, units: list[str]) -> ChatResult:
    """Ask the client for the prompt with its group's token budget: one call, which fits it
    (agents.fitting) and sends it."""
    ctx = runtime.context
    with structlog.contextvars.bound_contextvars(ticker=state["ticker"], node=node):
        return await ctx.llm.chat(_tag(state, runtime, node), Prompt(render_with, units),
                                  max_tokens=ctx.config.node_max_tokens[group])


def _turns(history: list[Turn], drop: int = 0) -> list[dict[str, str]]:
    """Return the turns for a template, the oldest ``drop`` left out and said so."""
    shown = [{"title": f"{TITLES[t.kind]}, round {t.round}", "text": t.text.strip()}
             for t in history[drop:]]
    if drop:
        note = (f"({drop} earlier turn{'s' if drop != 1 else ''} left out to fit the model's "
                "context.)")
        shown.insert(0, {"title": "Earlier turns", "text": note})
    return shown


# --- analysts -----------------------------------------------------------------------------


async def _analyst(kind: str, state: TickerState, runtime: Runtime[RunContext],
                   data: Callable[[int], dict[str, str]], units: list[str]) -> Update:
    """Ask one analyst; ``data(k)`` renders its sections with the first k units left out."""
    context = shared_context(state, runtime, with_reports=False)

    def messages(k: int) -> list[dict[str, str]]:
        sections = {name: text.strip() for name, text in data(k).items()}
        return build_messages(kind, context, **sections)

    result = await _ask(state, runtime, kind, "analyst", messages, units)
    return {"reports": {kind: result.content}, "outputs": {kind: _output(kind, result)}}


async def market(state: TickerState, runtime: Runtime[RunContext]) -> Update:
    """Write the technical report from prices and indicators."""
    bundle = runtime.context.bundle
    sections = {"prices": render.render_prices(bundle),
                "indicators": render.render_indicators(bundle)}
    return await _analyst("market", state, runtime, lambda _: sections, [])


async def sentiment(state: TickerState, runtime: Runtime[RunContext]) -> Update:
    """Write the social-sentiment report from social posts."""
    bundle = runtime.context.bundle
    shown = min(SHOWN_ITEMS, len(bundle.social))
    units = droppable(social=shown)
    return await _analyst("sentiment", state, runtime, lambda k: {"social": render.render_social(
        bundle, max_items=shown - left_out(units, k, SOCIAL_POST))}, units)


async def news(state: TickerState, runtime: Runtime[RunContext]) -> Update:
    """Write the news report from headlines."""
    bundle = runtime.context.bundle
    shown = min(SHOWN_ITEMS, len(bundle.news))
    units = droppable(news=shown)
    return await _analyst("news", state, runtime, lambda k: {"news": render.render_news(
        bundle, max_items=shown - left_out(units, k, NEWS_ITEM))}, units)


async def fundamentals(state: TickerState, runtime: Runtime[RunContext]) -> Update:
    """Write the fundamentals report from the company's figures."""
    sections = {"fundamentals": render.render_fundamentals(runtime.context.bundle)}
    return await _analyst("fundamentals", state, runtime, lambda _: sections, [])


# --- researchers --------------------------------------------------------------------------


async def _debater(kind: str, state: TickerState, runtime: Runtime[RunContext]) -> Update:
    history = state.get("debate", [])
    round_ = 1 + sum(1 for t in history if t.kind == kind)
    node = round_node(kind, round_)
    context = shared_context(state, runtime, with_reports=True)
    units = droppable(turns=len(history))
    result = await _ask(state, runtime, node, "researcher", lambda k: build_messages(
        kind, context, history=_turns(history, left_out(units, k, DEBATE_TURN)), round=round_,
        rounds=runtime.context.config.debate_rounds), units)
    turn = Turn(node=node, kind=kind, round=round_, text=result.content)
    return {"debate": [turn], "outputs": {node: _output(node, result)}}


async def bull(state: TickerState, runtime: Runtime[RunContext]) -> Update:
    """Argue for the stock, answering the bear's last turn."""
    return await _debater("bull", state, runtime)


async def bear(state: TickerState, runtime: Runtime[RunContext]) -> Update:
    """Argue against the stock, answering the bull's last turn."""
    return await _debater("bear", state, runtime)


async def research_manager(state: TickerState, runtime: Runtime[RunContext]) -> Update:
    """Judge the debate and write the investment plan."""
    node = "research_manager"
    context = shared_context(state, runtime, with_reports=True)
    history = state["debate"]
    units = droppable(turns=len(history))
    result = await _ask(state, runtime, node, "research_manager", lambda k: build_messages(
        node, context, history=_turns(history, left_out(units, k, DEBATE_TURN))), units)
    return {"investment_plan": result.content, "outputs": {node: _output(node, result)}}


async def trader(state: TickerState, runtime: Runtime[RunContext]) -> Update:
    """Turn the investment plan into a concrete trading proposal."""
    node = "trader"
    messages = build_messages(node, shared_context(state, runtime, with_reports=True),
                              investment_plan=state["investment_plan"].strip())
    result = await _ask(state, runtime, node, "trader", lambda _: messages, [])
    return {"trader_plan": result.content, "outputs": {node: _output(node, result)}}


# --- risk ---------------------------------------------------------------------------------


async def _risk(kind: str, state: TickerState, runtime: Runtime[RunContext]) -> Update:
    history = state.get("risk_debate", [])
    round_ = 1 + sum(1 for t in history if t.kind == kind)
    node = round_node(kind, round_)
    context = shared_context(state, runtime, with_reports=True)
    units = droppable(turns=len(history))
    result = await _ask(state, runtime, node, "risk", lambda k: build_messages(
        kind, context, trader_plan=state["trader_plan"].strip(),
        history=_turns(history, left_out(units, k, DEBATE_TURN)), round=round_,
        rounds=runtime.context.config.risk_rounds), units)
    turn = Turn(node=node, kind=kind, round=round_, text=result.content)
    return {"risk_debate": [turn], "outputs": {node: _output(node, result)}}


async def aggressive(state: TickerState, runtime: Runtime[RunContext]) -> Update:
    """Argue for bolder positioning on the trader's proposal."""
    return await _risk("aggressive", state, runtime)


async def conservative(state: TickerState, runtime: Runtime[RunContext]) -> Update:
    """Argue for protecting capital on the trader's proposal."""
    return await _risk("conservative", state, runtime)


async def neutral(state: TickerState, runtime: Runtime[RunContext]) -> Update:
    """Argue for a balanced position on the trader's proposal."""
    return await _risk("neutral", state, runtime)


async def portfolio_manager(state: TickerState, runtime: Runtime[RunContext]) -> Update:
    """Make the final call as server-enforced structured output, validated with retries."""
    node = "portfolio_manager"
    ctx = runtime.context
    context = shared_context(state, runtime, with_reports=True)
    history = state["risk_debate"]
    units = droppable(turns=len(history))
    max_tokens = ctx.config.node_max_tokens["portfolio_manager"]

    def render_with(k: int) -> list[dict[str, str]]:
        return build_messages(node, context, trader_plan=state["trader_plan"].strip(),
                              history=_turns(history, left_out(units, k, DEBATE_TURN)),
                              investment_plan=state["investment_plan"].strip(), ratings=RATINGS,
                              bands=bands_text(), summary_max_chars=SUMMARY_MAX_CHARS)

    with structlog.contextvars.bound_contextvars(ticker=state["ticker"], node=node):
        # Every call decide makes is fitted, a re-ask as well as the first (agents.fitting).
        decision, result, attempts = await decide(
            ctx.llm, _tag(state, runtime, node), render_with, units, max_tokens=max_tokens,
            attempts=ctx.config.decision_attempts,
        )
    return {"decision": decision, "outputs": {node: _output(node, result, attempts)}}
