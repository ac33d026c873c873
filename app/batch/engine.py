"""Run a batch: create its rows, run every ticker's graph under the scheduler, account for it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import date
from typing import Any, Protocol, TypeVar

import httpx
import structlog
from langgraph.checkpoint.base import BaseCheckpointSaver
from pydantic import BaseModel
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from agents.data import DataProvider, MarketBundle, get_provider, serves_demo
from agents.graph import analyze_ticker, chain_length, node_names, thread_id
from app.batch import store
from app.batch.faults import INFRASTRUCTURE, FailureClass, failure_class
from app.batch.heap import batch_collector
from app.batch.signals import KEPT, NONE_KEPT
from app.config import Settings
from app.db.batchsettings import BatchSettings, FallbackRecord
from app.db.engine import reason
from app.db.lock import LockHold, after_losing
from app.db.models import RESUMABLE_KINDS
from app.db.retry import budget_s, outage, transient, write_budget
from app.db.runner import Runner
from app.errors import BatchStopped, DatabaseError, LLMError, StorageOutage, first_line
from app.quality import monitor
from app.tasks import beside, in_thread, patience_s
from app.traffic.client import TickerClient
from app.traffic.clock import Clock, loop_clock
from app.traffic.halt import Halt, HaltReason
from app.traffic.scheduler import Job, Scheduler
from app.traffic.server import ServerSet
from app.traffic.strategy import Strategy
from app.usage import UsageRecorder, spool_path

log = structlog.get_logger(__name__)
T = TypeVar("T")


@dataclass
class TickerWork:
    """What a batch does for each ticker besides its graph (a replay, a bench): ``job``
    (ticker, client, batch id) returns the decisions to store; ``weights`` order the tickers
    (heaviest first), ``shapes`` give (requests, chain length); ``prepare`` runs first."""

    job: Callable[[str, TickerClient, int], Awaitable[list[store.DecisionRow]]]
    weights: dict[str, float] | None = None
    shapes: dict[str, tuple[int, int]] | None = None
    expected_calls: int | None = None
    prepare: Callable[[str], Awaitable[None]] | None = None


@dataclass
class BatchPlan:
    """The tickers of one as-of date, how many samples each, under which strategy."""

    kind: str  # nightly | rerun
    as_of: date
    tickers: list[str]
    samples: int = 1
    strategy: str = "adaptive"
    label: str | None = None
    source_batch_id: int | None = None  # the batch a replay or bench run was made from
    notes: tuple[str, ...] = ()  # what its universe's reading said (stored: the morning shows it)


@dataclass
class BatchOutcome:
    batch_id: int
    status: str
    succeeded: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    # The failed tickers whose failure was the infrastructure's: `run --resume` takes them up.
    infrastructure: list[str] = field(default_factory=list)
    halt: HaltReason | None = None  # why it stopped early, when it did


class Resume(Protocol):
    """A stopped batch to continue, as whoever found it hands it in (app/runs/resumable.py's
    ``ResumePoint``): the engine reopens the batch through it."""

    @property
    def batch_id(self) -> int: ...

    @property
    def settings(self) -> BatchSettings:
        """Return the batch's settings as its last run recorded them."""

    def plan(self) -> BatchPlan:
        """Return the batch's plan: its tickers left, its samples and strategy as recorded."""

    def shaped(self, settings: Settings) -> Settings:
        """Return ``settings`` in the batch's recorded shape, its graph and sampling
        unchanged; InputError when the batch cannot resume under them (another model)."""

    def reopen(self, engine: Engine, recorded: BatchSettings) -> None:
        """Set the batch running again and its tickers left queued for another attempt;
        ``recorded`` replaces what the batch's settings say of the last run's."""

    def ended(self, engine: Engine) -> tuple[list[str], dict[str, str]]:
        """Return its tickers that succeeded, and those that failed with their error."""


class Checkpoints(Protocol):
    """Where the graph's work keeps each finished node, so that a batch cut short resumes
    by node (app/runs/checkpoints.py's ``Checkpoints``)."""

    def open(self, before_write: Callable[[], Awaitable[None]]
             ) -> AbstractAsyncContextManager[BaseCheckpointSaver[Any]]:
        """Return the checkpointer, ready when entered; ``before_write`` runs before each write."""

    async def prune(self, saver: BaseCheckpointSaver[Any], threads: Iterable[str]) -> None:
        """Delete the checkpoints of finished threads; a failure only leaves them behind."""

    def finished(self, batch_id: int) -> list[str]:
        """Return the threads of the batch's tickers that no resume takes up."""


class Recording(Protocol):
    """What records a batch beside the engine, attached to a run by whoever runs it
    (app/recorder/'s ``Recorder``): given the batch's control objects, it reads their plain
    state; the engine stores and logs what it returns, and reads none of its records."""

    def watch(self, batch_id: int, tickers: int, expected_calls: int | None,
              servers: ServerSet, strategy: Strategy) -> AbstractAsyncContextManager[object]:
        """Take the batch's servers; return what records it live while its tickers run."""

    def ticker_done(self, ok: bool) -> None: ...

    def fallback(self) -> FallbackRecord | None:
        """Return the batch's time without /metrics, stored with it (None: it had none)."""

    def finished(self) -> BaseModel:
        """Return how the batch's admission ended, for its last log line."""


class BatchEngine:
    """Run batches with one configuration (settings, database, data, servers): see ``run``."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        *,
        http_client: httpx.AsyncClient | None = None,
        provider: DataProvider | None = None,
        sample_metrics: bool = True,
        server_facts: dict[str, Any] | None = None,
        lock: LockHold | None = None,
        clock: Clock = loop_clock,
        checkpoints: Checkpoints | None = None,
    ) -> None:
        """``checkpoints``: where the graph's work keeps its nodes (None: nowhere, and a
        resume runs a stopped ticker from its start)."""
        self.settings = settings
        self.pipeline = settings.pipeline()
        self.engine = engine
        self.http_client = http_client
        self.provider = provider or get_provider(self.pipeline)
        self.sample_metrics = sample_metrics
        self.server_facts = server_facts
        self.halt = Halt()  # signals, an outage, fatal errors and a lost lock stop through it
        self.lock = lock  # a nightly run's lock: each heartbeat proves it
        self.clock = clock  # what server outages and the outage budget are timed on
        self.checkpoints = checkpoints
        self.batch_id: int | None = None  # the batch of the last run, once its row exists

    async def run(self, start: BatchPlan | Resume,
                  work: TickerWork | None = None,
                  recording: Recording | None = None) -> BatchOutcome:
        """Run a batch, the one way every command does: a plan starts one, a resume point
        continues a stopped one from each unfinished ticker's last finished node. ``work``:
        each ticker's graph unless given (a replay, a bench); ``recording``: what records
        it (None: nothing does). One ticker's failure never stops the others; a nightly
        batch that ends whole has its ratings watched."""
        resuming = None if isinstance(start, BatchPlan) else start
        if resuming is not None:
            self.settings = resuming.shaped(self.settings)
            self.pipeline = self.settings.pipeline()
        plan = start if isinstance(start, BatchPlan) else start.plan()
        # Every write of the batch, in its threads and tasks too, tries for its budget.
        with batch_collector(), write_budget(self.settings.store.db_write_budget_s):
            async with BatchRun(self, plan, work, resuming, recording) as run:
                await run.drive()
        if plan.kind == "nightly" and run.outcome.status in ("succeeded", "partial"):
            # An interrupted night is judged when its resume ends.
            await in_thread(self._watch_ratings, run.batch_id)
        return run.outcome

    def _watch_ratings(self, batch_id: int) -> None:
        """Run the rating-distribution monitor; its failure is logged, never the batch's."""
        try:
            for finding in monitor.check_batch(self.engine, batch_id, self.settings):
                log.warning("rating distribution", warning=finding.message)
        except Exception as exc:
            log.warning("rating monitor failed", error=_one_line(exc))


class BatchRun:
    """One batch from its first row to its final status, as an async context.

    Entering writes (or reopens) its rows and enters the usage writer's and the /metrics
    readers' contexts; ``drive`` runs the tickers. Leaving exits what was entered, last to
    first, each step whatever the others did, then writes the status and its one-line reason.
    """

    def __init__(self, owner: BatchEngine, plan: BatchPlan, work: TickerWork | None,
                 resuming: Resume | None = None,
                 recording: Recording | None = None) -> None:
        self.owner = owner
        self.recording = recording
        self.plan = plan
        self.given_work = work
        self.resuming = resuming
        self.strategy = Strategy.parse(plan.strategy)
        self.error_text: str | None = None
        self.body_ok = False
        self.lock_lost = False
        # Added to the batch's settings at its end; the graph's work says if it ran on demo data.
        self.extra_settings: dict[str, Any] = {} if work else {"demo_data": False}
        self.saver: BaseCheckpointSaver[Any] | None = None  # the graph's work's checkpointer
        self._log_context: Mapping[str, Any] = {}

    async def __aenter__(self) -> BatchRun:
        owner, plan, settings = self.owner, self.plan, self.owner.settings
        self.work = self.given_work or await self._graph_work()
        if "demo_data" in self.extra_settings:
            # From what the night was set to run on, so one that fails before loading any
            # data is labelled DEMO too (each bundle loaded may still say so).
            self.extra_settings["demo_data"] = await in_thread(
                serves_demo, owner.provider, plan.as_of)
        if self.resuming is None:
            self.batch_id = await _starting(
                store.create_batch, owner.engine, kind=plan.kind, as_of=plan.as_of,
                tickers=plan.tickers, samples=plan.samples, label=plan.label,
                settings=BatchSettings(
                    **dict(settings.snapshot()), **self.extra_settings, samples=plan.samples,
                    universe_notes=list(plan.notes), strategy=self.strategy.name,
                    # home: where its usage spool would be (a resume elsewhere must know).
                    runner=Runner.current(), home=str(settings.paths.home)),
                server_facts=owner.server_facts, source_batch_id=plan.source_batch_id,
            )
            owner.batch_id = self.batch_id  # what a run cancelled outright names
            self.outcome = BatchOutcome(self.batch_id, "crashed")  # until the run ends
        else:
            self.batch_id = owner.batch_id = self.resuming.batch_id
            # This run's settings and home replace the last run's: the next resume's checks
            # compare with the run that last wrote to the batch (its spool is under its home).
            await _starting(self.resuming.reopen, owner.engine, BatchSettings(
                **dict(settings.snapshot()), home=str(settings.paths.home)))
            done, failed_before = await in_thread(self.resuming.ended, owner.engine)
            self.outcome = BatchOutcome(self.batch_id, "crashed", done, failed_before)
        self._log_context = structlog.contextvars.bind_contextvars(batch_id=self.batch_id)
        log.info("batch started", kind=plan.kind, tickers=len(plan.tickers),
                 samples=plan.samples, strategy=self.strategy.name, as_of=str(plan.as_of))
        # What continues it, said when it stops short: a replay or bench arm is run anew.
        self.resume_hint = (f"; resume with `nightdesk run --resume {self.batch_id}`"
                            if plan.kind in RESUMABLE_KINDS else "")
        self.recorder = UsageRecorder(
            owner.engine, spool=spool_path(settings.paths.home, settings.store.database_url,
                                               self.batch_id))
        self.servers = ServerSet.connect(
            settings, self.strategy, self.recorder, engine=owner.engine,
            batch_id=self.batch_id, sample=owner.sample_metrics, http_client=owner.http_client,
            max_in_flight=max_in_flight(self.strategy, self.work.shapes,
                                        settings.calls.max_concurrency),
            halt=owner.halt, clock=owner.clock)
        served = self.resuming.settings.served_weights if self.resuming else {}
        for server in self.servers:  # a resume's server must serve the weights it answered with
            server.llm.weights = served.get(server.name)
        self.scheduler = Scheduler(self.strategy, self.servers)
        self.watching = nullcontext() if self.recording is None else self.recording.watch(
            self.batch_id, len(plan.tickers), self.work.expected_calls, self.servers,
            self.strategy)
        self.lives: list[tuple[str, AbstractAsyncContextManager[Any]]] = []  # last first
        try:
            for name, life in (("close the LLM clients", contextlib.aclosing(self.servers)),
                               ("close the usage recorder", self.recorder),
                               ("stop the metrics samplers", self.servers.taking())):
                await life.__aenter__()
                self.lives.insert(0, (name, life))
        except BaseException as error:
            await self.__aexit__(type(error), error, error.__traceback__)
            raise
        return self

    async def _graph_work(self) -> TickerWork:
        """Return the graph's work for every ticker of the plan: data loaded, checkpointed."""
        owner, plan = self.owner, self.plan
        bundles: dict[str, MarketBundle] = {}
        loads = asyncio.Semaphore(owner.settings.batch.data_concurrency)

        async def load(ticker: str) -> None:
            async with loads:
                bundles[ticker] = await in_thread(owner.provider.load, ticker,
                                                  plan.as_of)

        async def graph_job(ticker: str, gated: TickerClient, batch_id: int
                            ) -> list[store.DecisionRow]:
            bundle = bundles.pop(ticker)
            self.extra_settings["demo_data"] |= bundle.demo
            # A failed sample cancels its siblings; none of their calls outlives the ticker.
            async with beside() as samples:
                runs = [samples.create_task(
                    analyze_ticker(llm=gated, config=owner.pipeline, batch_id=batch_id,
                                   bundle=bundle, sample=s, checkpointer=self.saver,
                                   durability=owner.settings.store.checkpoint_durability))
                    for s in range(plan.samples)]
            results = [run.result() for run in runs]
            await in_thread(store.record_outputs, owner.engine, batch_id, results)
            return [store.DecisionRow(ticker, r.sample, r.decision.rating, r.decision.score,
                                      r.decision.confidence, r.decision.summary)
                    for r in results]

        weights = await in_thread(store.expected_work, owner.engine, plan.tickers)
        per_ticker = len(node_names(owner.pipeline)) * plan.samples
        # Samples run side by side, so a ticker's chain is one sample's.
        shape = (per_ticker, chain_length(owner.pipeline))
        return TickerWork(graph_job, weights=weights, shapes=dict.fromkeys(plan.tickers, shape),
                          expected_calls=per_ticker * len(plan.tickers), prepare=load)

    async def drive(self) -> None:
        """Run every ticker and the heartbeat until done or halted (``run_until_halted``)."""
        owner, plan, work, outcome = self.owner, self.plan, self.work, self.outcome
        # The graph's work resumes from its checkpoints, when it is given where to keep them.
        kept = owner.checkpoints if self.given_work is None else None

        async def ticker_job(ticker: str, given: TickerClient | Exception) -> None:
            """A ticker's whole work: its graph on its client (``given``; else why its data did
            not load), its server left to the next ticker, then its end stored and told."""
            decisions, error = [], given if isinstance(given, Exception) else None
            if isinstance(given, TickerClient):
                try:
                    await in_thread(store.ticker_started, owner.engine, self.batch_id,
                                    ticker)
                    with structlog.contextvars.bound_contextvars(ticker=ticker):
                        decisions = await work.job(ticker, given, self.batch_id)
                except Exception as exc:  # one ticker's failure never stops the others
                    error = exc
                finally:
                    given.close()  # first: its room goes on, not held through the writes
            if error is not None and transient(error):  # a ticker row past its write budget
                error = outage("ticker row not stored", error)
            # Stored and told under the ticker: a reason that begins with it says it twice.
            message = None if error is None else _one_line(error).removeprefix(f"{ticker}: ")
            if isinstance(error, LLMError) and error.stops_batch:
                # Every call would meet it (a wrong key, URL, model): stop, stay resumable.
                owner.halt.request(HaltReason("failed", message or "", error.exit_code))
                return
            if isinstance(error, BatchStopped):
                self._stop(error)
                return  # stopped, not failed: left for `run --resume`
            fault = None if error is None else failure_class(error)
            try:
                message, fault = await self._store_result(ticker, decisions, message, fault)
            except StorageOutage as stopped:  # the ticker's end is left for the resume
                self._stop(stopped)
                return
            if kept is not None and self.saver is not None and fault != INFRASTRUCTURE:
                # A ticker the infrastructure failed keeps its checkpoints: a resume
                # continues it from its last finished node.
                await kept.prune(self.saver, [thread_id(self.batch_id, ticker, s)
                                              for s in range(plan.samples)])
            if message:
                outcome.failed[ticker] = message
                if fault == INFRASTRUCTURE:
                    outcome.infrastructure.append(ticker)
                log.error("ticker failed", ticker=ticker, error=message, failure_class=fault)
            else:
                outcome.succeeded.append(ticker)
                log.info("ticker done", ticker=ticker,
                         rating=decisions[0].rating if decisions else None)
            if self.recording is not None:
                self.recording.ticker_done(ok=message is None)

        jobs = [Job(t, functools.partial(ticker_job, t), (work.weights or {}).get(t, 0.0),
                    *(work.shapes or {}).get(t, (0, 0)),
                    prepare=functools.partial(work.prepare, t) if work.prepare else None)
                for t in plan.tickers]
        async with contextlib.AsyncExitStack() as checkpoints:
            if kept is not None:
                self.saver = await checkpoints.enter_async_context(
                    kept.open(self.recorder.drain))
            async with self.watching:
                await run_until_halted(self.scheduler, self.scheduler.run(jobs),
                                       owner.halt, helpers=[self._heartbeat(), self._lost()])
            if kept is not None and self.saver is not None and self._halted() is None:
                # Also those a process killed between storing and pruning left behind.
                await kept.prune(self.saver, await in_thread(kept.finished,
                                                             self.batch_id))
        # Over the whole batch, a resume's earlier tickers included.
        outcome.status = ("succeeded" if not outcome.failed
                          else "partial" if outcome.succeeded else "failed")
        # The usage writer may have given up while they were pruned.
        if (reason := self._halted()) is not None:
            why = self._with_resume(reason.message)
            if self.lock_lost and self._left():  # who runs now says what continues it
                why = reason.message + await in_thread(after_losing, owner.engine,
                                                       self.batch_id)
            outcome.halt = replace(reason, message=why)
            outcome.status, self.error_text = outcome.halt.status, outcome.halt.message
        if self.servers.outages:
            self.extra_settings["server_outages"] = self.servers.outages
        self.extra_settings["served_weights"] = {s.name: s.llm.weights for s in self.servers
                                                 if s.llm.weights}
        fallback = self.recording.fallback() if self.recording else None
        if fallback is not None:  # shown by `nightdesk report`
            self.extra_settings["metrics_fallback"] = fallback
        self.body_ok = True

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None,
                        tb: Any) -> None:
        if exc is not None and not self.body_ok:
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
                self.outcome.status = "interrupted"
                self.error_text = self._with_resume("interrupted by the operator")
            elif isinstance(exc, Exception):
                self.error_text = _one_line(exc)
        try:
            failed: list[tuple[str, BaseException]] = []
            for name, life in self.lives:  # the samplers, the recorder, the clients
                try:
                    await life.__aexit__(et, exc, tb)
                except BaseException as met:  # a cancellation too: raised below, never lost
                    said = f"{type(met).__name__}: {met}"
                    log.error("cleanup step failed", step=name, error=said)
                    failed.append((f"cleanup: {name}: {said}", met))
            if failed:
                self.error_text = "; ".join(filter(None, [self.error_text, "; ".join(
                    note for note, _ in failed)[:500]]))
            outcome = self.outcome
            admission = self.recording.finished() if self.recording else None
            # A stopping batch's end waits no longer than a thread's patience: a database
            # hung for good must not hold a SIGTERM for ever.
            stopping = self.owner.halt.reason is not None or not isinstance(exc, Exception | None)
            if await self._may_write_end():
                try:
                    async with asyncio.timeout(patience_s() if stopping else None) as bound:
                        await in_thread(
                            store.finish_batch, self.owner.engine, self.batch_id,
                            outcome.status, self.error_text, self.extra_settings or None)
                except Exception as unstored:
                    if not transient(unstored) and not bound.expired():
                        raise
                    # Left `running`: the next start finds its process gone, marks it
                    # crashed, and `run --resume` continues it.
                    stopped = StorageOutage("the batch's end not stored: the database did not "
                                            f"answer within {patience_s():g} s"
                                            ) if bound.expired() else outage(
                                                "the batch's end not stored", unstored)
                    lost = self.recorder.untold  # rows lost, or kept off the home: said
                    if lost is not None:
                        stopped = StorageOutage(f"{lost}; the batch's end not stored either "
                                                f"within the write budget ({budget_s():g} s)")
                    raise StorageOutage(f"{stopped}{self.resume_hint}") from unstored
            log.info("batch finished", status=outcome.status, succeeded=len(outcome.succeeded),
                     failed=len(outcome.failed),
                     **{"admission": admission.model_dump()} if admission else {})
            # What closing met is raised: a cancellation always; an error when nothing else is.
            for _, error in failed:
                if not isinstance(error, Exception):
                    raise error
            if failed and self.body_ok and exc is None:
                raise failed[0][1]
        finally:
            structlog.contextvars.reset_contextvars(**self._log_context)

    def _stop(self, stopped: BatchStopped) -> None:
        """Stop the batch for ``stopped`` unless it is stopping already (then it says why)."""
        if self.owner.halt.reason is None:  # the first to meet it: a write past its budget
            self.owner.halt.request(HaltReason(stopped.status, _one_line(stopped),
                                               stopped.exit_code))

    def _left(self) -> bool:
        """Return whether a resume has tickers to take up (as summary.py's ``tickers_left``)."""
        return any(t not in self.outcome.succeeded
                   and (t not in self.outcome.failed or t in self.outcome.infrastructure)
                   for t in self.plan.tickers)

    async def _lost(self) -> None:
        """Beside the tickers: stop the batch once its usage writer gives up."""
        await self.recorder.stopped.wait()
        self._halted()

    def _halted(self) -> HaltReason | None:
        """Return why the batch is stopping (None: it is not): asked to, or its usage writer
        gave up (rows not stored: ``recorder.lost``), a stop this asks for, hurried."""
        if (lost := self.recorder.lost) is not None:
            self.owner.halt.request(HaltReason(lost.status, str(lost), lost.exit_code))
        return self.owner.halt.reason

    def _with_resume(self, why: str) -> str:
        """Return ``why`` the batch stopped, naming the command that continues it
        (``resume_hint``) when ``_left``: whatever stopped it, the line says what to do. A
        stop by signal keeps finished tickers only where one finished (``KEPT``)."""
        if not (self.outcome.succeeded or self.outcome.failed):
            why = why.replace(KEPT, NONE_KEPT)
        return why + self.resume_hint if self._left() else why

    async def _store_result(self, ticker: str, decisions: list[store.DecisionRow],
                            error: str | None, fault: FailureClass | None
                            ) -> tuple[str | None, FailureClass | None]:
        """Store how a ticker ended; return why it failed (None: it succeeded) and whose
        failure it was. A result the database will not take fails this ticker only, with
        the reason, classed by what the database said; a database full or away past the
        write budget raises StorageOutage (the ticker stays resumable)."""
        engine = self.owner.engine
        try:
            await in_thread(store.ticker_finished, engine, self.batch_id, ticker,
                            decisions, error, failure_class=fault)
            return error, fault
        except Exception as exc:
            if transient(exc):  # the database, not the result: stop, resumable
                raise outage("ticker result not stored", exc) from exc
            reason = "; ".join(filter(None, [error, f"result not stored: {_one_line(exc)}"]))
            fault = INFRASTRUCTURE if fault == INFRASTRUCTURE else failure_class(exc)
        log.error("ticker result not stored", ticker=ticker, error=reason)
        try:
            await in_thread(store.ticker_finished, engine, self.batch_id, ticker, [],
                            reason, failure_class=fault)
        except Exception as exc:
            # The database is away for now: finish_batch marks the ticker when it can.
            log.error("ticker status not stored", ticker=ticker, error=_one_line(exc))
        return reason, fault

    async def _heartbeat(self) -> None:
        settings, lock = self.owner.settings, self.owner.lock
        interval, stale = settings.batch.heartbeat_interval_s, settings.batch.heartbeat_stale_s
        # Stop before a later start takes this batch (heartbeat ``stale`` old) for dead.
        give_up = max(stale - 2 * interval, stale / 2)
        while True:
            await asyncio.sleep(interval)
            try:
                if lock is None:
                    await in_thread(store.heartbeat, self.owner.engine, self.batch_id)
                elif await in_thread(lock.beat, self.batch_id):
                    continue
            except Exception as exc:  # a missed heartbeat is not worth failing the batch
                log.warning("heartbeat not stored", error=_one_line(exc))
            if lock is not None and lock.unproven_s > give_up:
                self.lock_lost = True
                self.owner.halt.request(HaltReason(
                    "interrupted", f"the nightly lock could not be proven held for "
                    f"{lock.unproven_s:.0f} s (the database restarted or another run "
                    "took it): stopped so that no call is made twice", 4))
                return

    async def _may_write_end(self) -> bool:
        """Return whether this run may write the batch's end: not once its lock is lost."""
        lock = self.owner.lock
        if not self.lock_lost or lock is None:
            return True
        with contextlib.suppress(Exception):
            if await in_thread(lock.beat, self.batch_id):
                return True
        # Another run may own the batch now; the next start marks it crashed if none does.
        log.error("batch end not written: the nightly lock is lost", batch_id=self.batch_id)
        return False


async def _starting(write: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a write that starts a batch; the database full or away past the write budget, or
    refusing the write (a full disk opens it read-only), is one line (DatabaseError), nothing
    of the batch having run yet."""
    try:
        return await in_thread(write, *args, **kwargs)
    except SQLAlchemyError as error:
        said = outage("its rows not stored", error) if transient(error) else (
            f"its rows not stored: {reason(error)}")
        raise DatabaseError(f"the batch could not start: {said}") from error


def max_in_flight(strategy: Strategy, shapes: dict[str, tuple[int, int]] | None,
                  max_concurrency: int) -> int | None:
    """Return the most requests the strategy can have at the server at once (None: unknown):
    the connection pool's size, so the pool never holds back a request the strategy let out."""
    if strategy.request_limit is not None:
        return strategy.request_limit
    if strategy.adaptive:
        # Unknown: behind a router the gate's ceiling is max_concurrency per server read, and
        # the servers read change during the night; the gate is the cap, the pool none.
        return None
    requests = sorted((r for r, _ in (shapes or {}).values()), reverse=True)
    if not requests or not all(requests):
        return None  # some ticker's work is unknown: leave the pool uncapped
    # fixed-N: at most N tickers at once, each with every request it has.
    return sum(requests[:strategy.tickers_in_flight or len(requests)])


async def run_until_halted(scheduler: Scheduler, work: Coroutine[Any, Any, None], halt: Halt,
                           helpers: Sequence[Coroutine[Any, Any, None]] = ()) -> None:
    """Await ``work`` in one TaskGroup with the halt (and ``helpers``, until it ends).

    A halt stops the scheduler; requests at the server may finish within the reason's
    grace, waiting ones are refused with BatchStopped once drained; past the grace, or once
    hurried, the halt's ``cut`` cancels the group. Nothing it started outlives it; ``work``'s
    error is raised.
    """
    try:
        async with asyncio.timeout(None) as cut:
            halt.arm(cut)
            tasks: list[asyncio.Task[None]] = []
            try:
                async with beside(lambda: [task.cancel() for task in tasks]) as group:
                    tasks += [group.create_task(helper) for helper
                              in (_stop_on_halt(scheduler, halt), *helpers)]
                    await work
            finally:
                halt.arm(None)  # a stop asked later has nothing left to cut
    except TimeoutError:
        if not cut.expired():
            raise
        log.warning("cancelling what is still running",
                    why=halt.reason.message if halt.reason else "")


async def _stop_on_halt(scheduler: Scheduler, halt: Halt) -> None:
    """On a halt: stop admission; once drained, unless hurried, refuse the waiting requests."""
    await halt.requested.wait()
    scheduler.stop()
    await scheduler.drained()
    if not halt.hurried.is_set():
        scheduler.close(BatchStopped(halt.reason.message if halt.reason else ""))


# A batch's stored error: room for more than a log line, and the type of what is not ours.
_one_line = functools.partial(first_line, limit=500, typed=True)
