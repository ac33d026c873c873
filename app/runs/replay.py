"""Describe a workload as per-ticker request graphs, from a recorded batch, and play it back
(``nightdesk replay``, the bench)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select, update

from agents.chat import CallTag
from app.batch.engine import BatchEngine, BatchOutcome, BatchPlan, TickerWork
from app.batch.store import DecisionRow
from app.config import Settings
from app.db.batchsettings import BatchSettings
from app.db.models import Batch, LLMCall, LLMRequest, TickerRun, batch_row
from app.errors import InputError, LLMError
from app.recorder.record import Recorder
from app.runs.preflight import check_endpoints
from app.tasks import first_error, in_thread
from app.traffic.client import TickerClient
from app.usage import decompress_body


@dataclass
class WorkItem:
    """One request of a workload and the requests of its ticker it must wait for."""

    ticker: str
    sample: int
    node: str
    body: dict[str, Any]
    deps: list[str] = field(default_factory=list)  # names of the same ticker and sample
    request: int = 1  # 1: the node's request; 2, 3...: its decision asked again

    @property
    def name(self) -> str:
        """Name the request within its ticker and sample: ``node``, or ``node#2`` for a re-ask."""
        return self.node if self.request == 1 else f"{self.node}#{self.request}"


Workload = dict[str, list[WorkItem]]  # ticker -> its requests


@dataclass
class _Timing:
    started: datetime
    ended: datetime
    completion_tokens: int | None


def recorded_workload(engine: Engine, batch_id: int, *, match_output: bool = True
                      ) -> tuple[Batch, Workload]:
    """Rebuild a batch's requests with their order: a request depends on every request of
    its ticker and sample that ended before it started. A node asked again has one item
    per recorded body. ``match_output``: each free-text request decodes as many tokens as
    it did then (``ignore_eos``), so two replay arms differ only in how fast they serve.
    """
    batch = batch_row(engine, batch_id)
    with engine.connect() as conn:
        bodies = conn.execute(select(LLMRequest.ticker, LLMRequest.node, LLMRequest.sample,
                                     LLMRequest.call_id, LLMRequest.body)
                              .where(LLMRequest.batch_id == batch_id)).all()
        if not bodies:
            raise InputError(f"batch {batch_id} has no recorded requests "
                             "(was NIGHTDESK_RECORD_REQUESTS off?)")
        calls: dict[str, list[Any]] = defaultdict(list)
        for call in conn.execute(
                select(LLMCall.call_id, LLMCall.started_at, LLMCall.ended_at, LLMCall.status,
                       LLMCall.completion_tokens).where(LLMCall.batch_id == batch_id)):
            calls[call.call_id].append(call)
    by_chain: dict[tuple[str, int], list[tuple[_Timing, WorkItem]]] = defaultdict(list)
    for ticker, node, sample, call_id, blob in bodies:
        mine = calls[call_id]
        if not mine:
            continue  # a body recorded for a call that never started: nothing to replay
        ok = [c.completion_tokens for c in mine if c.status == "ok" and c.completion_tokens]
        timing = _Timing(min(c.started_at for c in mine), max(c.ended_at for c in mine),
                         max(ok, default=None))
        body = decompress_body(blob)
        if match_output and timing.completion_tokens and "response_format" not in body:
            body["max_tokens"] = timing.completion_tokens
            body["extra_body"] = {**body.get("extra_body", {}), "ignore_eos": True}
        by_chain[(ticker, sample)].append((timing, WorkItem(ticker, sample, node, body)))
    workload: Workload = defaultdict(list)
    for (ticker, _), chain in sorted(by_chain.items()):
        chain.sort(key=lambda pair: pair[0].started)
        asked: dict[str, int] = defaultdict(int)  # a node's requests so far, in start order
        for _, item in chain:
            asked[item.node] += 1
            item.request = asked[item.node]
        for timing, item in chain:
            item.deps = [other.name for t, other in chain if t.ended <= timing.started]
            workload[ticker].append(item)
    return batch, dict(workload)


def shape(items: list[WorkItem]) -> tuple[int, int]:
    """Return a ticker's (requests, longest chain of requests that wait for one another)."""
    depth: dict[tuple[int, str], int] = {}

    def chain(item: WorkItem) -> int:
        key = (item.sample, item.name)
        if key not in depth:
            depth[key] = 0  # a cycle (never recorded) must not recurse forever
            depth[key] = 1 + max((chain(by_node[(item.sample, d)]) for d in item.deps
                                  if (item.sample, d) in by_node), default=0)
        return depth[key]

    by_node = {(i.sample, i.name): i for i in items}
    return len(items), max((chain(i) for i in items), default=0)


async def play(items: list[WorkItem], gated: TickerClient, batch_id: int, *,
               ignore_deps: bool = False) -> list[Any]:
    """Send a ticker's requests, each after its dependencies finished; raise the first
    failure. A failed request still releases its dependants (replayed prompts are frozen).
    """
    done = {(i.sample, i.name): asyncio.Event() for i in items}
    errors: list[LLMError] = []

    async def one(item: WorkItem) -> None:
        if not ignore_deps:
            for dep in item.deps:
                await done[(item.sample, dep)].wait()
        try:
            await gated.send(CallTag(batch_id, item.ticker, item.node, item.sample), item.body)
        except LLMError as error:
            errors.append(error)
        finally:
            done[(item.sample, item.name)].set()

    try:
        async with asyncio.TaskGroup() as group:  # any other error cancels the siblings
            for item in items:
                group.create_task(one(item))
    except BaseExceptionGroup as group_error:
        raise first_error(group_error) from None
    if errors:
        raise errors[0]
    return []


async def replay_batch(settings: Settings, engine: Engine, batch_id: int, *,
                       label: str | None = None, strategy: str = "adaptive",
                       match_output: bool = True, preflight: bool = False,
                       runner: BatchEngine | None = None,
                       **engine_kwargs: Any) -> BatchOutcome:
    """Send every recorded request of ``batch_id`` again, in each ticker's original order,
    as a batch of kind ``replay`` run by ``runner`` (made with ``engine_kwargs`` if none is
    given: the caller's names the batch once its row exists). With ``preflight`` the
    server is asked first (ConfigError, before any row): the prompts ran once already.
    The market data is in the recorded prompts: no snapshot is read, so one changed or
    deleted since does not change what is sent. A ticker of ``batch_id`` that recorded no
    request (its data failed to load) is named in the batch's notes, not dropped unsaid. The
    replay of a night on DEMO data is labelled DEMO as the night is.
    """
    source, workload = recorded_workload(engine, batch_id, match_output=match_output)
    left = sorted(set(await in_thread(_tickers_of, engine, batch_id)) - set(workload))
    notes = (f"not replayed: {len(left)} of batch {batch_id}'s tickers recorded no request "
             f"(failed before their first call): {', '.join(left)}",) if left else ()
    if preflight:
        await in_thread(check_endpoints, settings)
    for items in workload.values():
        for item in items:
            item.body["model"] = settings.llm.model  # the arm's server may name it otherwise

    # The night's DEMO label: its prompts, DEMO data and all, are what the replay sends. The
    # engine labels only the graph's work, so the first ticker to start labels the batch.
    recorded = BatchSettings.read(source.settings)
    demo_label = {"demo": recorded.demo_data}

    async def work(ticker: str, gated: TickerClient, replay_id: int) -> list[DecisionRow]:
        if demo_label.pop("demo", False):
            await in_thread(_label_demo, engine, replay_id)
        return await play(workload[ticker], gated, replay_id)

    weights = {t: float(sum(i.body.get("max_tokens", 0) for i in items))
               for t, items in workload.items()}
    samples = recorded.samples or 1
    plan = BatchPlan("replay", source.as_of, sorted(workload), samples, strategy,
                     label or f"replay of {batch_id}", source_batch_id=batch_id, notes=notes)
    runner = runner or BatchEngine(settings, engine, **engine_kwargs)
    return await runner.run(plan, TickerWork(
        work, weights=weights, shapes={t: shape(items) for t, items in workload.items()},
        expected_calls=sum(len(items) for items in workload.values())), Recorder(engine))


def _label_demo(engine: Engine, batch_id: int) -> None:
    """Mark batch ``batch_id`` as run on DEMO data (``demo_data`` in its settings), as every
    view that labels a DEMO night reads it; the engine's end keeps it (it adds, not replaces)."""
    with engine.begin() as conn:
        settings = BatchSettings.read(
            conn.execute(select(Batch.settings).where(Batch.id == batch_id)).scalar())
        conn.execute(update(Batch).where(Batch.id == batch_id).values(
            settings=settings.updated(demo_data=True).stored()))


def _tickers_of(engine: Engine, batch_id: int) -> list[str]:
    """Return the tickers batch ``batch_id`` ran (its ticker rows)."""
    with engine.connect() as conn:
        return list(conn.execute(select(TickerRun.ticker).where(
            TickerRun.batch_id == batch_id)).scalars())
