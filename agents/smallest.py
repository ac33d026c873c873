"""Render the prompts a ticker's run sends, each at its smallest: what must fit the server.

agents/fitting.py leaves out a prompt's droppable parts until it fits; what it cannot leave
out (the node's instructions, the market data, earlier nodes' reports and plans) must fit
the server's context with the node's output budget, or the node fails. ``smallest_prompts``
runs the pipeline against a stand-in client that sends nothing: every prompt "does not fit",
so ``fit`` leaves out all it may, and every reply is a marker, so a prompt's markers say
which earlier outputs it carries. Their real length is the caller's to bound (their
max_tokens, or what a previous night's outputs came to). Not rendered: a decision's re-ask,
which adds its correction (a few dozen tokens) to the portfolio manager's prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from langgraph.runtime import Runtime

from agents.chat import CallTag, ChatResult
from agents.config import PipelineConfig
from agents.data.base import MarketBundle
from agents.fitting import Messages, Prompt
from agents.graph import NODE_KINDS, analyze_ticker
from agents.nodes import ANALYSTS
from agents.state import RunContext, TickerState

# The reply the stand-in gives the portfolio manager: valid, so no re-ask is made (and logged).
_DECISION = json.dumps({"rating": "Hold", "score": 0.0, "confidence": 0.5, "summary": "-"})


@dataclass(frozen=True)
class SmallestPrompt:
    """One node's prompt with everything droppable left out."""

    node: str
    ticker: str
    messages: Messages
    max_tokens: int
    carries: tuple[str, ...]
    """The nodes whose outputs the prompt holds (each as its ``marker``, not its text)."""


def marker(node: str) -> str:
    """Return the stand-in for ``node``'s output in later prompts."""
    return f"<{node} output>"


class _Probe:
    """A ChatClient that sends nothing: no prompt fits, so each goes with every droppable
    unit left out (as ``fit`` leaves them where none fits); each reply is its node's marker."""

    def __init__(self) -> None:
        self.asked: list[SmallestPrompt] = []

    async def chat(self, tag: CallTag, prompt: Prompt, *, max_tokens: int,
                   response_format: dict[str, Any] | None = None) -> ChatResult:
        messages = prompt.render(len(prompt.units))
        text = "\n".join(m["content"] for m in messages)
        carries = tuple(node for node in _seen(self.asked) if marker(node) in text)
        self.asked.append(SmallestPrompt(tag.node, tag.ticker, messages, max_tokens, carries))
        content = _DECISION if response_format is not None else marker(tag.node)
        return ChatResult(content=content, prompt_tokens=0, completion_tokens=0,
                          cached_tokens=None, finish_reason="stop", request_id=None)


def _seen(asked: list[SmallestPrompt]) -> list[str]:
    return list(dict.fromkeys(p.node for p in asked))


async def smallest_prompts(config: PipelineConfig, bundles: list[MarketBundle]
                           ) -> list[SmallestPrompt]:
    """Return the analysts' smallest prompts for every bundle, and the chain's for the first
    whose prompts render. A bundle whose prompts fail to render is left out: at night its
    ticker fails alone, as any node's error fails only its ticker.

    The nodes after the analysts see a ticker's data only as its symbol, date and source,
    so one ticker's chain stands for all (the caller bounds the outputs they carry).
    """
    probe = _Probe()
    chain = False
    for bundle in bundles:
        before = len(probe.asked)
        try:
            if not chain:
                await analyze_ticker(llm=probe, config=config, batch_id=0, bundle=bundle)
                chain = True
                continue
            runtime = Runtime(context=RunContext(llm=probe, config=config, batch_id=0,
                                                 bundle=bundle))
            state = TickerState(ticker=bundle.ticker, as_of=bundle.as_of, sample=0)
            for kind in ANALYSTS:
                await NODE_KINDS[kind](state, runtime)
        except Exception:  # one ticker's data never stops the night's check of the others
            del probe.asked[before:]
    return probe.asked
