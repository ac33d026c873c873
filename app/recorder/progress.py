"""Show a batch's progress live on a terminal, or as periodic log lines when not a TTY, and
store a reading of its ETA at once and every ``LOG_EVERY_S`` (``app.morning.eta``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from rich.console import Console
from rich.live import Live
from rich.table import Table
from sqlalchemy import Engine

from app.errors import first_line
from app.llm import CallStats
from app.morning import eta
from app.morning.nightstatus import interval, span
from app.tasks import beside, in_thread
from app.traffic.server import ServerSet
from serving.metrics import MetricsSnapshot

log = structlog.get_logger(__name__)

LOG_EVERY_S = 15.0


@dataclass(frozen=True)
class ProgressState:
    """The numbers a batch's progress shows (``BatchProgress.state``), logged in this order."""

    tickers_done: int
    tickers_failed: int
    tickers_total: int
    attempts: int  # HTTP requests so far (the page's and report's "calls" are answered ones)
    failed_attempts: int
    output_tok_s: float  # finished calls' output over the batch so far
    server_tok_s: float | None  # the servers' generation counter: streaming answers count too
    running: float | None
    waiting: float | None
    kv_usage: float | None
    limit: int | None
    budget_tokens: int | None  # the KV token budget (None: none, or the capacity unknown)
    reserved_tokens: int | None
    admission: str | None  # adaptive admission without its gauges runs blind: says so
    elapsed_s: int
    eta_s: int | None  # app.morning.eta: never 0 while a call is left; None before a basis
    eta_low_s: int | None
    eta_high_s: int | None
    eta_level: float | None  # the share the interval held (None: uncalibrated)
    estimating: str | None  # while eta_s is None: "estimating… (why)", as the pages say
    ended: bool = False  # the line at the exit: no ETA (a reading up to LOG_EVERY_S old)


class BatchProgress:
    """Summarize tickers, calls, batch output tok/s, the server's gauges and an ETA."""

    def __init__(self, batch_id: int, total: int, servers: ServerSet,
                 console: Console | None = None, expected_calls: int | None = None,
                 engine: Engine | None = None) -> None:
        """``servers``: the batch's, read for their call totals, gauges and limits;
        ``engine``: where the batch's rows are, read for the ETA and given its readings
        (None: no ETA)."""
        self.batch_id = batch_id
        self.total = total
        self.servers = servers
        self.done = 0
        self.failed = 0
        self.expected_calls = expected_calls
        self.t0 = time.monotonic()
        self.console = console or Console(stderr=True)
        self._loops: list[asyncio.Task[None]] = []  # the readings-and-lines loop, while shown
        self._first_reading: dict[str, MetricsSnapshot] = {}  # each server's first reading seen
        self.engine = engine
        self.reading: eta.Reading | None = None  # the newest ETA reading
        self.ended = False  # the tickers' run is over: the state shows no time left

    def ticker_done(self, ok: bool) -> None:
        self.done += 1
        self.failed += not ok

    def state(self) -> ProgressState:
        """Return the numbers shown, computed from live counters (never from per-call speeds)."""
        servers = self.servers
        stats = call_totals(servers)
        tok_s = 0.0
        if stats.first_start is not None:
            span = (datetime.now(UTC) - stats.first_start).total_seconds()
            tok_s = stats.completion_tokens / span if span > 0 else 0.0
        elapsed = time.monotonic() - self.t0
        # At the end the newest reading is up to LOG_EVERY_S old: its time left is not now's.
        found = None if self.ended else self.reading
        # Several endpoints' newest gauges as one: counts summed, KV usage the highest.
        readings = [e.gauges.latest for e in servers if e.gauges is not None]
        seen = [r for r in readings if r is not None]
        first = servers.first
        limit, budget = first.gate.limit, first.limits.budget
        if servers.several:
            # Several endpoints: their limits together; their budgets are in the log.
            limit, budget = servers.request_limit(), None
        return ProgressState(
            tickers_done=self.done - self.failed, tickers_failed=self.failed,
            tickers_total=self.total, attempts=stats.calls, failed_attempts=stats.failed,
            output_tok_s=round(tok_s, 1), server_tok_s=self._server_tok_s(),
            running=sum(r.running for r in seen) if seen else None,
            waiting=sum(r.waiting for r in seen) if seen else None,
            kv_usage=max((r.kv_cache_usage for r in seen), default=None),
            limit=limit if first.strategy.adaptive else None,
            budget_tokens=budget.limit if budget is not None else None,
            reserved_tokens=budget.reserved if budget is not None else None,
            admission=("fallback: /metrics unreadable" if any(
                e.limits.blind_since is not None for e in servers) else None),
            elapsed_s=round(elapsed),
            eta_s=None if found is None else found.whole(found.eta_s),
            eta_low_s=None if found is None else found.whole(found.eta_low_s),
            eta_high_s=None if found is None else found.whole(found.eta_high_s),
            eta_level=None if found is None else found.level,
            estimating=(found.estimating if found is not None
                        else "estimating… (first reading under way)"
                        if self.engine is not None and not self.ended else None),
            ended=self.ended)

    def _server_tok_s(self) -> float | None:
        """Return the tokens the servers generated per second since their first reading seen
        here (a restarted server's counter starts again); None before two readings."""
        tokens = span = 0.0
        for endpoint in self.servers:
            latest = endpoint.gauges.latest if endpoint.gauges is not None else None
            if latest is None:
                continue
            first = self._first_reading.get(endpoint.name)
            if first is None or latest.generation_tokens_total < first.generation_tokens_total:
                self._first_reading[endpoint.name] = first = latest
            tokens += latest.generation_tokens_total - first.generation_tokens_total
            span = max(span, (latest.taken_at - first.taken_at).total_seconds())
        return round(tokens / span, 1) if span > 0 else None

    def __rich__(self) -> Table:
        s = self.state()
        table = Table(title=f"batch {self.batch_id}", show_header=False, expand=False)
        table.add_row("tickers", f"{s.tickers_done} done · {s.tickers_failed} failed · "
                                 f"{s.tickers_total} total")
        table.add_row("attempts", f"{s.attempts} ({s.failed_attempts} failed)")
        generating = "" if s.server_tok_s is None else f" · server {s.server_tok_s} tok/s"
        table.add_row("output", f"{s.output_tok_s} tok/s in finished calls{generating}")
        kv = "—" if s.kv_usage is None else f"{s.kv_usage:.0%}"
        admitting = "" if s.limit is None else f" · admitting {s.limit}"
        if s.admission:
            admitting += f" ({s.admission})"
        table.add_row("server", f"running {s.running} · waiting {s.waiting} · KV {kv}"
                      + admitting
                      + ("" if s.budget_tokens is None else
                         f" · KV tokens {s.reserved_tokens:,}/{s.budget_tokens:,}"))
        table.add_row("time", f"{s.elapsed_s} s elapsed · ETA {eta_text(s)}")
        return table

    async def __aenter__(self) -> BatchProgress:
        """Show the progress (live on a terminal, else a log line at once, every
        ``LOG_EVERY_S`` and one at the exit, whose state is ``ended``: the counters of the
        end and no time left) and take an ETA reading at once and every
        ``LOG_EVERY_S`` (with ``engine``), in tasks of this context's own: its exit cancels
        them and waits for their end."""
        self._life = self._showing()
        await self._life.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._life.__aexit__(*exc)

    @contextlib.asynccontextmanager
    async def _showing(self) -> AsyncIterator[None]:
        terminal = self.console.is_terminal
        try:
            with (Live(self, console=self.console, refresh_per_second=2, transient=False)
                  if terminal else contextlib.nullcontext()):
                async with beside(lambda: [loop.cancel() for loop in self._loops]) as group:
                    if not terminal or self.engine is not None:
                        self._loops.append(group.create_task(self._tick_loop(not terminal),
                                                             name="progress"))
                    try:
                        yield
                    finally:
                        self.ended = True  # before the live view's last frame and line
        finally:
            self._loops = []
            if not terminal:
                log.info("progress", **asdict(self.state()))

    async def _tick_loop(self, log_lines: bool) -> None:
        # One loop, the reading before the line, so a line never shows the reading of the
        # interval before beside the counters of now. The first reading is taken at once: a
        # resumed night's rows price its calls from its start, and a night shorter than one
        # interval would otherwise show "estimating…" to its end.
        while True:
            if self.engine is not None:
                await self.take_reading(self.engine)
            if log_lines:
                log.info("progress", **asdict(self.state()))
            await asyncio.sleep(LOG_EVERY_S)

    async def take_reading(self, engine: Engine) -> None:
        """Read the ETA from the batch's rows now and store the reading; any error here (the
        database's or the estimate's own) is logged and the progress goes on."""
        try:
            found = await in_thread(eta.reading, engine, self.batch_id,
                                    datetime.now(UTC))
            await in_thread(eta.record, engine, self.batch_id, found)
        except Exception as error:  # the ETA is advice: the batch's group must not end for it
            log.warning("progress reading not stored", error=first_line(error, 1000, typed=True))
            return
        self.reading = found


def call_totals(servers: ServerSet) -> CallStats:
    """Return every endpoint's call totals added up."""
    parts = [endpoint.llm.stats for endpoint in servers]
    starts = [p.first_start for p in parts if p.first_start is not None]
    ends = [p.last_end for p in parts if p.last_end is not None]
    return CallStats(sum(p.calls for p in parts), sum(p.failed for p in parts),
                     sum(p.prompt_tokens for p in parts), sum(p.completion_tokens for p in parts),
                     min(starts) if starts else None, max(ends) if ends else None)


def eta_text(s: ProgressState) -> str:
    """Show the ETA and its interval, e.g. ``4 min 10 s (75% interval: 3 min 40 s – 5 min 20
    s)``."""
    if s.ended:
        return "none: the run ended"
    if s.eta_s is None:
        return s.estimating or "—"
    return f"{span(s.eta_s)}{interval(s.eta_low_s, s.eta_high_s, s.eta_level)}"
