"""Run a batch: create its rows, run every ticker's graph under the scheduler, account for it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import httpx
import structlog
from sqlalchemy import Engine

from agents.data import DataProvider, get_provider
from agents.graph import analyze_ticker, chain_length, node_names
from app.batch import store
from app.batch.endpoints import EndpointSet
from app.batch.gate import GatedLLM
from app.batch.outputs import record_outputs
from app.batch.progress import BatchProgress
from app.batch.scheduler import Job, Scheduler, Strategy
from app.config import Settings
from app.errors import ERRORS
from app.quality import monitor
from app.usage import UsageRecorder

log = structlog.get_logger(__name__)

HEARTBEAT_S = 10.0

# One ticker's work: (ticker, gated client, batch id) -> the decisions to store.
TickerWork = Callable[[str, GatedLLM, int], Awaitable[list["store.DecisionRow"]]]


@dataclass
class BatchPlan:
    """What to run: the tickers of one as-of date, how many samples each, under which strategy."""

    kind: str  # nightly | rerun
    as_of: date
    tickers: list[str]
    samples: int = 1
    strategy: str = "adaptive"
    label: str | None = None


@dataclass
class BatchOutcome:
    batch_id: int
    status: str
    succeeded: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    admission: dict[str, Any] = field(default_factory=dict)  # how the scheduler ended


class BatchEngine:
    """Own one batch from its first row to its final status."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        *,
        http_client: httpx.AsyncClient | None = None,
        provider: DataProvider | None = None,
        sample_metrics: bool = True,
        progress_factory: Callable[..., BatchProgress] = BatchProgress,
        server_facts: dict[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.pipeline = settings.pipeline()
        self.engine = engine
        self.http_client = http_client
        self.provider = provider or get_provider(self.pipeline)
        self.sample_metrics = sample_metrics
        self.progress_factory = progress_factory
        self.server_facts = server_facts

    async def run(self, plan: BatchPlan) -> BatchOutcome:
        """Run the graph for every ticker of the plan; one ticker's failure never stops others."""
        demo_seen: list[bool] = []

        async def graph_job(ticker: str, gated: GatedLLM, batch_id: int
                            ) -> list[store.DecisionRow]:
            bundle = await asyncio.to_thread(self.provider.load, ticker, plan.as_of)
            demo_seen.append(bundle.demo)
            results = await asyncio.gather(*(
                analyze_ticker(llm=gated, config=self.pipeline, batch_id=batch_id,
                               bundle=bundle, sample=s, priority=gated.priority)
                for s in range(plan.samples)
            ))
            await asyncio.to_thread(record_outputs, self.engine, batch_id, results)
            return [store.DecisionRow(ticker, r.sample, r.decision.rating, r.decision.score,
                                      r.decision.confidence, r.decision.summary)
                    for r in results]

        weights = await asyncio.to_thread(store.expected_work, self.engine, plan.tickers)
        per_ticker = len(node_names(self.pipeline)) * plan.samples
        # Samples run side by side, so a ticker's chain is one sample's.
        shape = (per_ticker, chain_length(self.pipeline))
        return await self.execute(plan, graph_job, weights=weights,
                                  shapes=dict.fromkeys(plan.tickers, shape),
                                  expected_calls=per_ticker * len(plan.tickers),
                                  final_settings=lambda: {"demo_data": any(demo_seen)})

    async def execute(
        self,
        plan: BatchPlan,
        work: TickerWork,
        *,
        weights: dict[str, float] | None = None,
        shapes: dict[str, tuple[int, int]] | None = None,
        source_batch_id: int | None = None,
        final_settings: Callable[[], dict[str, Any]] | None = None,
        expected_calls: int | None = None,
    ) -> BatchOutcome:
        """Own a batch's rows and lifecycle while ``work`` does each ticker's calls.

        ``weights`` order the tickers (heaviest first); ``shapes`` give each ticker's
        expected (requests, chain length), which lets the scheduler shorten the tail.
        """
        strategy = Strategy.parse(plan.strategy)
        batch_id = await asyncio.to_thread(
            store.create_batch, self.engine, kind=plan.kind, as_of=plan.as_of,
            tickers=plan.tickers, samples=plan.samples, label=plan.label,
            settings={**self.settings.snapshot(), "samples": plan.samples,
                      "strategy": strategy.name},
            server_facts=self.server_facts, source_batch_id=source_batch_id,
        )
        outcome = BatchOutcome(batch_id, "running")

        with structlog.contextvars.bound_contextvars(batch_id=batch_id):
            log.info("batch started", kind=plan.kind, tickers=len(plan.tickers),
                     samples=plan.samples, strategy=strategy.name, as_of=str(plan.as_of))
            recorder = UsageRecorder(self.engine)
            # A client and a /metrics sampler per endpoint (one, unless several are set);
            # the LLM's client (when one is given) also reads /metrics: the same servers.
            endpoints = EndpointSet.connect(
                self.settings, strategy, recorder, engine=self.engine, batch_id=batch_id,
                sample=self.sample_metrics, http_client=self.http_client,
                max_in_flight=max_in_flight(strategy, shapes, self.settings.max_concurrency))
            scheduler = Scheduler(None, strategy, endpoints=endpoints,
                                  interval_s=min(self.settings.metrics_interval_s, 2.0))
            llm, sampler = ((endpoints, endpoints) if endpoints.several
                            else (endpoints.first.llm, endpoints.first.gauges))
            progress = self.progress_factory(batch_id, len(plan.tickers), llm, scheduler,
                                             sampler, expected_calls=expected_calls)

            async def ticker_job(ticker: str, gated: GatedLLM) -> list[store.DecisionRow]:
                await asyncio.to_thread(store.ticker_started, self.engine, batch_id, ticker)
                with structlog.contextvars.bound_contextvars(ticker=ticker):
                    return await work(ticker, gated, batch_id)

            async def on_done(job: Job, decisions: Any, error: BaseException | None) -> None:
                message = None if error is None else _one_line(error)
                await asyncio.to_thread(store.ticker_finished, self.engine, batch_id, job.key,
                                        decisions or [], message)
                if message:
                    outcome.failed[job.key] = message
                    log.error("ticker failed", ticker=job.key, error=message)
                else:
                    outcome.succeeded.append(job.key)
                    log.info("ticker done", ticker=job.key,
                             rating=decisions[0].rating if decisions else None)
                progress.ticker_done(job.key, ok=message is None)

            jobs = [Job(t, functools.partial(ticker_job, t), (weights or {}).get(t, 0.0),
                        *(shapes or {}).get(t, (0, 0)))
                    for t in plan.tickers]
            heart = asyncio.create_task(self._heartbeat(batch_id))
            status, error_text = "crashed", None
            try:
                await recorder.start()
                await endpoints.start()
                with progress:
                    await scheduler.run(jobs, on_done)
                status = "succeeded" if outcome.succeeded or not plan.tickers else "failed"
            except (asyncio.CancelledError, KeyboardInterrupt):
                status, error_text = "interrupted", "interrupted by the operator"
                raise
            except Exception as exc:
                error_text = _one_line(exc)
                raise
            finally:
                heart.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heart
                await endpoints.stop()
                await recorder.close()
                await endpoints.aclose()
                outcome.status = status
                outcome.admission = scheduler.admission()
                await asyncio.to_thread(
                    store.finish_batch, self.engine, batch_id, status, error_text,
                    final_settings() if final_settings else None)
                log.info("batch finished", status=status, succeeded=len(outcome.succeeded),
                         failed=len(outcome.failed), admission=outcome.admission)
            if plan.kind == "nightly":
                await asyncio.to_thread(self._watch_ratings, batch_id)
        return outcome

    def _watch_ratings(self, batch_id: int) -> None:
        """Run the rating-distribution monitor; its failure is logged, never the batch's."""
        try:
            for finding in monitor.check_batch(self.engine, batch_id, self.settings):
                log.warning("rating distribution", warning=finding.message)
        except Exception as exc:
            log.warning("rating monitor failed", error=_one_line(exc))

    async def _heartbeat(self, batch_id: int) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await asyncio.to_thread(store.heartbeat, self.engine, batch_id)
            except Exception as exc:  # a missed heartbeat is not worth failing the batch
                log.warning("heartbeat not stored", error=_one_line(exc))


def max_in_flight(strategy: Strategy, shapes: dict[str, tuple[int, int]] | None,
                  max_concurrency: int) -> int | None:
    """Return the most requests the strategy can have at the server at once (None: unknown).

    The LLM client's connection pool is sized from it, so the pool never holds back a
    request the strategy let out.
    """
    if strategy.request_limit is not None:
        return strategy.request_limit
    if strategy.adaptive:
        return strategy.admission_policy(max_concurrency).maximum
    requests = sorted((r for r, _ in (shapes or {}).values()), reverse=True)
    if not requests or not all(requests):
        return None  # some ticker's work is unknown: leave the pool uncapped
    # fixed-N: at most N tickers at once, each with every request it has.
    return sum(requests[:strategy.tickers_in_flight or len(requests)])


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    kind = "" if isinstance(error, ERRORS) else f"{type(error).__name__}: "
    return (kind + text)[:500] or type(error).__name__
