"""Drive one workload with several scheduling strategies, one after another, on the servers.

Every strategy runs as its own batch (kind ``bench``) through the same engine, gate and
tracked client as a nightly run, over every configured endpoint as a night would be (an
arm's figures then include each endpoint's part), so its figures come from the same rows
and the same ``/metrics`` samples as any report. Two references: the *ceiling* is the
best output tok/s of a fixed schedule that respects the graph (``sequential``, the
``fixed-N`` sweep, ``fixed-all``), measured, what the scheduler must at least match; the
*graph bound* (app/bench/bound.py) is what any schedule that respects the graph could get
from this server, modelled from the run's own readings. ``flood`` (every request at once,
dependencies ignored) may run beside them: it shares a ticker's context between its calls
in the cache, which no schedule that respects the graph may, so it is no target.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import math
import re
import shlex
import subprocess
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from typing import Any, NamedTuple

import httpx
import structlog
from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer
from sqlalchemy import Engine

from app.batch.engine import BatchEngine, BatchPlan, TickerWork
from app.bench.arms import (
    DEFAULT_ARMS,
    FLOOD,
    OLDER_DEFAULTS,
    canonical_arm,
    knob_defaults,
    plan_arms,
)
from app.bench.bound import (
    GraphFacts,
    arm_graph_facts,
    bound_interval,
    decode_levels,
    fit_step,
    graph_bound,
    pool,
)
from app.bench.machine import HostFacts
from app.bench.machine import machine_facts as host_facts
from app.config import Settings
from app.errors import InputError, ServerError
from app.morning.accounting import compare_arm
from app.quality.statistics import mean_defined, welch_p
from app.recorder.record import Recorder
from app.runs.replay import Workload, play, shape
from app.tasks import in_thread
from app.traffic.client import TickerClient
from app.traffic.strategy import Strategy
from serving.facts import command_flag
from serving.metrics import aread_metrics
from serving.urls import is_local, redact

log = structlog.get_logger(__name__)

SERVER_BOUND = FLOOD
BOUND_TARGET = 0.9  # the share of the graph bound an adaptive arm is held to
# A verdict calls a lead (or deficit) when Welch's two-sided t on the arms' per-run tok/s,
# on min(n) - 1 degrees of freedom, rejects equal means at this level, the best fixed arm
# being picked by the same runs (``_lead``), and the bench's adaptive arms' calls together
# keeping it (``_holm``): two or three arms each at 5% against one fixed arm called one of
# them apart on 6.2% and 9.0% of equal benches (docs/lab/2026-12-07-verdicts-outside-3.md;
# tests/unit/bench/test_schedulers_lead.py).
LEAD_LEVEL = 0.05
LEAD_TEST = {"test": "welch-t", "df": "min(n)-1", "sides": 2, "level": LEAD_LEVEL,
             "lead": "against every fixed arm", "deficit": "bonferroni over the fixed arms",
             "arms": "holm over the adaptive arms"}
# The JSON's schema (as app/cli/common.py ``echo_json`` gives every output's): raised when a
# field is renamed, removed or changes meaning. A file without one is older: ``bench
# combine`` reads it by the keys it has; one of a later version is refused.
# 1: machine.model and .profile as the server says; 2: machine.models, what each endpoint
# serves, and machine.model only the name every endpoint serves (null where they differ).
SCHEMA = "bench-schedulers/2"


@dataclass
class BenchResult:
    workload: str
    tickers: int
    requests: int
    arms: list[dict[str, Any]] = field(default_factory=list)
    ceiling_tok_s: float = 0.0
    ceiling_arm: str = ""  # the best arm that respects the graph (sequential, fixed-N, fixed-all)
    server_bound_tok_s: float = 0.0
    server_bound_arm: str = ""  # flood: dependencies ignored
    checks: dict[str, bool] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    warmup: WarmUp | None = None  # what was sent before the first arm, and its time
    bound_tok_s: float | None = None  # the graph bound (app/bench/bound.py)
    bound: dict[str, Any] | None = None  # its terms, step cost and graph facts
    sweep: dict[str, Any] | None = None  # the fixed-N sweep's sizes and rule (app/bench/arms.py)
    mixed: dict[str, list[Any]] | None = None  # combined with --allow-mixed: what differed
    # Combined: what no run recorded (older files), so what was not compared at all.
    unchecked: list[str] | None = None
    # Runs of every arm, interleaved (round 1 of each arm, then round 2...); None for runs
    # joined by ``combine_results``, whose arms ran as often as their files say (``means``).
    repeat: int | None = 1
    # Per strategy over its runs: mean output tok/s, each run's, spread (max - min), runs.
    means: dict[str, dict[str, Any]] = field(default_factory=dict)
    verdicts: list[str] = field(default_factory=list)  # what the means can and cannot say
    lead_test: dict[str, Any] | None = None  # how the verdicts test a lead (LEAD_TEST)
    # The knob values its arms' names leave out (app/bench/arms.py): ``bench combine`` reads
    # each file's names by its own code's defaults. None: an older file.
    knob_defaults: dict[str, dict[str, Any]] | None = field(default_factory=knob_defaults)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **json.loads(json.dumps(self.__dict__, default=_plain))}


def _plain(value: Any) -> Any:
    return value.model_dump() if isinstance(value, BaseModel) else str(value)


class ServerFlags(BaseModel, frozen=True):
    """How the server was started: every field, None where it is not known, so two runs on
    servers set up differently never look alike (``combine_results`` compares them)."""

    model: str | None = None  # the checkpoint: the launcher's command, else /v1/models' root
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    quantization: str | None = None  # --quantization as given (None: not given, or unknown)
    kv_cache_dtype: str | None = None
    kv_cache_tokens: int | None = None
    kv_cache_memory_gib: float | None = None
    vllm_version: str | None = None
    gpu: str | None = None  # as nvidia-smi names it, with its memory
    command: str | None = None
    cache_config: dict[str, Any] | None = None  # vLLM's labels, as /metrics names them

    def unknown(self) -> list[str]:
        """Name the fields not known. ``quantization`` is None then too where the command is
        known: none was given, a fact, not a gap."""
        return [name for name, value in self if value is None
                and not (name == "quantization" and self.command is not None)]

    def line(self) -> str:
        """Say in one line how the server was started, and what is not known of it."""
        quant = self.quantization or ("none given" if self.command else None)
        known = [f"{what} {value}" for what, value in (
            ("model", self.model), ("max-num-seqs", self.max_num_seqs),
            ("max-model-len", self.max_model_len), ("quantization", quant),
            ("KV", self.kv_cache_dtype), ("KV tokens", self.kv_cache_tokens),
            ("KV GiB", self.kv_cache_memory_gib), ("vLLM", self.vllm_version),
            ("GPU", self.gpu)) if value is not None]
        gaps = self.unknown()
        return ("server flags: " + (", ".join(known) or "none known")
                + (f"; not known (null in the JSON): {', '.join(gaps)}" if gaps else ""))


class BenchMachine(HostFacts, frozen=True):
    """Where a bench ran (``HostFacts``), when, and on which server started how."""

    date: str
    server: str
    model: str | None  # the name every endpoint serves (None: not read, or they differ)
    # Per endpoint of ``server``, in its order: the name its /v1/models lists first (None:
    # not read). A bench's figures are of one model only where these agree.
    models: list[str | None] | None = None
    profile: str | None  # the profile nightdesk started it with (None: started otherwise)
    server_facts: dict[str, Any]  # the launcher's record, as ``serving.facts`` keeps it
    server_flags: ServerFlags

    @model_serializer(mode="wrap")
    def _date_first(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The date leads, as in every bench file written so far.
        plain = handler(self)
        return {"date": plain.pop("date"), **plain}


def machine_facts(settings: Settings, server_facts: dict[str, Any] | None,
                  served: list[dict[str, Any] | None] | None = None) -> BenchMachine:
    """Describe the client host and code (as the tracker bench does) and the servers
    (``served``: each endpoint's /v1/models entry, in the settings' order, when the caller
    read them): the models and profile as the servers and the launcher's record say, not
    this client's settings. The server flags are the first endpoint's."""
    facts = server_facts or {}
    # A launcher's record names the profile it started; live facts name only the setting.
    launched = facts.get("profile") if facts.get("root_url") else None
    models = [(entry or {}).get("id") for entry in served] if served else None
    return BenchMachine(date=datetime.now(UTC).isoformat(timespec="seconds"),
                        **dict(host_facts()), server=settings.llm.base_url,
                        model=served_model(models), models=models, profile=launched,
                        server_facts=facts, server_flags=server_flags(
                            facts, served[0] if served else None, local_gpu(settings)))


def served_model(models: list[str | None] | None) -> str | None:
    """Return the one name every endpoint serves; None where one was not read or they differ."""
    names = set(models or [None])
    return names.pop() if len(names) == 1 else None


def endpoint_models(machine: dict[str, Any]) -> list[str | None] | None:
    """Return what each endpoint of a bench served (``machine.models``); for a file from
    before it was recorded, its ``machine.model`` where it drove one endpoint, else None (the
    others' are not known)."""
    if "models" in machine:
        return machine["models"]
    return [machine.get("model")] if endpoints_of(machine) == 1 else None


def models_differ(machine: dict[str, Any]) -> str | None:
    """Return "a at URL1, b at URL2" where a bench's endpoints served different models (its
    figures are then of no one model), else None."""
    models = machine.get("models") or []
    if len(set(models)) < 2:
        return None
    urls = [u for u in str(machine.get("server", "")).split(",") if u]
    return ", ".join(f"{name or 'not read'} at {url}" for name, url in zip(
        models, urls + [f"endpoint {i + 1}" for i in range(len(urls), len(models))],
        strict=False))


def _served_model(command: str | None) -> str | None:
    """Return the model of ``vllm serve MODEL ...`` (the positional form), else None."""
    words = shlex.split(command) if command else []
    for before, word in itertools.pairwise(words):
        if before == "serve" and not word.startswith("-"):
            return word
    return None


# vLLM's size suffixes (its human_readable_int): lower case decimal, upper case binary.
_SIZE = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
         "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _bytes(text: str | None) -> int | None:
    """Return a byte count as vLLM reads one (``6G``, ``6442450944``), else None."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)", (text or "").strip())
    if not found:
        return None  # absent, or vLLM's "None" label
    number, suffix = found.groups()
    return int(float(number) * _SIZE.get(suffix, 1))


def _kv_gib(facts: dict[str, Any], config: dict[str, Any], command: str | None) -> float | None:
    """Return the KV cache's GiB: vLLM's startup log, else the size it was given (the cache
    config's ``kv_cache_memory_bytes``, else ``--kv-cache-memory-bytes``), else None."""
    if facts.get("kv_cache_memory_gib") is not None:
        return float(facts["kv_cache_memory_gib"])
    size = _bytes(config.get("kv_cache_memory_bytes")) or _bytes(
        command_flag(command, "kv-cache-memory-bytes"))
    return round(size / 2**30, 3) if size else None


def server_flags(facts: dict[str, Any], served: dict[str, Any] | None = None,
                 gpu: str | None = None) -> ServerFlags:
    """Return how the server was started, as far as known: the launcher's record (its
    command line and what vLLM logged), else what the live server and its process told
    (``serving.facts.batch_server_facts``), /metrics' cache config and /v1/models' entry."""
    config = facts.get("cache_config") or {}
    command = facts.get("command")
    served = served or {}
    seqs = facts.get("max_num_seqs") or command_flag(command, "max-num-seqs")
    length = (facts.get("max_model_len") or served.get("max_model_len")
              or command_flag(command, "max-model-len"))
    model = (facts.get("model") or _served_model(command) or command_flag(command, "model")
             or served.get("root") or served.get("id"))
    return ServerFlags(
        model=model, max_num_seqs=int(seqs) if seqs else None,
        max_model_len=int(length) if length else None,
        quantization=facts.get("quantization") or command_flag(command, "quantization"),
        kv_cache_dtype=config.get("cache_dtype") or command_flag(command, "kv-cache-dtype"),
        kv_cache_tokens=facts.get("kv_cache_tokens"),
        kv_cache_memory_gib=_kv_gib(facts, config, command),
        vllm_version=facts.get("vllm_version"), gpu=facts.get("gpu") or gpu,
        command=command,
        cache_config={k: v for k, v in sorted(config.items()) if not k.startswith("_")}
        or None)


def local_gpu(settings: Settings) -> str | None:
    """Return this host's GPUs as nvidia-smi names them, when every endpoint is on this host
    (a server elsewhere: None, not known here)."""
    if not all(is_local(url) for url in settings.llm.urls):
        return None
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None  # no NVIDIA GPU here, or no driver
    names = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return "; ".join(names) or None


async def _wait_idle(settings: Settings, client: httpx.AsyncClient | None = None,
                     timeout_s: float = 120.0) -> None:
    """Wait until every endpoint runs and queues nothing, so arms do not overlap."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with contextlib.AsyncExitStack() as stack:
        if client is None:
            client = await stack.enter_async_context(httpx.AsyncClient(timeout=5.0))
        while asyncio.get_running_loop().time() < deadline:
            snaps = [await aread_metrics(url, client=client) for url in settings.llm.urls]
            if all(snap.running == 0 and snap.waiting == 0 for snap in snaps):
                return
            await asyncio.sleep(0.5)


# Output tokens per warm-up request: enough for a few decode steps beside the prefills.
WARMUP_MAX_TOKENS = 16


class WarmUp(BaseModel, frozen=True):
    """What ``_warm_up`` sent before the first arm, to how many endpoints, and its time."""

    tickers: int
    requests: int
    endpoints: int
    max_tokens: int
    seconds: float


async def _warm_up(settings: Settings, workload: Workload, salt: str, tickers: int,
                   client: httpx.AsyncClient | None = None) -> WarmUp | None:
    """Send the first ``tickers`` tickers' requests at once to every endpoint, short answers.

    A server that has just started compiles kernels for the batch shapes it meets first, so
    without this whichever arm ran first would pay for it (seconds to a first token on a
    GPU). The warm-up meets those shapes (prefills of several prompts beside a decode)
    before any arm is timed; it goes to the servers directly, under its own cache salt, so
    no batch records it and no arm reuses its cache.
    """
    items = [item for ticker in sorted(workload)[:tickers] for item in workload[ticker]]
    if not items:
        return None
    headers = {"Authorization": f"Bearer {settings.llm.api_key.get_secret_value()}"}
    started = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        if client is None:
            client = await stack.enter_async_context(
                httpx.AsyncClient(timeout=settings.calls.call_timeout_s))

        async def one(url: str, body: dict[str, Any]) -> None:
            sent = {k: v for k, v in body.items() if k != "extra_body"}
            sent.update(body.get("extra_body", {}), cache_salt=salt, stream=False,
                        max_tokens=min(WARMUP_MAX_TOKENS, int(body.get("max_tokens") or 1)))
            try:
                response = await client.post(f"{url}/chat/completions", json=sent,
                                             headers=headers)
            except httpx.HTTPError as error:
                raise ServerError(redact(f"the bench's warm-up could not reach {url}: "
                                         f"{error}")) from None
            if response.status_code != 200:
                raise ServerError(redact(f"the bench's warm-up request to {url} answered "
                                         f"HTTP {response.status_code}: {response.text[:200]}"))

        async with asyncio.TaskGroup() as group:
            for url in settings.llm.urls:
                for item in items:
                    group.create_task(one(url, item.body))
    return WarmUp(tickers=min(tickers, len(workload)), requests=len(items),
                  endpoints=len(settings.llm.urls), max_tokens=WARMUP_MAX_TOKENS,
                  seconds=round(time.monotonic() - started, 2))


def _salted(workload: Workload, salt: str) -> Workload:
    """Copy the workload with a per-arm prefix-cache salt: no arm reuses another's cache."""
    salted = copy.deepcopy(workload)
    for items in salted.values():
        for item in items:
            item.body["extra_body"] = {**item.body.get("extra_body", {}), "cache_salt": salt}
    return salted


async def run_bench(settings: Settings, engine: Engine, workload: Workload, *,
                    name: str, strategies: list[str] | None = None,
                    server_facts: dict[str, Any] | None = None, warmup_tickers: int = 1,
                    sweep: dict[str, Any] | None = None, repeat: int = 1,
                    served: list[dict[str, Any] | None] | None = None,
                    **engine_kwargs: Any) -> BenchResult:
    """Run every strategy over the same workload and compare them to the measured ceiling.

    ``repeat`` runs every arm that many times, interleaved (each arm once, then again), so a
    drift of the server over the run touches every arm alike; the verdicts use the means.
    ``warmup_tickers`` tickers' requests are sent first, untimed (``_warm_up``); 0: none.
    ``served``: each endpoint's /v1/models entry (settings' order), recorded with the flags.
    ``sweep`` (app/bench/arms.py) is recorded with the result when the arms came from one;
    without ``strategies`` the arms are ``DEFAULT_ARMS``, planned for this server.
    """
    if strategies is None:
        facts = server_facts or {}
        strategies, chosen = plan_arms(DEFAULT_ARMS, workload, facts.get("kv_cache_tokens"),
                                       facts.get("max_num_seqs"), len(settings.llm.urls))
        sweep = chosen.to_json() if chosen else None
    for s in strategies:
        if s != SERVER_BOUND:
            Strategy.parse(s)  # refuse a typo before the first arm runs for minutes
    if repeat < 1:
        raise InputError(f"--repeat takes a whole number of at least 1 (got {repeat})")
    run_id = uuid.uuid4().hex[:8]
    result = BenchResult(name, len(workload), sum(len(v) for v in workload.values()),
                         machine=machine_facts(settings, server_facts, served).model_dump(),
                         sweep=sweep,
                         repeat=repeat)
    runner = BatchEngine(settings, engine, server_facts=server_facts, **engine_kwargs)
    weights = {t: float(sum(i.body["max_tokens"] for i in items))
               for t, items in workload.items()}
    shapes = {t: shape(items) for t, items in workload.items()}
    if warmup_tickers > 0:
        result.warmup = await _warm_up(settings, workload, f"{run_id}-warmup", warmup_tickers,
                                       engine_kwargs.get("http_client"))
        log.info("bench warm-up", **(result.warmup.model_dump() if result.warmup else {}))
    for round_, strategy in ((r, s) for r in range(1, repeat + 1) for s in strategies):
        if engine_kwargs.get("sample_metrics", True):
            await _wait_idle(settings, engine_kwargs.get("http_client"))
        # Each run its own cache salt: a repeat must not find the run before in the cache.
        arm_load = _salted(workload, f"{run_id}-{strategy}-{round_}")
        flood = strategy == SERVER_BOUND

        async def work(ticker: str, gated: TickerClient, batch_id: int,
                       arm_load: Workload = arm_load, flood: bool = flood) -> list[Any]:
            return await play(arm_load[ticker], gated, batch_id, ignore_deps=flood)

        log.info("bench arm", strategy=strategy, run=round_, of=repeat)
        plan = BatchPlan("bench", date.today(), sorted(workload), 1,
                         "fixed-all" if flood else strategy,
                         f"bench {run_id} {strategy}" + (f" #{round_}" if repeat > 1 else ""))
        recorder = Recorder(engine)
        outcome = await runner.run(plan, TickerWork(work, weights=weights, shapes=shapes),
                                   recorder)
        # The arm's record: ``Arm``'s fields and the bench's own, as its JSON file keeps it.
        figures = (await in_thread(compare_arm, engine, outcome.batch_id)).model_dump()
        figures["strategy"] = strategy
        figures["run"] = round_
        figures["admission"] = recorder.admission.model_dump() if recorder.admission else {}
        if strategy != SERVER_BOUND and Strategy.parse(strategy).adaptive:
            figures["holdback_timeline"] = (recorder.holdback.model_dump()
                                            if recorder.holdback else {})
        # Kept with the arm: combined runs each had one.
        figures["warmup"] = result.warmup.model_dump() if result.warmup else None
        # What the graph bound is computed from, kept per arm so combined runs can pool it.
        figures["graph"] = asdict(await in_thread(
            arm_graph_facts, engine, outcome.batch_id, workload))
        figures["decode_levels"] = await in_thread(decode_levels, engine,
                                                   outcome.batch_id)
        result.arms.append(figures)
    _judge(result)
    return result


def same_run(machine: dict[str, Any]) -> dict[str, Any]:
    """Return what must be the same in every file ``combine_results`` puts in one table: a
    run over two endpoints makes twice the tok/s of one, on a server set up alike."""
    return {"code commit": machine.get("commit"), "host": machine.get("host"),
            "server flags": machine.get("server_flags"),
            "endpoint count": endpoints_of(machine),
            "served model names (machine.models)": endpoint_models(machine),
            "server profile (machine.profile)": machine.get("profile")}


def endpoints_of(machine: dict[str, Any]) -> int:
    """Return how many endpoints a run drove (its ``server``: the URLs, comma-separated)."""
    return len([u for u in str(machine.get("server", "")).split(",") if u]) or 1


def combine_results(runs: list[dict[str, Any]], *, allow_mixed: bool = False,
                    names: list[str] | None = None) -> BenchResult:
    """Merge bench results of one workload run arm by arm (a device call each) and judge them.

    A run that differs in workload, tickers or requests is refused: its arms are not
    comparable. So is one whose code commit, host, server flags or number of endpoints
    differ from the first's (``same_run``), unless ``allow_mixed`` (the result's ``mixed``
    then says what differed); what no run recorded could not be compared (``unchecked``).
    A refusal names the two runs by ``names`` (the files). The machine facts are the first
    run's.
    """
    if not runs:
        raise InputError("no bench results to combine")
    seen: dict[str, int] = {}  # a run's key: the index of the file it came in
    for i, run in enumerate(runs):
        check_result(run)
        for arm in run["arms"]:
            # The same run twice (a file given twice, or a combined file beside its parts)
            # would count as two runs: a spread of nothing, a lead "shown" from one run.
            # Its ratios are worked out again in every combination: not part of the run.
            # Its name as it ran: a combination may have made it canonical.
            run_key = json.dumps({**{k: v for k, v in arm.items() if not k.startswith("ratio_")
                                     and k not in ("strategy_as_run", "call")},
                                  "strategy": arm.get("strategy_as_run", arm["strategy"])},
                                 sort_keys=True, default=str)
            if run_key in seen:
                before = seen[run_key]
                where = ("" if not names else f" (twice in {names[i]})" if before == i
                         else f" (in {names[before]} and {names[i]})")
                raise InputError(f"a run of {arm['strategy']} (batch {arm.get('batch_id')}) is "
                                 f"given twice{where}: counted twice it would make its arm "
                                 "look surer than it is")
            seen[run_key] = i
    first = runs[0]
    try:
        # Its names are today's (``canonical_arm``), but for an older file's adaptive arms,
        # kept as written: their defaults are then not known.
        result = BenchResult(first["workload"], first["tickers"], first["requests"],
                             machine=first.get("machine", {}), sweep=first.get("sweep"),
                             repeat=None, knob_defaults=knob_defaults() if all(
                                 r.get("knob_defaults") for r in runs) else None)
        mixed: dict[str, list[Any]] = {}
        for i, run in enumerate(runs):
            which = f" ({names[i]} against {names[0]})" if names else ""
            same = (run["workload"], run["tickers"], run["requests"])
            if same != (result.workload, result.tickers, result.requests):
                raise InputError(f"cannot combine a run of {same} with one of "
                                 f"{(result.workload, result.tickers, result.requests)}{which}")
            first_run = same_run(result.machine)
            for what, mine in same_run(run.get("machine", {})).items():
                theirs = first_run[what]
                if mine != theirs:
                    if not allow_mixed:
                        raise InputError(
                            f"cannot combine runs whose {what} "
                            f"{'differ' if what.split(' (')[0].endswith('s') else 'differs'} "
                            f"({_differ(theirs, mine)})"
                            ": their arms are not comparable; --allow-mixed combines them "
                            f"anyway{which}")
                    mixed.setdefault(what, [theirs])
                    if mine not in mixed[what]:
                        mixed[what].append(mine)
            # One arm, one name: fixed-15 of one file and fixed-15:tail=off of another pool;
            # each file's names read by its own code's defaults (``canonical_arm``).
            # Each run keeps the call it came in (a file; within a combined file, its own):
            # a call's runs share its host and server, so they are not independent draws.
            for arm in run["arms"]:
                name = canonical_arm(arm["strategy"], run.get("knob_defaults") or OLDER_DEFAULTS)
                call = str(i) if arm.get("call") is None else f"{i}.{arm['call']}"
                result.arms.append({**arm, "call": call} if name == arm["strategy"] else {
                    **arm, "strategy": name, "call": call,
                    "strategy_as_run": arm.get("strategy_as_run", arm["strategy"])})
        result.mixed = mixed or None
        result.unchecked = [what for what, value in same_run(result.machine).items()
                            if value is None and what not in mixed] or None
    except (KeyError, TypeError, AttributeError) as error:
        raise InputError(f"not a bench schedulers result (missing {error})") from None
    _judge(result)
    return result


def check_result(run: Any) -> None:
    """Raise InputError unless ``run`` has a bench result's shape: what is judged of it (its
    arms' strategy and output tok/s) must be there, or judging it fails half-way."""
    def fails(why: str) -> InputError:
        return InputError(f"is not a bench schedulers result ({why})")
    if not isinstance(run, dict):
        raise fails(f"a JSON {type(run).__name__}, not an object")
    name, _, version = str(run.get("schema", SCHEMA)).partition("/")
    ours, _, known = SCHEMA.partition("/")
    if name != ours or not version.isdigit():
        raise fails(f"its schema is {run['schema']!r}")
    if int(version) > int(known):
        raise InputError(f"is of schema {run['schema']!r}, not one this nightdesk reads (up "
                         f"to {SCHEMA}): a newer nightdesk wrote it; combine it with that one")
    missing = [key for key in ("workload", "tickers", "requests", "arms") if key not in run]
    if missing:
        raise fails(f"no {', '.join(missing)}")
    if not isinstance(run["arms"], list) or not isinstance(run.get("machine", {}), dict):
        raise fails("its arms are not a list, or its machine not an object")
    for i, arm in enumerate(run["arms"]):
        tok_s = arm.get("output_tokens_per_s") if isinstance(arm, dict) else None
        # NaN, Infinity (JSON as Python writes it) or below 0: no run's rate; judged, it
        # made a ceiling of inf or checks of nan.
        if (not isinstance(arm, dict) or not isinstance(arm.get("strategy"), str)
                or not isinstance(tok_s, int | float) or isinstance(tok_s, bool)
                or not 0 <= tok_s < math.inf):
            raise fails(f"arm {i + 1} has no strategy name or no output_tokens_per_s of 0 or "
                        "more")


def _differ(theirs: Any, mine: Any) -> str:
    """Say what differs between two recorded values: for objects, the keys that differ."""
    if isinstance(theirs, dict) and isinstance(mine, dict):
        keys = sorted(k for k in theirs.keys() | mine.keys() if theirs.get(k) != mine.get(k))
        return "; ".join(f"{k}: {_short(theirs.get(k))} and {_short(mine.get(k))}"
                         for k in keys)
    return f"{_short(theirs)} and {_short(mine)}"


def _short(value: Any) -> str:
    text = "none recorded" if value is None else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def respects_graph(strategy: str) -> bool:
    """Return True for a fixed schedule that waits for dependencies (a ceiling candidate),
    with its knobs or without."""
    return strategy.partition(":")[0] == "sequential" or strategy.startswith("fixed-")


def _graph_bound(result: BenchResult) -> None:
    """Work out the graph bound from the arms' graph facts and pooled readings."""
    graphs = [a["graph"] for a in result.arms if a.get("graph")]
    levels = pool([a["decode_levels"] for a in result.arms if a.get("decode_levels")])
    step = fit_step(levels)
    facts = result.machine.get("server_facts") or {}
    kv = facts.get("kv_cache_tokens")
    # The server's --max-num-seqs when its launcher recorded it, else the most it ran.
    seqs = facts.get("max_num_seqs") or max(
        (a.get("running_max") or 0 for a in result.arms), default=0)
    endpoints = endpoints_of(result.machine)
    if not graphs or step is None or not kv or not seqs:
        result.bound, result.bound_tok_s = None, None
        return
    bound = graph_bound(GraphFacts(**graphs[0]), int(kv), int(seqs), step, endpoints)
    if bound is None:
        result.bound, result.bound_tok_s = None, None
        return
    result.bound = {**asdict(bound), "max_num_seqs_from": (
        "server facts" if facts.get("max_num_seqs") else "the most requests any arm ran")}
    # The step is fitted: readings over a narrow range of running requests leave its two
    # terms loose, and the bound with them.
    interval = bound_interval(GraphFacts(**graphs[0]), int(kv), int(seqs), levels, endpoints)
    result.bound["interval_90_tok_s"] = list(interval) if interval else None
    # No schedule that respects the graph beats a bound; a run of one that did shows the
    # model (its step fitted to a few readings, its sequence cap perhaps guessed) wrong for
    # this run. The figures stay in the JSON, but nothing is judged or shown against them.
    over = max((a for a in result.arms if a["strategy"] != SERVER_BOUND),
               key=lambda a: a["output_tokens_per_s"], default=None)
    if over is not None and over["output_tokens_per_s"] > bound.tok_s:
        result.bound["unavailable"] = (
            f"{over['strategy']} ran at {over['output_tokens_per_s']:.1f} tok/s, over the "
            f"model's {bound.tok_s:.1f}: the model bounds nothing in this run")
        result.bound_tok_s = None
        return
    result.bound_tok_s = bound.tok_s


def strategy_means(arms: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Return each strategy's runs merged: mean tok/s and TTFTs, each run's tok/s in order,
    spread (max - min of them; None with one run), preemptions summed over its runs, and for
    runs ``bench combine`` joined, the call each came in (``runs_call``)."""
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for arm in arms:
        runs[arm["strategy"]].append(arm)
    means: dict[str, dict[str, Any]] = {}
    for strategy, mine in runs.items():
        tok_s = [a["output_tokens_per_s"] for a in mine]
        preempted = [a.get("preemptions") for a in mine]
        means[strategy] = {
            "strategy": strategy, "runs": len(mine),
            "output_tokens_per_s": sum(tok_s) / len(tok_s), "runs_tok_s": tok_s,
            "spread_tok_s": max(tok_s) - min(tok_s) if len(tok_s) > 1 else None,
            "min_tok_s": min(tok_s), "max_tok_s": max(tok_s),
            "makespan_s": mean_defined([a.get("makespan_s") for a in mine]),
            "preemptions": (None if all(p is None for p in preempted)
                            else sum(p or 0 for p in preempted)),
            "mean_ttft_s": mean_defined([a.get("mean_ttft_s") for a in mine]),
            "ttft_ready_mean_s": mean_defined([a.get("ttft_ready_mean_s") for a in mine])}
        if any(a.get("call") is not None for a in mine):  # the call each run came in (combine)
            means[strategy]["runs_call"] = [a.get("call") for a in mine]
    return means


def _judge(result: BenchResult) -> None:
    _graph_bound(result)
    # Judged on each strategy's mean over its runs (one run: the run itself).
    result.means = strategy_means(result.arms)
    result.verdicts = []
    result.lead_test = dict(LEAD_TEST)
    by = result.means
    # A fixed arm that made no output (every request failed) measured no ceiling: against
    # its 0 tok/s every check would be met and every lead infinite.
    fixed = [a for a in by.values()
             if respects_graph(a["strategy"]) and a["output_tokens_per_s"] > 0]
    best_fixed = max(fixed, key=lambda a: a["output_tokens_per_s"]) if fixed else None
    if best_fixed is not None:
        result.ceiling_tok_s = best_fixed["output_tokens_per_s"]
        result.ceiling_arm = best_fixed["strategy"]
    bound = by.get(SERVER_BOUND)
    if bound is not None:
        result.server_bound_tok_s = bound["output_tokens_per_s"]
        result.server_bound_arm = SERVER_BOUND
    for a in result.arms:
        tok_s = a["output_tokens_per_s"]
        a["ratio_to_ceiling"] = tok_s / result.ceiling_tok_s if result.ceiling_tok_s else None
        a["ratio_to_server_bound"] = (tok_s / result.server_bound_tok_s
                                      if result.server_bound_tok_s else None)
        a["ratio_to_bound"] = tok_s / result.bound_tok_s if result.bound_tok_s else None
    # Every adaptive variant in the run is judged, each under its own name, so a variant
    # put beside the default (``adaptive:prefetch=off``) is held to the same targets.
    tests = []
    for variant in by.values():
        if variant["strategy"] == "adaptive" or variant["strategy"].startswith("adaptive:"):
            _judge_adaptive(result, variant, best_fixed,
                            next((a for a in fixed if a["strategy"] == "fixed-3"), None))
            if best_fixed is not None:
                tests.append(_lead(variant, best_fixed, fixed))
    result.verdicts = _holm(tests)


def _p(p: float | None) -> str:
    return "unresolved" if p is None else "< 0.001" if p < 0.001 else f"= {p:.3f}"


class _LeadTest(NamedTuple):
    said: str  # the means and what was tested, without the call
    lead: float
    q: float | None  # the p this arm's call is judged by (None: no call can be made)
    unresolved: bool = False  # no variance: ``said`` is the whole line


def _lead(mine: dict[str, Any], best: dict[str, Any], fixed: list[dict[str, Any]]) -> _LeadTest:
    """Say how far ``mine``'s mean leads ``best``'s (the best of the ``fixed`` arms by these
    runs' means) and test it by Welch's t on the runs' tok/s, min(n) - 1 df (``welch_p``),
    two-sided, whichever fixed arm is truly best: a lead is judged by the largest p against
    every fixed arm, a deficit by the p against the best times len(fixed) (Bonferroni: the
    best of several equal arms by their means sits above its true mean, so a deficit to it
    is called by chance up to that many times as often). No p without a variance."""
    lead = mine["output_tokens_per_s"] / best["output_tokens_per_s"] - 1
    said = (f"{mine['strategy']} vs {best['strategy']}: {lead:+.1%} on the means "
            f"({mine['runs']} and {best['runs']} runs)")
    if min(mine["runs"], best["runs"]) < 2:
        return _LeadTest(said + ": unresolved (one run gives no variance)", lead, None, True)
    calls = _by_call(mine, best)
    if calls is not None and min(len(side) for side in calls) < 2:
        return _LeadTest(said + ": unresolved (the two arms ran in different calls, and one "
                         "arm's runs came from one call: a call's own effect cannot be told "
                         "from the arm's)", lead, None, True)
    tested = _welch(mine, best)
    if tested is None:
        return _LeadTest(said + ": unresolved (every run of both arms gave the same tok/s: "
                         "no variance)", lead, None, True)
    p, df = tested
    said += (f", Welch's t{'' if calls is None else ' on the means of their calls'}, df = "
             f"min(n)-1 = {df}, p {_p(p)}")
    if len(fixed) > 1 and lead > 0:
        tests = [_welch(mine, a) for a in fixed if a is not best]
        largest = None if None in tests else max([p, *(t[0] for t in tests if t)])
        said += f"; against each of the {len(fixed)} fixed arms, the largest p {_p(largest)}"
        return _LeadTest(said, lead, largest)
    if len(fixed) > 1:
        said += (f"; the best of {len(fixed)} fixed arms, picked by these runs: the level "
                 f"below it is {LEAD_LEVEL / len(fixed):.4f} (Bonferroni)")
        return _LeadTest(said, lead, min(1.0, p * len(fixed)))
    return _LeadTest(said, lead, p)


def _by_call(mine: dict[str, Any], other: dict[str, Any]) -> tuple[list[float], ...] | None:
    """Return each arm's mean tok/s per call when the two arms did not run in the same calls
    as often (``bench combine`` of files that each hold other arms' runs): a call's effect
    is then shared by one arm's runs and not the other's, and a call, not a run, is the
    independent draw. None when they did (one bench, or whole rounds per file): a call's
    effect then falls on both alike and leaves their difference."""
    calls = [a.get("runs_call") or [None] * len(a["runs_tok_s"]) for a in (mine, other)]
    if Counter(calls[0]) == Counter(calls[1]):
        return None
    sides = []
    for arm, called in zip((mine, other), calls, strict=True):
        grouped: dict[Any, list[float]] = defaultdict(list)
        for call, tok_s in zip(called, arm["runs_tok_s"], strict=True):
            grouped[call].append(tok_s)
        sides.append([sum(v) / len(v) for v in grouped.values()])
    return tuple(sides)


def _welch(mine: dict[str, Any], other: dict[str, Any]) -> tuple[float, int] | None:
    """``welch_p`` on the two arms' runs, or on their calls' means (``_by_call``)."""
    sides = _by_call(mine, other) or (mine["runs_tok_s"], other["runs_tok_s"])
    return welch_p(*sides)


def _holm(tests: list[_LeadTest]) -> list[str]:
    """Call each arm's lead, deficit or neither so that all the calls together keep
    ``LEAD_LEVEL``: Holm's step-down over the arms that have a p (each p times the arms not
    yet called, in ascending order, a call only while every smaller one was one too). With
    one such arm this is its own test at ``LEAD_LEVEL``, and the line says nothing more."""
    lines = [t.said if t.unresolved else "" for t in tests]
    tested = sorted((i for i, t in enumerate(tests) if t.q is not None),
                    key=lambda i: tests[i].q or 0.0)
    family = len(tested)
    adjusted = 0.0
    level = f"at the {LEAD_LEVEL:.0%} level"
    for rank, i in enumerate(tested):
        test = tests[i]
        adjusted = max(adjusted, min(1.0, (family - rank) * (test.q or 0.0)))
        shown = adjusted < LEAD_LEVEL
        said = test.said
        if family > 1:
            said += f"; Holm over the {family} adaptive arms: adjusted p {_p(adjusted)}"
            level = f"at the {LEAD_LEVEL:.0%} level for the {family} adaptive arms together"
        call = (f"a lead {level}" if shown and test.lead > 0 else f"a deficit {level}"
                if shown else f"not shown {level}")
        lines[i] = f"{said}: {call}"
    for i, test in enumerate(tests):  # a test without a p: no call (a fixed arm ran once)
        if not lines[i]:
            lines[i] = f"{test.said}: not shown at the {LEAD_LEVEL:.0%} level"
    return lines


def _judge_adaptive(result: BenchResult, variant: dict[str, Any],
                    best_fixed: dict[str, Any] | None, fixed3: dict[str, Any] | None) -> None:
    name, tok_s = variant["strategy"], variant["output_tokens_per_s"]
    if best_fixed is not None:
        result.checks[f"{name} >= ceiling (best fixed schedule: {best_fixed['strategy']})"] = (
            tok_s >= result.ceiling_tok_s)
    if result.bound_tok_s:
        result.checks[f"{name} >= {BOUND_TARGET} x graph bound"] = (
            tok_s >= BOUND_TARGET * result.bound_tok_s)
    if fixed3:
        result.checks[f"{name} >= 1.5 x fixed-3"] = (
            tok_s >= 1.5 * fixed3["output_tokens_per_s"])
    result.checks[f"{name}: zero preemptions"] = not variant["preemptions"]
    # Time to first token from the graph's issue where both arms have it: a wait at our own
    # gate counts as a wait in the server's queue does. Older files: from sending.
    key = ("ttft_ready_mean_s" if variant.get("ttft_ready_mean_s") is not None
           and best_fixed is not None and best_fixed.get("ttft_ready_mean_s") is not None
           else "mean_ttft_s")
    ttft = variant.get(key)
    if best_fixed and best_fixed.get(key) is not None and ttft is not None:
        since = "from ready" if key == "ttft_ready_mean_s" else "from sending"
        result.checks[f"{name} TTFT {since} <= best fixed-N's ({best_fixed['strategy']})"] = (
            ttft <= best_fixed[key])
