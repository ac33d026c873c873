"""Model the load inside the fake vLLM server and expose it as vLLM's own ``/metrics`` text.

The fake serves at most ``capacity`` requests at once (vLLM's ``--max-num-seqs``) and admits
the oldest waiting request only when its whole answer (prompt plus completion) fits in the
KV cache that running requests leave free; the rest wait, first come first served. A running
request holds the KV blocks of its prompt and of the tokens generated so far, so KV usage
grows while it decodes, as on the real server. Because admission reserves the whole answer,
the fake never overflows its cache on its own: preemptions happen only on cue
(``preempt``), and a restart (``restart``) sets every counter back to zero.

The text is written by prometheus_client, the library vLLM itself uses, with vLLM's metric
names and labels (``engine``, ``model_name``), so the project's parser reads it as it reads
a real server's page.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

# vLLM's buckets for the request-time histograms (seconds).
TIME_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass(eq=False)
class Sequence:
    """One request inside the fake server: its size, and what it has generated so far."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    generated: int = 0
    admitted: asyncio.Event = field(default_factory=asyncio.Event)
    admitted_at: float | None = None
    first_token_at: float | None = None


@dataclass(frozen=True)
class Moment:
    """The fake's queue right after it changed (``time.monotonic()`` seconds)."""

    at: float
    running: int
    waiting: int

    @property
    def in_flight(self) -> int:
        return self.running + self.waiting


@dataclass(frozen=True)
class Scrape:
    """The values one ``/metrics`` answer carried, for comparing with what a reader stored."""

    at: float
    running: int
    waiting: int
    kv_cache_usage: float
    preemptions_total: float
    prompt_tokens_total: float
    generation_tokens_total: float


class ServerLoad:
    """Queue requests for ``capacity`` places and a KV cache of ``kv_tokens``; count like vLLM."""

    def __init__(self, *, capacity: int, kv_tokens: int, block_size: int = 16,
                 model: str = "fake-model") -> None:
        self.capacity = max(1, capacity)
        self.block_size = block_size
        self.blocks = max(1, kv_tokens // block_size)
        self.model = model
        self.cache_config = True  # publish vllm:cache_config_info, the KV capacity
        self.running: list[Sequence] = []
        self.waiting: deque[Sequence] = deque()
        self.history: list[Moment] = [Moment(time.monotonic(), 0, 0)]
        self.scrapes: list[Scrape] = []
        self._reset_counters()

    def _reset_counters(self) -> None:
        self.created = time.time()
        self.preemptions = 0.0
        self.prompt_tokens = 0.0
        self.generation_tokens = 0.0
        self.cache_queries = 0.0
        self.cache_hits = 0.0
        self.finished: Counter[str] = Counter()
        self.prefill_times: list[float] = []
        self.decode_times: list[float] = []

    # --- what the server is doing ----------------------------------------------------------

    @property
    def max_in_flight(self) -> int:
        return max(m.in_flight for m in self.history)

    @property
    def max_waiting(self) -> int:
        return max(m.waiting for m in self.history)

    def _blocks(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def kv_usage(self) -> float:
        """Return the fraction of KV blocks held by running requests (vLLM's gauge)."""
        used = sum(self._blocks(s.prompt_tokens + s.generated) for s in self.running)
        return min(1.0, used / self.blocks)

    def _fits(self, seq: Sequence) -> bool:
        if not self.running:
            return True  # an answer larger than the whole cache still runs, alone
        if len(self.running) >= self.capacity:
            return False
        reserved = sum(self._blocks(s.prompt_tokens + s.completion_tokens) for s in self.running)
        return reserved + self._blocks(seq.prompt_tokens + seq.completion_tokens) <= self.blocks

    def _moved(self) -> None:
        self.history.append(Moment(time.monotonic(), len(self.running), len(self.waiting)))

    def _schedule(self) -> None:
        while self.waiting and self._fits(self.waiting[0]):
            seq = self.waiting.popleft()
            seq.admitted_at = time.monotonic()
            self.running.append(seq)
            # Prefill happens on admission: the prompt is counted as vLLM counts it.
            self.prompt_tokens += seq.prompt_tokens
            self.cache_queries += seq.prompt_tokens
            self.cache_hits += seq.cached_tokens
            seq.admitted.set()
        self._moved()

    async def enter(self, seq: Sequence) -> None:
        """Queue the request and return once it runs; a cancelled waiter leaves the queue."""
        self.waiting.append(seq)
        self._schedule()
        try:
            await seq.admitted.wait()
        except BaseException:
            self.leave(seq, None)
            raise

    def generate(self, seq: Sequence, tokens: int) -> None:
        """Account for ``tokens`` more generated tokens of a running request."""
        if seq.first_token_at is None:
            seq.first_token_at = time.monotonic()
        seq.generated += tokens
        self.generation_tokens += tokens

    def leave(self, seq: Sequence, finished_reason: str | None) -> None:
        """Take the request out (finished, failed or abandoned) and admit whoever now fits."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.running.remove(seq)
            now = time.monotonic()
            if finished_reason is not None and seq.admitted_at is not None:
                first = seq.first_token_at or now
                self.prefill_times.append(first - seq.admitted_at)
                self.decode_times.append(now - first)
            self.finished[finished_reason or "abort"] += 1
        self._schedule()

    # --- on cue ----------------------------------------------------------------------------

    def preempt(self, count: int = 1) -> None:
        """Count ``count`` preemptions, as a server whose KV cache overflowed would."""
        self.preemptions += count

    def restart(self) -> None:
        """Set every counter back to zero, as a restarted server's are."""
        self._reset_counters()

    # --- /metrics --------------------------------------------------------------------------

    def metrics_text(self) -> str:
        """Return the Prometheus text of the current state and remember what it said."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        self.scrapes.append(Scrape(time.monotonic(), len(self.running), len(self.waiting),
                                   self.kv_usage(), self.preemptions, self.prompt_tokens,
                                   self.generation_tokens))
        return generate_latest(registry).decode()


class _Collector:
    """Yield vLLM's metric families from a ServerLoad (prometheus_client's collector protocol)."""

    def __init__(self, load: ServerLoad) -> None:
        self.load = load

    def collect(self) -> Iterator[Metric]:
        load = self.load
        names, values = ["engine", "model_name"], ["0", load.model]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=names)
            family.add_metric(values, value, created=load.created)
            return family

        yield gauge("vllm:num_requests_running", "Number of requests in model execution "
                    "batches.", len(load.running))
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                    len(load.waiting))
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                    load.kv_usage())
        yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number "
                      "of queried tokens.", load.cache_queries)
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of "
                      "cached tokens.", load.cache_hits)
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the "
                      "engine.", load.preemptions)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                      load.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.",
                      load.generation_tokens)
        success = CounterMetricFamily("vllm:request_success", "Count of successfully "
                                      "processed requests.",
                                      labels=["engine", "finished_reason", "model_name"])
        for reason in ("stop", "length", "abort"):
            success.add_metric(["0", reason, load.model], load.finished[reason],
                               created=load.created)
        yield success
        for phase, times in (("prefill", load.prefill_times), ("decode", load.decode_times)):
            family = HistogramMetricFamily(
                f"vllm:request_{phase}_time_seconds",
                f"Histogram of time spent in {phase.upper()} phase for request.", labels=names)
            buckets = [(str(le), float(sum(t <= le for t in times))) for le in TIME_BUCKETS]
            family.add_metric(values, [*buckets, ("+Inf", float(len(times)))],
                              sum_value=sum(times))
            yield family
        if not load.cache_config:
            return
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine "
                                 "CacheConfig", labels=[
                                     "block_size", "cache_dtype", "enable_prefix_caching",
                                     "engine", "kv_cache_size_tokens", "num_cpu_blocks",
                                     "num_gpu_blocks"])
        info.add_metric([str(load.block_size), "auto", "True", "0",
                         str(load.blocks * load.block_size), "None", str(load.blocks)], 1.0)
        yield info
