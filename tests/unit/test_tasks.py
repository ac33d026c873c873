"""Check the project's rule on concurrency: when a function returns, nothing it started runs.

Each function that waits on several things at once (a halt beside the batch, a server coming
back or the outage budget running out, a call beside its endpoint going down, a signal beside
the batch) is run here to its end normally, by a halt and by a cancellation; each context
that runs loops beside its body (``beside``; the progress loops and the /metrics readers here,
the usage writer and the checkpoint saver in their own tests) is left by its body returning,
raising and being cancelled. Then ``asyncio.all_tasks()`` must hold no task it made. A task
cancelled but not awaited is still in that set until it has handled its cancellation, so a
bare ``cancel()`` is caught; the fakes that take a moment to end once cancelled
(SlowToCancel) catch one whose wait happened to be covered by some later await. A thread
(``in_thread``) is run to its end through a cancellation of its caller, its group's and a
timeout's: the caller is left only once the blocking call has returned, or once its patience
has run out (a call hung for good), and a thread so left never holds the process's exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import io
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from datetime import date
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from rich.console import Console
from sqlalchemy import Engine
from structlog.testing import capture_logs

from app.batch.engine import BatchEngine, BatchPlan, TickerWork, run_until_halted
from app.batch.signals import _stop_on_signals
from app.config import load_settings
from app.errors import BatchStopped, ServerOutage
from app.recorder.progress import BatchProgress
from app.runs.replay import WorkItem, Workload, play
from app.tasks import beside, in_thread, patience
from app.traffic.client import EndpointGone, TickerClient
from app.traffic.halt import Halt, HaltReason
from app.traffic.sampler import MetricsSampler
from app.traffic.server import Server, ServerSet
from app.traffic.strategy import Strategy
from tests.fakevllm import BASE_URL, ChatRequest, FakeServer, Reply
from tests.unit.support.endings import ENDINGS, End, run_to_its_end
from tests.unit.support.metrics_transport import transport
from tests.unit.support.servers import Unread, read_servers
from tests.unit.support.threads import Blocking


def tasks_now() -> set[asyncio.Task[Any]]:
    return asyncio.all_tasks()


async def left_behind(call: Callable[[], Awaitable[Any]]) -> set[asyncio.Task[Any]]:
    """Await ``call()`` (whatever it raises) and return the tasks it left running."""
    before = tasks_now()
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await call()
    return {t for t in tasks_now() - before if not t.done()}


async def cancelled_after(delay_s: float, call: Callable[[], Awaitable[Any]]
                          ) -> set[asyncio.Task[Any]]:
    """Run ``call()`` in a task, cancel that task after ``delay_s``; return what it left."""
    before = tasks_now()
    runner = asyncio.create_task(call())
    await asyncio.sleep(delay_s)
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    return {t for t in tasks_now() - before if not t.done()}


class SlowToCancel:
    """A coroutine that needs a moment to end once cancelled, and says when it has."""

    def __init__(self) -> None:
        self.ended = False

    async def __call__(self) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.02)  # cleans up, as a call closing its stream does
            self.ended = True


# --- the helpers -----------------------------------------------------------------------------


@pytest.mark.parametrize("ending", ENDINGS)
async def test_beside_stops_its_tasks_and_awaits_their_end_however_the_body_ends(
        ending: str) -> None:
    # Stopped, not cancelled: a loop's last write is never cut, the body's error or not.
    stopping, finished = asyncio.Event(), []

    async def loop() -> None:
        await stopping.wait()
        await asyncio.sleep(0.02)  # its last write
        finished.append(ending)

    async def body(end: End) -> None:
        async with beside(stopping.set) as group:
            group.create_task(loop())
            await end()

    assert not await run_to_its_end(ending, body)
    assert finished == [ending]


async def test_beside_cancelled_as_it_waits_cancels_its_tasks_and_raises_once_they_end() -> None:
    slow = SlowToCancel()
    started: list[asyncio.Task[None]] = []

    async def stop() -> None:
        async with beside() as group:  # nothing stops it: its exit waits, until cancelled
            started.append(group.create_task(slow()))

    assert not await cancelled_after(0.005, stop)
    assert slow.ended and started[0].cancelled()


async def test_a_task_beside_that_fails_stops_the_body_and_its_error_is_raised_as_itself(
) -> None:
    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise RuntimeError("a bug")

    async def body() -> None:
        async with beside() as group:
            group.create_task(fails())
            await asyncio.Event().wait()  # cancelled by the group: the task failed

    before = tasks_now()
    with pytest.raises(RuntimeError, match="a bug"):  # itself, not an ExceptionGroup
        await body()
    assert not {t for t in tasks_now() - before if not t.done()}


# A thread cannot be cancelled: ``in_thread``'s caller, cancelled, waits for the call to end
# (asyncio.to_thread's raises at once and its group exits while the thread still runs).


async def test_a_group_cancelled_while_its_thread_blocks_exits_once_the_thread_has_ended(
) -> None:
    call = Blocking()

    async def fails() -> None:
        await call.entered()
        call.release_in(0.05)
        raise RuntimeError("a sibling's bug")

    try:
        with pytest.raises(ExceptionGroup):
            async with asyncio.TaskGroup() as group:
                waiting = group.create_task(in_thread(call))
                group.create_task(fails())
        assert call.ended.is_set()  # the group's ``async with`` was left after the thread's end
        assert waiting.cancelled()
    finally:
        call.release.set()


async def test_a_cancelled_caller_waits_for_its_thread_then_raises_the_cancellation() -> None:
    call = Blocking()
    try:
        runner = asyncio.create_task(in_thread(call))
        await call.entered()
        runner.cancel()
        await asyncio.sleep(0.02)
        runner.cancel()  # cancelled again meanwhile: it still waits
        await asyncio.sleep(0.02)
        assert not runner.done() and not call.ended.is_set()
        call.release_in(0.02)
        with pytest.raises(asyncio.CancelledError):
            await runner
        assert call.ended.is_set()
    finally:
        call.release.set()


async def test_a_timeout_over_a_thread_waits_for_it_and_is_still_a_timeout() -> None:
    call = Blocking()
    asyncio.get_running_loop().call_later(0.05, call.release.set)
    with pytest.raises(TimeoutError):  # the cancellation is the timeout's: it converts it
        async with asyncio.timeout(0.01):
            await in_thread(call)
    assert call.ended.is_set()


async def test_a_cancelled_caller_waits_its_patience_then_leaves_the_thread_running() -> None:
    # A database call hung for good must not hold a halt: past its patience the caller goes.
    call = Blocking()
    try:
        with capture_logs() as logs, patience(0.1):
            runner = asyncio.create_task(in_thread(call))
            await call.entered()
            runner.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(runner), 2)
        assert not call.ended.is_set()  # left running, said in the log
        assert [(e["event"], e["waited_s"]) for e in logs] == [
            ("a blocking call outlived its caller's cancellation: left running", 0.1)]
    finally:
        call.release.set()
    assert await asyncio.to_thread(call.ended.wait, 2)


def test_a_thread_left_running_does_not_hold_the_process_exit(tmp_path: Path) -> None:
    # An executor's threads are joined when the loop and the interpreter end: the process
    # of a night halted over a hung call would never exit.
    script = """
import asyncio, threading
from app.tasks import in_thread, patience

async def main():
    with patience(0.1):
        runner = asyncio.create_task(in_thread(threading.Event().wait))
    await asyncio.sleep(0.2)
    runner.cancel()
    try:
        await runner
    except asyncio.CancelledError:
        print("halted")

asyncio.run(main())
"""
    ended = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=20, cwd=Path(__file__).resolve().parents[2])
    assert (ended.returncode, ended.stdout.splitlines()[-1:]) == (0, ["halted"]), ended.stderr


async def test_in_thread_returns_raises_and_carries_the_callers_context() -> None:
    # The context travels as with asyncio.to_thread: the write budget and the log's batch_id.
    where = contextvars.ContextVar("where", default="unset")
    where.set("the caller's")
    assert await in_thread(lambda suffix: where.get() + suffix, "!") == "the caller's!"
    with pytest.raises(ZeroDivisionError):
        await in_thread(lambda: 1 / 0)


# --- engine.run_until_halted -----------------------------------------------------------------


class FakeScheduler:
    """What run_until_halted needs of the scheduler: work that ends once requests are refused."""

    def __init__(self, *, drains: bool = True) -> None:
        self.stopped = False
        self.closed: BaseException | None = None
        self.refused = asyncio.Event()
        self.drains = drains
        self.work_ended = False

    def stop(self) -> None:
        self.stopped = True

    async def drained(self) -> None:
        if not self.drains:
            await SlowToCancel()()

    def close(self, error: BaseException) -> None:
        self.closed = error
        self.refused.set()

    async def work(self, seconds: float | None = None) -> None:
        try:
            if seconds is not None:
                await asyncio.sleep(seconds)
                return
            await self.refused.wait()  # its tickers end unfinished, and the run returns
        finally:
            self.work_ended = True


async def test_run_until_halted_leaves_nothing_when_the_work_finishes() -> None:
    scheduler, halt = FakeScheduler(), Halt()
    assert not await left_behind(lambda: run_until_halted(scheduler, scheduler.work(0.01), halt))
    assert scheduler.work_ended and not scheduler.stopped


async def test_run_until_halted_leaves_nothing_after_a_halt_with_grace() -> None:
    scheduler, halt = FakeScheduler(), Halt()
    asyncio.get_running_loop().call_later(0.01, halt.request,
                                          HaltReason("interrupted", "test", 130, 5.0))
    before = tasks_now()
    await run_until_halted(scheduler, scheduler.work(), halt)
    assert tasks_now() == before
    # Drained at once, so the waiting requests were refused, and that ended the work.
    assert scheduler.stopped and isinstance(scheduler.closed, BatchStopped)
    assert scheduler.work_ended


async def test_run_until_halted_leaves_nothing_after_a_hurried_halt() -> None:
    scheduler, halt = FakeScheduler(drains=False), Halt()
    loop = asyncio.get_running_loop()
    loop.call_later(0.01, halt.request, HaltReason("interrupted", "first", 130, 5.0))
    loop.call_later(0.02, halt.request, HaltReason("interrupted", "second", 130, 0.0))
    assert not await left_behind(lambda: run_until_halted(scheduler, scheduler.work(10), halt))
    assert scheduler.closed is None  # hurried: cancelled, not refused
    assert scheduler.work_ended


async def test_run_until_halted_leaves_nothing_when_it_is_cancelled_while_draining() -> None:
    scheduler, halt = FakeScheduler(drains=False), Halt()
    asyncio.get_running_loop().call_later(0.005, halt.request,
                                          HaltReason("interrupted", "test", 130, 5.0))
    assert not await cancelled_after(
        0.02, lambda: run_until_halted(scheduler, scheduler.work(10), halt))
    assert scheduler.work_ended


# --- server.ServerSet.after_failure -------------------------------------------------------------


class Refused(Unread):
    """A /metrics reader whose every reading fails: the server does not answer."""

    async def read(self) -> None:
        return None


def down_server() -> Server:
    """A server that does not answer its reader, under a budget no test reaches."""
    llm = SimpleNamespace(settings=load_settings())
    server = Server(0, "http://llm.test:8000/v1", llm, Strategy.parse("fixed-2"),  # type: ignore[arg-type]
                    gauges=Refused())  # type: ignore[arg-type]
    ServerSet([server], asyncio.Event(), halt=Halt(), outage_budget_s=60)
    return server


def after_failure(server: Server) -> Callable[[], Awaitable[Any]]:
    """Return the wait of a call that met a server fault at ``server``."""
    assert server.servers is not None
    return lambda: server.servers.after_failure(server, 0.0)  # type: ignore[union-attr]


async def test_after_failure_leaves_nothing_when_the_server_comes_back() -> None:
    server = down_server()
    asyncio.get_running_loop().call_later(0.01, server.reading, SimpleNamespace())
    assert not await left_behind(after_failure(server))
    assert server.up


async def test_after_failure_leaves_nothing_when_the_budget_runs_out() -> None:
    server = down_server()
    servers = server.servers
    assert servers is not None
    asyncio.get_running_loop().call_later(0.01, lambda: servers.judge(servers.clock() + 61))
    before = tasks_now()
    with pytest.raises(ServerOutage):
        await after_failure(server)()
    assert tasks_now() == before


async def test_after_failure_leaves_nothing_when_cancelled() -> None:
    server = down_server()
    assert not await cancelled_after(0.01, after_failure(server))


# --- client.TickerClient._unless_gone --------------------------------------------------------


class Gone(asyncio.Event):
    """The servers' health event, whose waiter needs a moment to end once cancelled."""

    async def wait(self) -> Any:
        try:
            return await super().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.02)
            raise


def two_endpoints() -> tuple[Any, Any]:
    """Return (a ticker's client as _unless_gone sees it, its endpoint): one more is up."""
    health = Gone()  # what go_down sets, as the real endpoint's change of health does
    endpoint = SimpleNamespace(url="http://gpu0.test:8000/v1", name="http://gpu0.test:8000/v1",
                               up=True, gone=health)
    other = SimpleNamespace(url="http://gpu1.test:8000/v1", name="http://gpu1.test:8000/v1",
                            up=True)
    endpoints = SimpleNamespace(several=True, alternative=lambda e: other,
                                health_event=lambda: health)
    return SimpleNamespace(servers=endpoints), endpoint


async def test_a_health_change_between_a_look_and_its_wait_is_not_missed() -> None:
    # _unless_gone looks at its endpoint, then waits for a change; a change that comes before
    # the wait first runs must still end it, or the call stays on a dead endpoint.
    flip = SimpleNamespace(up=False)
    endpoints = ServerSet([flip, flip], asyncio.Event())  # type: ignore[list-item]
    waiter = asyncio.create_task(endpoints.health_event().wait())
    endpoints.health_changed()  # before ``waiter`` has run at all
    assert await asyncio.wait_for(waiter, timeout=1.0)


def go_down(endpoint: Any) -> None:
    endpoint.up = False
    endpoint.gone.set()


async def test_a_routed_call_leaves_nothing_when_it_answers() -> None:
    client, endpoint = two_endpoints()

    async def call() -> str:
        await asyncio.sleep(0.01)
        return "answer"

    before = tasks_now()
    assert await TickerClient._unless_gone(client, endpoint, call()) == "answer"
    assert tasks_now() == before


async def test_a_routed_call_leaves_nothing_when_its_endpoint_goes() -> None:
    client, endpoint = two_endpoints()
    slow = SlowToCancel()
    asyncio.get_running_loop().call_later(0.01, go_down, endpoint)
    before = tasks_now()
    with pytest.raises(EndpointGone):
        await TickerClient._unless_gone(client, endpoint, slow())
    assert slow.ended  # the cut call ended before the call was sent elsewhere
    assert tasks_now() == before


async def test_a_routed_call_leaves_nothing_when_cancelled() -> None:
    client, endpoint = two_endpoints()
    slow = SlowToCancel()
    assert not await cancelled_after(
        0.01, lambda: TickerClient._unless_gone(client, endpoint, slow()))
    assert slow.ended


# --- signals ---------------------------------------------------------------------------------


async def test_the_batch_runs_in_the_signal_handlers_own_task() -> None:
    tasks: list[asyncio.Task[Any] | None] = []

    async def work() -> str:
        tasks.append(asyncio.current_task())
        await asyncio.sleep(0)
        return "done"

    async def outer() -> str:
        tasks.append(asyncio.current_task())
        return await _stop_on_signals(work(), Halt(), 1.0)

    before = tasks_now()
    assert await asyncio.create_task(outer()) == "done"
    assert tasks[0] is tasks[1]  # no task of its own, so none to outlive the call
    assert tasks_now() == before


async def test_a_signal_without_a_halt_cancels_the_work_and_leaves_nothing() -> None:
    slow = SlowToCancel()
    asyncio.get_running_loop().call_later(0.01, os.kill, os.getpid(), signal.SIGTERM)
    before = tasks_now()
    runner = asyncio.create_task(_stop_on_signals(slow(), None, 1.0))
    with pytest.raises(asyncio.CancelledError):
        await runner
    assert slow.ended
    assert tasks_now() == before


async def test_a_signal_with_a_halt_asks_for_a_stop() -> None:
    halt = Halt()
    scheduler = FakeScheduler()
    asyncio.get_running_loop().call_later(0.01, os.kill, os.getpid(), signal.SIGTERM)
    before = tasks_now()
    await _stop_on_signals(run_until_halted(scheduler, scheduler.work(), halt), halt, 5.0)
    assert halt.reason is not None and halt.reason.grace_s == 5.0
    assert "SIGTERM" in halt.reason.message
    assert scheduler.work_ended
    assert tasks_now() == before


# --- progress --------------------------------------------------------------------------------


@pytest.mark.parametrize("ending", ENDINGS)
async def test_the_progress_loops_end_with_its_context(ending: str, sqlite_engine: Engine
                                                       ) -> None:
    shown = BatchProgress(1, 2, read_servers(), console=Console(file=io.StringIO()),
                          engine=sqlite_engine)

    async def batch(end: End) -> None:
        before = tasks_now()
        async with shown:
            # One loop (an ETA reading, then the line that shows it), while the batch runs.
            assert tasks_now() - before == set(shown._loops) and len(shown._loops) == 1
            await end()

    assert not await run_to_its_end(ending, batch)


# --- the /metrics readers --------------------------------------------------------------------


@pytest.mark.parametrize("ending", ENDINGS)
async def test_the_metrics_readers_end_with_their_context_the_last_reading_taken(
        ending: str) -> None:
    reads: list[str] = []
    async with httpx.AsyncClient(transport=transport(seen=reads)) as client:
        # Read at once, then not for 60 s: any other read is the batch's end.
        sampler = MetricsSampler("http://x/v1", None, None, interval_s=60, client=client)
        servers = read_servers(sampler)

        async def batch(end: End) -> None:
            before = tasks_now()
            async with servers.taking():
                assert len(tasks_now() - before) == 2  # the reader and the loop's lag watch
                while not reads:
                    await asyncio.sleep(0.005)
                await end()

        assert not await run_to_its_end(ending, batch)
        assert len(reads) == 2  # the last reading was taken, not cut, however the batch ended
        assert servers.first.limits.failed == 0 and sampler.latest is not None


# --- a whole batch ---------------------------------------------------------------------------


async def run_wide_batch(engine: Engine, halt_at: int | None = None) -> str:
    """Run one ticker of 24 requests through the real engine and fake server; halt (with
    grace) when the fake receives request ``halt_at``; return the batch's status."""
    settings = load_settings(llm_base_url=BASE_URL, check_context_length=False,
                             retry_backoff_s=0, record_requests=False,
                             metrics_interval_s=0.05, shutdown_grace_s=5.0)
    load: Workload = {"T0": [WorkItem("T0", 0, f"n{i}", {
        "model": "fake-model", "max_tokens": 16,
        "messages": [{"role": "user", "content": f"request {i}"}]}) for i in range(24)]}
    runner: BatchEngine

    def reply(chat: ChatRequest) -> Reply:
        if chat.index == halt_at:
            runner.halt.request(HaltReason("interrupted", "test halt", 130, 5.0))
        return Reply(" tok" * 4, token_delay_s=0.002)

    server = FakeServer(reply, capacity=4)
    runner = BatchEngine(settings, engine, http_client=server.client())

    async def work(ticker: str, gated: TickerClient, batch_id: int) -> list[object]:
        return await play(load[ticker], gated, batch_id)

    outcome = await runner.run(BatchPlan("bench", date.today(), ["T0"], 1, "adaptive",
                                         "adaptive"), TickerWork(work))
    return outcome.status


async def test_a_replayed_tickers_requests_end_with_its_first_unexpected_error() -> None:
    # A bug in one request (not an LLMError, which releases its dependants and is raised
    # once every request ended) cancels its siblings: none is left calling the server.
    slow = SlowToCancel()

    class Gated:
        async def send(self, tag: Any, body: dict[str, Any]) -> None:
            if body["n"] == 0:
                await asyncio.sleep(0.01)
                raise RuntimeError("a bug")
            await slow()

    items = [WorkItem("AAA", 0, f"node{n}", {"n": n}) for n in range(3)]
    before = tasks_now()
    with pytest.raises(RuntimeError, match="a bug"):
        await play(items, Gated(), 1)  # type: ignore[arg-type]
    assert slow.ended
    assert not {t for t in tasks_now() - before if not t.done()}


async def test_a_whole_batch_leaves_nothing_running(sqlite_engine: Engine) -> None:
    before = tasks_now()
    assert await run_wide_batch(sqlite_engine) == "succeeded"
    assert tasks_now() == before


async def test_a_halted_batch_leaves_nothing_running(sqlite_engine: Engine) -> None:
    before = tasks_now()
    assert await run_wide_batch(sqlite_engine, halt_at=6) == "interrupted"
    assert tasks_now() == before


async def test_a_body_that_fails_before_its_end_fails_the_ending_not_hangs_it() -> None:
    # An assertion that fails before end() must fail the test, not leave it waiting.
    async def batch(end: End) -> None:
        raise AssertionError("before its end")

    with pytest.raises(AssertionError, match="before its end"):
        await asyncio.wait_for(run_to_its_end("is-cancelled", batch), 5)
