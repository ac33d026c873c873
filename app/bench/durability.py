"""Measure what a checkpointed node costs under each LangGraph durability mode.

The pipeline runs with an instant in-process LLM (no server, no network), so what is left of
each node's time is the graph's own work plus the checkpointer's writes: the figure
``nightdesk`` pays per node for resume. ``"sync"`` stores a node's checkpoint before the
next node starts (a kill loses at most the node in flight); ``"async"`` stores it while the
next node runs; ``"exit"`` only when the run ends (a kill loses the whole sample's run).
``none`` is the graph without a checkpointer, the baseline.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agents.chat import CallTag, ChatResult
from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from agents.data.snapshot import SnapshotProvider
from agents.decision import Decision
from agents.fitting import Prompt
from agents.graph import analyze_ticker, node_names, thread_id
from app.bench.machine import machine_facts
from app.config import Settings
from app.db.engine import check_reachable, make_engine
from app.runs.checkpoints import open_checkpointer

MODES = ("none", "exit", "async", "sync")
DECISION = Decision(rating="Hold", score=0.0, confidence=0.5, summary="bench").model_dump_json()


class InstantLLM:
    """Answer every call at once, with a reply of a realistic size (what checkpoints hold)."""

    def __init__(self, reply_chars: int) -> None:
        self.reply = ("word " * (reply_chars // 5 + 1))[:reply_chars]

    async def chat(self, tag: CallTag, prompt: Prompt, *, max_tokens: int,
                   response_format: dict[str, Any] | None = None) -> ChatResult:
        prompt.render(0)  # rendered as a client that cannot count sends it: part of the node
        content = DECISION if response_format is not None else self.reply
        return ChatResult(content, 100, len(content) // 4, 0, "stop", "bench")


@dataclass
class DurabilityResult:
    database: str
    runs: int
    nodes_per_run: int
    reply_chars: int
    ms_per_node: dict[str, float] = field(default_factory=dict)  # median over runs
    machine: dict[str, Any] = field(default_factory=dict)
    date: str = ""

    def added_ms(self, mode: str) -> float:
        """Return what ``mode`` adds per node over the graph without a checkpointer."""
        return self.ms_per_node[mode] - self.ms_per_node["none"]

    def to_json(self) -> dict[str, Any]:
        # Its schema, as every bench JSON's (app/bench/schedulers.py ``SCHEMA``).
        data = {"schema": "bench-durability/1", **asdict(self)}
        data["added_ms_per_node"] = {m: round(self.added_ms(m), 3) for m in MODES}
        return data


async def run_durability_bench(settings: Settings, database_url: str | None, *, runs: int,
                               reply_chars: int) -> DurabilityResult:
    """Run the pipeline ``runs`` times per mode, interleaved; report median ms per node.
    DatabaseError in one line, at once, where ``database_url`` cannot be reached: as every
    command's first read, before the checkpointer's pool would wait and retry for minutes."""
    if database_url is not None:
        engine = make_engine(database_url, settings.store.db_statement_timeout_s)
        try:
            check_reachable(engine)
        finally:
            engine.dispose()
    config = settings.pipeline()
    nodes = len(node_names(config))
    with tempfile.TemporaryDirectory() as folder:
        write_demo(Path(folder) / "data", DEMO_AS_OF, 1)
        bundle = SnapshotProvider(Path(folder) / "data").load(demo_tickers(1)[0], DEMO_AS_OF)
        url = database_url or f"sqlite:///{folder}/bench.db"
        llm = InstantLLM(reply_chars)
        timings: dict[str, list[float]] = {m: [] for m in MODES}
        async with open_checkpointer(url) as saver:
            for run in range(runs + 1):  # the first round warms caches and is not counted
                for mode in MODES:
                    started = time.perf_counter()
                    await analyze_ticker(
                        llm=llm, config=config, batch_id=10_000_000 + run, bundle=bundle,
                        sample=MODES.index(mode),
                        checkpointer=None if mode == "none" else saver,
                        durability="sync" if mode == "none" else mode)  # type: ignore[arg-type]
                    if run:
                        timings[mode].append((time.perf_counter() - started) * 1000 / nodes)
                    if mode != "none":
                        await saver.adelete_thread(thread_id(10_000_000 + run, bundle.ticker,
                                                             MODES.index(mode)))
    return DurabilityResult(
        database=url.split(":", 1)[0] if database_url else "sqlite (temporary file)",
        runs=runs, nodes_per_run=nodes, reply_chars=reply_chars,
        ms_per_node={m: round(statistics.median(t), 3) for m, t in timings.items()},
        machine=machine_facts().model_dump(), date=datetime.now(UTC).date().isoformat())


def write_json(result: DurabilityResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_json(), indent=2, default=str) + "\n")
