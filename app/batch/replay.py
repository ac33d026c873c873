"""Replay a recorded batch's frozen requests against a server, as a batch of kind ``replay``."""

from __future__ import annotations

from sqlalchemy import Engine

from app.batch.engine import BatchEngine, BatchOutcome, BatchPlan, TickerWork
from app.batch.store import DecisionRow
from app.batch.workload import play, recorded_workload, shape
from app.config import Settings
from app.traffic.client import TickerClient


async def replay_batch(settings: Settings, engine: Engine, batch_id: int, *,
                       label: str | None = None, strategy: str = "adaptive",
                       match_output: bool = True, sample_metrics: bool = True,
                       server_facts: dict[str, object] | None = None,
                       **engine_kwargs: object) -> BatchOutcome:
    """Send every recorded request of ``batch_id`` again, in each ticker's original order."""
    source, workload = recorded_workload(engine, batch_id, match_output=match_output)
    for items in workload.values():
        for item in items:
            item.body["model"] = settings.llm_model  # the arm's server may name it otherwise

    async def work(ticker: str, gated: TickerClient, replay_id: int) -> list[DecisionRow]:
        return await play(workload[ticker], gated, replay_id)

    weights = {t: float(sum(i.body.get("max_tokens", 0) for i in items))
               for t, items in workload.items()}
    samples = int((source.settings or {}).get("samples", 1))
    plan = BatchPlan("replay", source.as_of, sorted(workload), samples, strategy,
                     label or f"replay of {batch_id}", source_batch_id=batch_id)
    runner = BatchEngine(settings, engine, sample_metrics=sample_metrics,
                         server_facts=server_facts, **engine_kwargs)  # type: ignore[arg-type]
    return await runner.run(plan, TickerWork(
        work, weights=weights, shapes={t: shape(items) for t, items in workload.items()},
        expected_calls=sum(len(items) for items in workload.values())))
