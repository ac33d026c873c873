"""Declare what flows through the per-ticker graph: its input, its state and its run context."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from datetime import date
from typing import Annotated, TypedDict, TypeVar

# Imported at run time, not under TYPE_CHECKING: LangGraph resolves the state's type hints.
from agents.chat import ChatClient
from agents.config import PipelineConfig
from agents.data.base import MarketBundle
from agents.decision import Decision

V = TypeVar("V")


def merge(left: dict[str, V], right: dict[str, V]) -> dict[str, V]:
    """Merge two partial maps; the four analysts write to the same keys in one step."""
    return {**left, **right}


@dataclass(frozen=True)
class Turn:
    """One spoken turn of a debate (bull/bear) or of the risk discussion."""

    node: str  # e.g. "bear_r2": unique within a ticker and sample
    kind: str  # e.g. "bear": which role spoke
    round: int  # 1-based round number
    text: str


@dataclass(frozen=True)
class NodeOutput:
    """What one node's LLM call produced, with the server's usage for that call."""

    node: str
    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    finish_reason: str | None
    attempts: int  # HTTP attempts the node used, validation retries of the decision included


class TickerInput(TypedDict):
    """Start one ticker's run: the only keys a caller passes in."""

    ticker: str
    """Upper-case symbol, already validated by the caller."""
    as_of: date
    """The analysis date; no data after it is shown to any node."""
    sample: int
    """Index of this independent sample of the same ticker (0 for the first)."""


class TickerState(TickerInput, total=False):
    """Hold everything the nodes have written so far for one ticker and sample."""

    reports: Annotated[dict[str, str], merge]
    """Analyst reports by kind (market, sentiment, news, fundamentals); written in parallel."""
    debate: Annotated[list[Turn], operator.add]
    """Bull/bear turns in the order spoken; each researcher node appends one."""
    investment_plan: str
    """The research manager's plan, the judgment of the debate."""
    trader_plan: str
    """The trader's concrete proposal built on the plan."""
    risk_debate: Annotated[list[Turn], operator.add]
    """Aggressive/conservative/neutral turns in the order spoken."""
    decision: Decision
    """The portfolio manager's validated structured decision."""
    outputs: Annotated[dict[str, NodeOutput], merge]
    """Every node's raw output and usage, keyed by node name."""


@dataclass(frozen=True)
class RunContext:
    """Carry a run's dependencies to the nodes through LangGraph's runtime context, not a global."""

    llm: ChatClient
    config: PipelineConfig
    batch_id: int
    bundle: MarketBundle
