"""Run single-ticker reruns for the web page as ``nightdesk rerun`` subprocesses.

A subprocess, not a task inside the web server: a rerun is a whole batch (17 calls per
sample, a /metrics sampler, database writes), and in its own process it cannot slow the
pages down or take the server with it if it fails; it also takes exactly the path an
operator's ``nightdesk rerun`` takes — settings, data, lock, exit codes, a ``rerun`` row in
``batches``. The queue supervises the processes from one ``asyncio.TaskGroup``: when the
web server stops, queued reruns are dropped and running ones get SIGTERM, which the CLI
records as ``interrupted``; nothing is left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import field
from datetime import UTC, date, datetime
from typing import Any

import structlog
from pydantic import Field
from pydantic.dataclasses import dataclass

from app.morning.summary import IsoDate, IsoDatetime
from serving.errors import reason

log = structlog.get_logger(__name__)

ACTIVE = ("queued", "running")
STOP_GRACE_S = 30.0


@dataclass
class RerunJob:
    """One requested rerun of one ticker, as this web process knows it; its JSON (in
    ``/api/tickers/…`` and the ticker page) leaves out the output's ``tail``."""

    ticker: str
    as_of: IsoDate
    samples: int
    state: str = "queued"  # queued | running | succeeded | failed | cancelled
    queued_at: IsoDatetime = field(default_factory=lambda: datetime.now(UTC))
    started_at: IsoDatetime | None = None
    finished_at: IsoDatetime | None = None
    exit_code: int | None = None
    message: str | None = None  # the process's last line of output when it failed
    tail: deque[str] = Field(default_factory=lambda: deque(maxlen=40), exclude=True)


def cli_command(job: RerunJob) -> list[str]:
    """Return the command line of ``nightdesk rerun`` for a job, with this interpreter."""
    return [sys.executable, "-m", "app.cli", "rerun", job.ticker,
            "--as-of", job.as_of.isoformat(), "--samples", str(job.samples)]


class RerunQueue:
    """Start at most ``parallel`` reruns at a time; never two for the same ticker."""

    def __init__(self, *, parallel: int = 1, env: dict[str, str] | None = None,
                 command: Callable[[RerunJob], list[str]] = cli_command) -> None:
        self._slots = asyncio.Semaphore(parallel)
        self._env = env
        self._command = command
        self._jobs: dict[str, RerunJob] = {}
        self._group: asyncio.TaskGroup | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> RerunQueue:
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        # Cancelling a task drops a queued rerun, or stops its process (SIGTERM, then kill).
        for task in self._tasks:
            task.cancel()
        assert self._group is not None
        try:
            await self._group.__aexit__(*exc)
        finally:
            self._group = None

    def job(self, ticker: str) -> RerunJob | None:
        """Return the newest rerun this process was asked for, for one ticker."""
        return self._jobs.get(ticker)

    def active(self, ticker: str) -> RerunJob | None:
        job = self._jobs.get(ticker)
        return job if job is not None and job.state in ACTIVE else None

    def submit(self, ticker: str, as_of: date, samples: int) -> tuple[RerunJob, bool]:
        """Queue a rerun; return (job, True), or (the job already queued or running, False).

        Called on the event loop with no await between the check and the insert, so two
        requests for the same ticker cannot both start one.
        """
        if self._group is None:
            raise RuntimeError("the rerun queue is not running")
        current = self.active(ticker)
        if current is not None:
            return current, False
        job = RerunJob(ticker, as_of, samples)
        self._jobs[ticker] = job
        task = self._group.create_task(self._run(job), name=f"rerun-{ticker}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job, True

    async def _run(self, job: RerunJob) -> None:
        try:
            async with self._slots:
                await self._run_process(job)
        except asyncio.CancelledError:
            if job.state == "queued":
                job.state, job.message = "cancelled", "the web server stopped first"
            raise

    async def _run_process(self, job: RerunJob) -> None:
        job.state, job.started_at = "running", datetime.now(UTC)
        log.info("rerun started", ticker=job.ticker, as_of=str(job.as_of))
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._command(job), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, **(self._env or {})})
        except OSError as error:
            self._finish(job, None, f"could not start: {reason(error)}")
            return
        except asyncio.CancelledError:
            # Stopped while its process started: asyncio kills a process it was still
            # starting; the job must not read "running" for ever.
            self._finish(job, None, "stopped with the web server")
            raise
        try:
            assert proc.stdout is not None
            async for raw in proc.stdout:
                line = raw.decode(errors="replace").strip()
                if line:
                    job.tail.append(line)
            code = await proc.wait()
        except asyncio.CancelledError:
            self._finish(job, await self._stop(proc), "stopped with the web server")
            raise
        self._finish(job, code, None)

    def _finish(self, job: RerunJob, code: int | None, message: str | None) -> None:
        job.exit_code, job.finished_at = code, datetime.now(UTC)
        job.state = "succeeded" if code == 0 else "failed"
        job.message = message or (None if code == 0 else
                                  (job.tail[-1] if job.tail else f"exit code {code}"))
        log.info("rerun finished", ticker=job.ticker, state=job.state, exit_code=code)

    async def _stop(self, proc: asyncio.subprocess.Process) -> int:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)  # the CLI records its batch as interrupted
        try:
            return await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            return await proc.wait()
