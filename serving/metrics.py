"""Read the vLLM server's ``/metrics`` into typed snapshots.

Parsing goes through prometheus_client's text parser, never regexes. Storing readings is the
service's business (app/traffic/sampler.py); this module knows vLLM, not the database.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
from prometheus_client.parser import text_string_to_metric_families

from serving.errors import ServerError, reason
from serving.urls import redact, server_root

# Older vLLM spelled KV usage and prefix-cache counters with a gpu_ prefix; first found wins.
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
# What admission takes from a reading (app/traffic: admission, budget, limits): never guessed.
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
ADMITTED = frozenset((*GAUGES, *COUNTERS, *KV_USAGE, "vllm:num_preemptions_total"))


@dataclass(frozen=True)
class MetricsSnapshot:
    """One reading of /metrics, summed over every engine and model label set."""

    running: float
    """Requests being decoded or prefilled now (``vllm:num_requests_running``)."""
    waiting: float
    """Requests queued for a slot or KV blocks (``vllm:num_requests_waiting``)."""
    kv_cache_usage: float
    """Fraction 0..1 of KV blocks in use; with several engines, the fullest one."""
    preemptions_total: float
    prompt_tokens_total: float
    generation_tokens_total: float
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    spec_drafts_total: float | None = None
    spec_draft_tokens_total: float | None = None
    spec_accepted_tokens_total: float | None = None
    prefill_time_s_total: float | None = None
    """Seconds requests spent in prefill, summed over finished requests (a histogram's _sum)."""
    decode_time_s_total: float | None = None
    """Seconds requests spent in decode, summed over finished requests (a histogram's _sum)."""
    taken_at: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass(frozen=True)
class CacheConfig:
    """The labels of ``vllm:cache_config_info``: block size, KV dtype, blocks, prefix caching.

    ``labels`` are the first engine's. A data-parallel server (``--data-parallel-size N``)
    runs N engines behind one endpoint, each with its own KV pool: ``engines`` holds each
    engine's labels, and the endpoint's capacity is the sum of theirs.
    """

    labels: dict[str, str]
    engines: tuple[dict[str, str], ...] = ()

    def _each(self) -> tuple[dict[str, str], ...]:
        return self.engines or (self.labels,)

    def blocks(self) -> int | None:
        """Return the number of KV blocks (GPU or CPU) of every engine, when the server says."""
        counts = [_label_int(labels, "num_gpu_blocks", "num_cpu_blocks") for labels in self._each()]
        return None if None in counts else sum(c for c in counts if c is not None)

    def tokens(self) -> int | None:
        """Return the KV cache's size in tokens over every engine, when the server says.

        vLLM's own ``kv_cache_size_tokens`` is preferred to blocks x block size: under data
        parallelism vLLM 0.24 reports ``num_gpu_blocks`` at twice an engine's pool (6,144
        blocks of 16 for a 49,152-token cache).
        """
        total = 0
        for labels in self._each():
            size = _label_int(labels, "kv_cache_size_tokens")
            if size is None:
                blocks = _label_int(labels, "num_gpu_blocks", "num_cpu_blocks")
                block = _label_int(labels, "block_size")
                if blocks is None or block is None:
                    return None
                size = blocks * block
            total += size
        return total


def _label_int(labels: dict[str, str], *keys: str) -> int | None:
    for key in keys:
        value = labels.get(key)
        if value and value.isdigit() and int(value) > 0:
            return int(value)
    return None


# Every sample parse_metrics reads. vLLM's page carries hundreds of others (histogram
# buckets above all), and prometheus_client's parser costs about as much per line whether
# a line is read or not: a client reading eight endpoints every second spent a fifth of
# its CPU there (docs/performance.md, "A night past one GPU"). Only these lines are parsed.
READ = frozenset((
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total", "vllm:num_preemptions_total", *KV_USAGE,
    *PREFIX_QUERIES, *PREFIX_HITS, "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:request_prefill_time_seconds_sum", "vllm:request_decode_time_seconds_sum"))


def _name(line: str) -> str:
    """Return a sample line's name (it ends at ``{`` or a space)."""
    return line.split("{", 1)[0].split(" ", 1)[0]


def _read_lines(text: str) -> str:
    """Keep the sample lines parse_metrics reads."""
    return "\n".join(line for line in text.splitlines()
                     if line and line[0] != "#" and _name(line) in READ) + "\n"


def _samples(text: str) -> dict[str, list[float]]:
    """Group sample values by sample name, of the samples parse_metrics reads; a page that
    ends inside one of their lines is a ServerError (its value may be cut: 14001.0 → 140)."""
    # The text format ends every line with a line feed, the last one too (prometheus_client
    # and vLLM do): without it the last line may be cut short, a counter falling with it.
    if (cut := _name(text.rsplit("\n", 1)[-1])) in READ:
        raise ServerError(f"/metrics ends inside its {cut} line, with no line feed after "
                          "it: a partial reading")
    values: dict[str, list[float]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(_read_lines(text)):
            for sample in family.samples:
                values[sample.name].append(float(sample.value))
    except ValueError as error:
        raise ServerError(f"/metrics is not Prometheus text: {error}") from None
    return values


def _first(values: dict[str, list[float]], names: tuple[str, ...]) -> list[float] | None:
    for name in names:
        if name in values:
            return values[name]
    return None


def _sum(values: dict[str, list[float]], *names: str) -> float | None:
    found = _first(values, names)
    return None if found is None else sum(found)


def parse_metrics(text: str, *, taken_at: datetime | None = None) -> MetricsSnapshot:
    """Parse Prometheus text from vLLM into a snapshot. A ServerError (a failed reading) when
    a value admission takes is missing or is no count (NaN, infinite, negative); a report's
    figure that is no count reads as unknown (None)."""
    values = _samples(text)
    required = (*GAUGES, *COUNTERS)
    missing = [name for name in required if name not in values]
    kv = _first(values, KV_USAGE)
    if kv is None:
        missing.append(KV_USAGE[0])
    if any(name in missing for name in COUNTERS):
        raise ServerError(f"/metrics lacks {', '.join(missing)}: is this a vLLM server?")
    # A data-parallel server publishes an engine's scheduler gauges (running, waiting, KV)
    # only once that engine has served a request (vLLM 0.24): all three declared, with no
    # sample. A gauge missing otherwise is a page cut short, not an idle server.
    if missing and (len(missing) < 3 or not all(
            any(f"# TYPE {name} " in text for name in names)
            for names in ((GAUGES[0],), (GAUGES[1],), KV_USAGE))):
        raise ServerError(f"/metrics lacks {', '.join(missing)}: a partial reading")
    # A garbled page or an exporter's bug, never a server's state; let into admission's
    # arithmetic, NaN passes every comparison with a limit as false and -1 reads as room.
    untrue = {name for name, found in values.items() if not all(0 <= v < math.inf for v in found)}
    if untrue & ADMITTED:
        raise ServerError(f"/metrics gives {', '.join(sorted(untrue & ADMITTED))} a value no "
                          "server has (NaN, infinite or negative): a partial reading")
    values = {name: found for name, found in values.items() if name not in untrue}
    core = {name: sum(values.get(name, [0.0])) for name in required}
    return MetricsSnapshot(
        running=core["vllm:num_requests_running"],
        waiting=core["vllm:num_requests_waiting"],
        # Several engines each have their own pool: the fullest one is what blocks admission.
        kv_cache_usage=max(kv) if kv else 0.0,
        # Absent until the first preemption in some builds: no counter means none happened.
        preemptions_total=_sum(values, "vllm:num_preemptions_total") or 0.0,
        prompt_tokens_total=core["vllm:prompt_tokens_total"],
        generation_tokens_total=core["vllm:generation_tokens_total"],
        prefix_cache_queries_total=_sum(values, *PREFIX_QUERIES),
        prefix_cache_hits_total=_sum(values, *PREFIX_HITS),
        spec_drafts_total=_sum(values, "vllm:spec_decode_num_drafts_total"),
        spec_draft_tokens_total=_sum(values, "vllm:spec_decode_num_draft_tokens_total"),
        spec_accepted_tokens_total=_sum(values, "vllm:spec_decode_num_accepted_tokens_total"),
        # Older servers lack these histograms: None, so the report says unknown, not zero.
        prefill_time_s_total=_sum(values, "vllm:request_prefill_time_seconds_sum"),
        decode_time_s_total=_sum(values, "vllm:request_decode_time_seconds_sum"),
        taken_at=taken_at or datetime.now(UTC),
    )


def parse_cache_config(text: str) -> CacheConfig | None:
    """Return the labels of ``vllm:cache_config_info``, or None when the server has none.

    vLLM labels each engine's series with ``engine``. Where the info has one series per
    engine, each engine's own labels are used; where it has one series but other gauges
    name several engines, every engine is taken to have that pool (same flags).
    """
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as error:
        raise ServerError(f"/metrics is not Prometheus text: {error}") from None
    configs: dict[str, dict[str, str]] = {}
    engines: set[str] = set()
    for family in families:
        for sample in family.samples:
            engine = sample.labels.get("engine")
            if engine is not None:
                engines.add(engine)
            if sample.name == "vllm:cache_config_info":
                configs.setdefault(engine or "", dict(sample.labels))
    if not configs:
        return None
    first = next(iter(configs.values()))
    each = tuple(configs.get(engine, first) for engine in sorted(engines or configs))
    return CacheConfig(labels=first, engines=each)


def combine(snapshots: list[MetricsSnapshot]) -> MetricsSnapshot:
    """Return several servers' readings as one, as parse_metrics reads several engines of one
    server: counts and counters summed, KV usage the fullest server's (what blocks first)."""
    def total(name: str) -> float | None:
        values = [getattr(s, name) for s in snapshots]
        return None if None in values else sum(values)

    return MetricsSnapshot(
        running=sum(s.running for s in snapshots),
        waiting=sum(s.waiting for s in snapshots),
        kv_cache_usage=max(s.kv_cache_usage for s in snapshots),
        preemptions_total=sum(s.preemptions_total for s in snapshots),
        prompt_tokens_total=sum(s.prompt_tokens_total for s in snapshots),
        generation_tokens_total=sum(s.generation_tokens_total for s in snapshots),
        **{name: total(name) for name in (
            "prefix_cache_queries_total", "prefix_cache_hits_total", "spec_drafts_total",
            "spec_draft_tokens_total", "spec_accepted_tokens_total", "prefill_time_s_total",
            "decode_time_s_total")},
        taken_at=max(s.taken_at for s in snapshots),
    )


def combine_cache_configs(configs: list[CacheConfig]) -> CacheConfig:
    """Return several servers' cache configs as one whose engines are all of theirs: its
    ``tokens()`` is the fleet's KV capacity."""
    return CacheConfig(labels=configs[0].labels,
                       engines=tuple(e for c in configs for e in c._each()))


def metrics_url(base_url: str) -> str:
    """Return the /metrics URL for an OpenAI base URL (…/v1) or a server root."""
    return server_root(base_url) + "/metrics"


def _check(response: httpx.Response) -> str:
    if response.status_code != 200:
        raise ServerError(redact(f"{response.request.url} answered HTTP {response.status_code}"))
    return response.text


def fetch_metrics_text(base_url: str, *, client: httpx.Client | None = None,
                       timeout_s: float = 5.0) -> str:
    """Return the raw /metrics text (blocking); unreachable is a ServerError."""
    try:
        if client is not None:
            return _check(client.get(metrics_url(base_url), timeout=timeout_s))
        with httpx.Client(timeout=timeout_s) as own:
            return _check(own.get(metrics_url(base_url)))
    except httpx.HTTPError as error:
        raise ServerError(redact(f"cannot read {metrics_url(base_url)}: {reason(error)}")) from None


async def afetch_metrics_text(base_url: str, *, client: httpx.AsyncClient | None = None,
                              timeout_s: float = 5.0) -> str:
    """Return the raw /metrics text without blocking the event loop."""
    try:
        if client is not None:
            return _check(await client.get(metrics_url(base_url), timeout=timeout_s))
        async with httpx.AsyncClient(timeout=timeout_s) as own:
            return _check(await own.get(metrics_url(base_url)))
    except httpx.HTTPError as error:
        raise ServerError(redact(f"cannot read {metrics_url(base_url)}: {reason(error)}")) from None


def read_metrics(base_url: str, *, client: httpx.Client | None = None) -> MetricsSnapshot:
    """Read and parse /metrics (blocking)."""
    return parse_metrics(fetch_metrics_text(base_url, client=client))


async def aread_metrics(base_url: str, *,
                        client: httpx.AsyncClient | None = None) -> MetricsSnapshot:
    """Read and parse /metrics without blocking the event loop."""
    return parse_metrics(await afetch_metrics_text(base_url, client=client))
