"""Build the per-ticker LangGraph pipeline from its config and run it for one ticker and sample."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from itertools import pairwise
from typing import Any

import structlog
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Durability

from agents import nodes
from agents.chat import ChatClient
from agents.config import PipelineConfig
from agents.data.base import MarketBundle
from agents.decision import Decision
from agents.errors import CheckpointError
from agents.nodes import ANALYSTS, DEBATERS, RISK_ANALYSTS, round_node
from agents.state import NodeOutput, RunContext, TickerInput, TickerState, Turn

Graph = CompiledStateGraph[TickerState, RunContext, TickerInput, TickerState]

# The classes a checkpoint of TickerState holds: what a checkpointer may deserialize.
STATE_TYPES: tuple[type, ...] = (Turn, NodeOutput, Decision)


# One plain async function per node kind; rounds reuse the function under another name.
NODE_KINDS = {
    "market": nodes.market,
    "sentiment": nodes.sentiment,
    "news": nodes.news,
    "fundamentals": nodes.fundamentals,
    "bull": nodes.bull,
    "bear": nodes.bear,
    "research_manager": nodes.research_manager,
    "trader": nodes.trader,
    "aggressive": nodes.aggressive,
    "conservative": nodes.conservative,
    "neutral": nodes.neutral,
    "portfolio_manager": nodes.portfolio_manager,
}


@dataclass(frozen=True)
class TickerResult:
    """One ticker's finished run: the validated decision and every node's output."""

    ticker: str
    as_of: date
    sample: int
    decision: Decision
    outputs: dict[str, NodeOutput]  # keyed by node name, in dependency order


def debate_nodes(rounds: int) -> list[str]:
    """Return bull_r1, bear_r1, bull_r2, ... for the given number of rounds."""
    return [round_node(kind, r) for r in range(1, rounds + 1) for kind in DEBATERS]


def risk_nodes(rounds: int) -> list[str]:
    """Return aggressive_r1, conservative_r1, neutral_r1, aggressive_r2, ... for ``rounds``."""
    return [round_node(kind, r) for r in range(1, rounds + 1) for kind in RISK_ANALYSTS]


def kind_of(node: str) -> str:
    """Return a node's kind: ``bull_r2`` -> ``bull``; a node without rounds is its own kind."""
    base, _, suffix = node.rpartition("_r")
    return base if base and suffix.isdigit() else node


def node_names(config: PipelineConfig) -> list[str]:
    """Return every LLM-calling node in dependency order: 4 + 2*debate + 2 + 3*risk + 1."""
    return [*ANALYSTS, *sequential_nodes(config.debate_rounds, config.risk_rounds)]


def chain_length(config: PipelineConfig) -> int:
    """Return how many calls of one sample go one after another: the analysts, then the rest."""
    return 1 + len(sequential_nodes(config.debate_rounds, config.risk_rounds))


def sequential_nodes(debate_rounds: int, risk_rounds: int) -> list[str]:
    """Return the nodes after the analysts, one after another."""
    return [*debate_nodes(debate_rounds), "research_manager", "trader",
            *risk_nodes(risk_rounds), "portfolio_manager"]


@lru_cache(maxsize=8)
def build_graph(debate_rounds: int, risk_rounds: int) -> Graph:
    """Compile the pipeline for the given rounds (compiled once per shape, then reused)."""
    graph = StateGraph(TickerState, context_schema=RunContext, input_schema=TickerInput,
                       output_schema=TickerState)

    # The four analysts fan out from START and run in parallel.
    for kind in ANALYSTS:
        graph.add_node(kind, NODE_KINDS[kind])
        graph.add_edge(START, kind)

    # Everything after them is one sequential chain; a list edge joins the analysts.
    chain = sequential_nodes(debate_rounds, risk_rounds)
    for name in chain:
        graph.add_node(name, NODE_KINDS[kind_of(name)])
    graph.add_edge(list(ANALYSTS), chain[0])
    for before, after in pairwise(chain):
        graph.add_edge(before, after)
    graph.add_edge(chain[-1], END)

    return graph.compile(name=f"ticker-d{debate_rounds}-r{risk_rounds}")


def thread_id(batch_id: int, ticker: str, sample: int) -> str:
    """Name the checkpoint thread of one (batch, ticker, sample): one graph run, resumable."""
    return f"nightdesk:{batch_id}:{ticker}:{sample}"


async def analyze_ticker(
    *,
    llm: ChatClient,
    config: PipelineConfig,
    batch_id: int,
    bundle: MarketBundle,
    sample: int = 0,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    durability: Durability = "sync",
) -> TickerResult:
    """Run the whole pipeline for one ticker and sample; raise on any failed call or decision.

    With a ``checkpointer`` every finished node is stored under the run's thread
    (``thread_id``) before the next starts (``durability="sync"``), and a thread stored
    already continues after its last finished node: a node whose writes were stored is not
    called again, also when its step's checkpoint was not stored yet. A stored thread that
    cannot be continued raises CheckpointError.
    """
    graph = build_graph(config.debate_rounds, config.risk_rounds)
    names = node_names(config)
    context = RunContext(llm=llm, config=config, batch_id=batch_id, bundle=bundle)
    start: TickerInput | None = TickerInput(ticker=bundle.ticker, as_of=bundle.as_of,
                                            sample=sample)
    # One super-step per sequential node, plus the parallel analysts' step and some slack.
    run_config: RunnableConfig = {"recursion_limit": len(names) + 8}
    with structlog.contextvars.bound_contextvars(ticker=bundle.ticker, sample=sample):
        if checkpointer is None:
            final = await graph.ainvoke(start, run_config, context=context)
        else:
            graph = graph.copy(update={"checkpointer": checkpointer})
            run_config["configurable"] = {
                "thread_id": thread_id(batch_id, bundle.ticker, sample)}
            stored = await graph.aget_state(run_config)
            if stored.values and not stored.tasks:
                final = stored.values  # finished before a crash, not yet stored as a result
            else:
                if stored.tasks:
                    # A thread stored already: continue it. ``next`` leaves out the tasks
                    # whose writes were stored before their step's checkpoint was (a kill in
                    # between); None applies those writes without running their nodes again
                    # and runs the rest.
                    start = None
                    structlog.get_logger(__name__).info(
                        "resuming ticker", next=list(stored.next),
                        done=sorted(stored.values.get("outputs", {})))
                final = await graph.ainvoke(start, run_config, context=context,
                                            durability=durability)
    return finished(final, names, bundle.ticker, bundle.as_of, sample)


def finished(final: dict[str, Any], names: list[str], ticker: str, as_of: date,
             sample: int) -> TickerResult:
    """Return the result of a run that ended; raise CheckpointError when it lacks a part.

    A graph run that ends has every node's output and the decision; one that does not came
    from a stored thread that cannot be continued, and is said so rather than a KeyError.
    """
    outputs: dict[str, NodeOutput] = final.get("outputs", {})
    missing = [name for name in names if name not in outputs]
    decision = final.get("decision")
    if missing or not isinstance(decision, Decision):
        lacks = ", ".join([*missing, *([] if isinstance(decision, Decision) else ["decision"])])
        raise CheckpointError(
            f"{ticker}: the stored run of sample {sample} ended without {lacks}; it cannot be "
            f"continued: `nightdesk rerun {ticker}` runs the ticker afresh")
    return TickerResult(ticker=ticker, as_of=as_of, sample=sample,
                        decision=decision, outputs={name: outputs[name] for name in names})
