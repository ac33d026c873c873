"""The one reader of a vLLM server's ``/metrics``: its Server takes each reading, applies it
and has it stored as a row; the reader calls nothing above it (docs/architecture.md).

Behind a router (vllm-router lists its servers at ``/workers``; or ``llm_router_servers``
names them) the reading is every server's, read one by one and added up as one server of
several engines (serving.metrics.combine): the router's own ``/metrics`` is one server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from dataclasses import asdict
from typing import Any

import httpx
import structlog
from sqlalchemy import Engine, insert
from sqlalchemy.exc import SQLAlchemyError

from app.db.models import ServerSample
from app.errors import ServerError, first_line
from app.tasks import in_thread
from serving.metrics import (
    CacheConfig,
    MetricsSnapshot,
    afetch_metrics_text,
    combine,
    combine_cache_configs,
    parse_cache_config,
    parse_metrics,
)
from serving.router import aanswers, afetch_workers
from serving.urls import redact

log = structlog.get_logger(__name__)

READ_TIMEOUT_S = 5.0
# How often a router is asked again for the servers behind it (servers added or dropped).
FLEET_EVERY_S = 30.0
LAG_PROBE_S = 0.25  # how often the client's own loop is checked for running late


class MetricsSampler:
    """Read /metrics: one reading (``read``, None for a failed one), or paced (``readings``).

    Paced, reads come every ``interval_s`` (None: only when asked), every ``probe_s`` while
    they fail, and at once when ``fresh`` asks. ``store`` keeps one as a ``server_samples``
    row of ``batch_id``; a failed write is logged and skipped, never failing the batch.
    """

    def __init__(self, base_url: str, engine: Engine | None, batch_id: int | None, *,
                 interval_s: float | None, probe_s: float | None = None,
                 client: httpx.AsyncClient | None = None, endpoint: str | None = None,
                 fleet: list[str] | None = None, discover: bool = False) -> None:
        self.base_url = base_url
        self.interval_s = interval_s
        self.probe_s = probe_s if probe_s is not None else interval_s
        self.endpoint = None if endpoint is None else redact(endpoint)  # stored in every row
        self.latest: MetricsSnapshot | None = None
        # From vllm:cache_config_info, every reading: a restarted server may have another.
        self.kv_capacity: int | None = None
        self.block_size: int | None = None
        self.failing = False  # the last read failed
        # The servers behind a router at ``base_url`` (empty: a server itself; None: not
        # known yet, asked of the router's /workers at the next reading when ``discover``).
        self.fleet: list[str] | None = (fleet or None) if discover else (fleet or [])
        self._discover = discover and not fleet  # servers named by the setting: not asked
        self.fleet_every_s = FLEET_EVERY_S
        self._fleet_asked: float | None = None  # when /workers was last asked (monotonic)
        self.fleet_read: int | None = None  # servers of the fleet read at the last reading
        self._unseen: set[str] = set()  # servers whose /metrics could not be read, said once
        self._engine = engine
        self._batch_id = batch_id
        # One connection for the whole batch; closed in aclose() only when made here.
        self._client = client or httpx.AsyncClient(timeout=READ_TIMEOUT_S)
        self._owns_client = client is None
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()  # a read is asked for now (or the reader stops)
        # Set once the next paced read to begin has been taken, or no more will be.
        self._next = asyncio.Event()
        # How late our own loop ran since the last row: busy, its gauges are stale.
        self._lag = 0.0

    async def read(self) -> MetricsSnapshot | None:
        """Take one reading; return None when it could not be read."""
        try:
            await self.learn_fleet()
            if self.fleet:  # the servers answering says nothing of the router in front
                await aanswers(self.base_url, client=self._client, timeout_s=READ_TIMEOUT_S)
            snapshot = await self._read_fleet() if self.fleet else None
            if snapshot is None:
                text = await afetch_metrics_text(self.base_url, client=self._client,
                                                  timeout_s=READ_TIMEOUT_S)
                snapshot = parse_metrics(text)
                if self.fleet == []:  # a server's own page (a router's is one server's)
                    with contextlib.suppress(ServerError):  # no cache config: no capacity
                        self._take_capacity(parse_cache_config(text))
        except ServerError as error:
            self.failing = True
            log.warning("metrics read failed; sample skipped", error=str(error),
                        endpoint=self.endpoint)
            return None
        self.failing = False
        self.latest = snapshot
        return snapshot

    async def store(self, snapshot: MetricsSnapshot, chain_slots: int | None) -> None:
        """Store a reading as a row, with how late our loop ran since the last and the
        ``chain_slots`` its server has once it took it (the ETA reads them from the rows)."""
        if self._engine is not None and self._batch_id is not None:
            try:
                row = sample_row(snapshot, self._batch_id, self.endpoint, self._lag, chain_slots)
                self._lag = 0.0
                await in_thread(_insert, self._engine, row)
            except SQLAlchemyError as error:
                log.warning("server sample not stored", error=first_line(error))

    async def learn_fleet(self) -> None:
        """Ask the router's /workers for the servers behind it at the first reading and every
        ``fleet_every_s`` after, so servers added, dropped from its list or listed late (a
        router still starting) are read; a front without /workers (a vLLM server: 4xx) is
        asked no more. An ask that fails keeps what was known (the reading says the rest)."""
        now = time.monotonic()
        if not self._discover or (self._fleet_asked is not None
                                  and now - self._fleet_asked < self.fleet_every_s):
            return
        self._fleet_asked = now
        try:
            listed = await afetch_workers(self.base_url, client=self._client,
                                          timeout_s=READ_TIMEOUT_S)
        except ServerError:
            return
        if listed is None:
            self._discover = False
            if self.fleet is None:
                self.fleet = []
        elif listed and listed != self.fleet:
            log.info("a router: each server behind it is read for capacity and pressure",
                     endpoint=self.endpoint, servers=redact(",".join(listed)))
            self.fleet = listed

    async def fresh(self) -> None:
        """Return once a paced read begun after this call has been taken by the owner of
        ``readings``, or once ``readings`` is over (its owner must be taking them)."""
        taken = self._next
        self._wake.set()
        await taken.wait()

    async def _read_fleet(self) -> MetricsSnapshot | None:
        """Read every server behind the router; return their readings as one, and take the
        capacity of those read (None, capacity unknown: none could be read)."""
        fleet = self.fleet or []
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self._read_server(url)) for url in fleet]
        read = [r for r in (t.result() for t in tasks) if r is not None]
        if not read and self.fleet_read != 0:
            # The router's own /metrics is one server's: its capacity would size the budget
            # for one server of several. Without capacity, admission is by request count.
            log.warning("cannot read /metrics of any server behind the router: admission by "
                        "request count, the router's own /metrics for health",
                        endpoint=self.endpoint, servers=len(fleet))
        self.fleet_read = len(read)
        if not read:
            self.kv_capacity = None
            return None
        configs = [config for _, config in read]
        self._take_capacity(None if None in configs
                            else combine_cache_configs([c for c in configs if c is not None]))
        return combine([snapshot for snapshot, _ in read])

    async def _read_server(self, url: str) -> tuple[MetricsSnapshot, CacheConfig | None] | None:
        """Read one server behind the router (None: it could not be read, said once)."""
        try:
            text = await afetch_metrics_text(url, client=self._client, timeout_s=READ_TIMEOUT_S)
            read = parse_metrics(text), parse_cache_config(text)
        except ServerError as error:
            if url not in self._unseen:
                self._unseen.add(url)
                log.warning("a server behind the router cannot be read: left out of the "
                            "capacity until it can", server=redact(url), error=str(error))
            return None
        self._unseen.discard(url)
        return read

    def _take_capacity(self, config: CacheConfig | None) -> None:
        tokens = config.tokens() if config is not None else None
        size = config.labels.get("block_size", "") if config is not None else ""
        if tokens is not None and size.isdigit() and int(size) > 0:
            self.kv_capacity, self.block_size = tokens, int(size)

    async def readings(self) -> AsyncGenerator[MetricsSnapshot | None, None]:
        """Yield a reading at the pace above until ``stop``, then (on an interval) one last:
        the batch's end. The next is not begun before the owner asks for it, so a read for
        ``fresh`` is applied when that returns."""
        loop = asyncio.get_running_loop()
        pause: float | None = 0.0 if self.interval_s is not None else None
        taken = self._next
        try:
            while True:
                # Keep the cadence even when a read is slow; wake at once when asked or stopped.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=pause)
                if self._stopping.is_set():
                    break
                self._wake.clear()
                started = loop.time()
                taken, self._next = self._next, asyncio.Event()
                yield await self.read()
                taken.set()  # the owner took it: it asks for the next
                every = self.probe_s if self.failing else self.interval_s
                pause = None if every is None else max(0.0, every - (loop.time() - started))
        finally:  # whoever waits goes: no more paced reads come
            taken.set()
            self._next.set()
            self._stopping.set()  # the lag watch ends too (also when the owner gave up)
        if self.interval_s is not None:
            yield await self.read()

    async def watch_lag(self) -> None:
        """Note how late our loop runs (for the next row) until the readings stop; run it beside."""
        # A timer always pending fires late by however long the loop was kept busy.
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            due = loop.time() + LAG_PROBE_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=LAG_PROBE_S)
            late = loop.time() - due
            if not self._stopping.is_set() and late > 0:
                self._lag = max(self._lag, late)

    def stop(self) -> None:
        """End ``readings`` (not cancelled: the reading being taken and its last one are)."""
        self._stopping.set()
        self._wake.set()

    async def aclose(self) -> None:
        """Close the connection, when made here."""
        if self._owns_client:
            await self._client.aclose()


def sample_row(snapshot: MetricsSnapshot, batch_id: int, endpoint: str | None = None,
               client_lag_s: float | None = None,
               chain_slots: int | None = None) -> dict[str, Any]:
    """Return the ``server_samples`` row for one reading (column names match the model)."""
    values = asdict(snapshot)
    return {"batch_id": batch_id, "sampled_at": values.pop("taken_at"), **values,
            "endpoint": endpoint, "client_lag_s": client_lag_s, "chain_slots": chain_slots}


def _insert(engine: Engine, row: dict[str, Any]) -> None:
    with engine.begin() as conn:
        conn.execute(insert(ServerSample), [row])
