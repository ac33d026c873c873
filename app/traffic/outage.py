"""Watch the LLM server during a batch: pause admission while it is down, give up past a budget.

A vLLM server that is restarted, or dies and is brought back by systemd, is gone for seconds
to minutes. Every call sent meanwhile fails at once, so without a watch a short outage would
use up every call's retries and fail every ticker. Instead:

- a call that meets a server fault asks for a ``/health`` probe at once (``confirm``);
  while the server does not answer it is probed every ``server_probe_interval_s``;
- while the server does not answer (or its ``/metrics`` cannot be read, see ``note_metrics``)
  the gate lets no new request through; calls that failed wait in ``confirm`` and retry when
  it answers again;
- when it has not answered for ``outage_budget_s``, the batch is halted as ``interrupted``
  (resumable with ``nightdesk run --resume``) and the waiting calls raise ServerOutage.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import Any

import httpx
import structlog

from app.errors import ServerOutage
from app.traffic.clock import Clock, loop_clock
from app.traffic.gate import Gate
from app.traffic.halt import Halt, HaltReason
from app.traffic.tasks import wait_first
from serving.urls import redact, server_root

log = structlog.get_logger(__name__)

HOLD = "server down"
# Consecutive unreadable /metrics readings that count as the server being in trouble.
METRICS_FAILURES_DOWN = 2


class ServerWatch:
    """Know whether the LLM server answers; hold the gate while it does not."""

    def __init__(self, base_url: str, *, budget_s: float, interval_s: float, halt: Halt,
                 gate: Gate | None = None, client: httpx.AsyncClient | None = None,
                 resume_hint: str = "", clock: Clock = loop_clock) -> None:
        self.root = server_root(base_url)
        self.budget_s = budget_s
        self.interval_s = interval_s
        self.halt = halt
        self.gate = gate
        self.resume_hint = resume_hint
        self.clock = clock  # what the outage budget and its records are measured on
        # A probe that hangs says as much as one refused: give up on it within seconds.
        self._client = client or httpx.AsyncClient(timeout=httpx.Timeout(5.0))
        self._owns_client = client is None
        self.up = asyncio.Event()
        self.up.set()
        self.gave_up = asyncio.Event()
        self.down_since: float | None = None
        self.outages: list[dict[str, Any]] = []  # start and seconds of each outage, for the report
        self._probe_lock = asyncio.Lock()
        self._last_probe_started = 0.0
        self._metrics_failures = 0
        self._wake = asyncio.Event()

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    # --- what calls use ----------------------------------------------------------------------

    async def confirm(self) -> None:
        """Probe now; return once the server answers, raise ServerOutage past the budget."""
        await self._probe_fresh()
        while not self.up.is_set():
            if self.gave_up.is_set():
                raise ServerOutage(self._outage_message())
            await wait_first(self.up.wait(), self.gave_up.wait())
        if self.gave_up.is_set():
            raise ServerOutage(self._outage_message())

    def note_metrics(self, ok: bool) -> None:
        """Count /metrics readings: unreadable ones in a row mean the server is in trouble."""
        self._metrics_failures = 0 if ok else self._metrics_failures + 1
        if self._metrics_failures == METRICS_FAILURES_DOWN:
            self._wake.set()  # probe now; the probe counts these failures as down

    # --- the watch ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Probe while the server is down, until cancelled or the outage budget is spent.

        While it answers there is nothing to probe: a call that fails asks (``confirm``),
        and so do unreadable /metrics (``note_metrics``). Probing a busy server on a timer
        would only risk a slow answer being taken for an outage.
        """
        try:
            while not self.gave_up.is_set():
                if self.up.is_set():
                    await self._wake.wait()
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout=self.interval_s)
                self._wake.clear()
                await self._probe_fresh()
        finally:
            await self.aclose()

    async def _probe_fresh(self) -> None:
        """Probe unless a probe started after this call asked (callers at once share one)."""
        asked = self.clock()
        async with self._probe_lock:
            if self._last_probe_started >= asked:
                return
            self._last_probe_started = self.clock()
            ok = await self._answers() and self._metrics_failures < METRICS_FAILURES_DOWN
            self._update(ok)

    async def _answers(self) -> bool:
        try:
            response = await self._client.get(self.root + "/health")
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def _update(self, ok: bool) -> None:
        now = self.clock()
        if ok and self.down_since is not None:
            seconds = now - self.down_since
            self.outages[-1]["seconds"] = round(seconds, 1)
            log.warning("LLM server answers again; admission resumes", down_s=round(seconds, 1))
            self.down_since = None
            self.up.set()
            if self.gate is not None:
                self.gate.release(HOLD)
        elif not ok and self.down_since is None:
            self.down_since = now
            self.outages.append({"start": datetime.now(UTC).isoformat(), "seconds": None})
            log.warning("LLM server does not answer; admission paused",
                        server=self.root, budget_s=self.budget_s)
            self.up.clear()
            self._wake.set()  # the watch now probes on its timer until it answers
            if self.gate is not None:
                self.gate.hold(HOLD)
        elif not ok and self.down_since is not None and now - self.down_since > self.budget_s:
            self.outages[-1]["seconds"] = round(now - self.down_since, 1)
            self.gave_up.set()
            self.halt.request(HaltReason("interrupted", self._outage_message(),
                                         ServerOutage.exit_code))

    def _outage_message(self) -> str:
        return (f"the LLM server at {redact(self.root)} did not answer for {self.budget_s:.0f} s "
                f"(the outage budget): batch interrupted{self.resume_hint}")
