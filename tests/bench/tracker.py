"""Measure what usage tracking adds per call, against a fake server that answers instantly.

Two arms run the same N streamed chat completions, ``concurrency`` at a time, against the
same fake (``tests.fakevllm``, the one the unit tests use, through its
``httpx.MockTransport``), so the fake's own cost is the same in both:

* baseline: the raw ``openai.AsyncOpenAI`` client, nothing recorded;
* tracked: ``TrackedLLM`` + ``UsageRecorder`` writing ``llm_calls`` and ``llm_requests``
  to SQLite or PostgreSQL.

Added wall time per call is ``(tracked wall - baseline wall) / N``; the final flush (rows
still buffered when the last call returns) is timed separately. Arms are interleaved in a
rotating order over several rounds and the median of the per-round differences is
reported, because a shared 2-core machine drifts by more than the effect being measured.
Process CPU time (both threads) is reported beside wall time as a steadier second view::

    python -m tests.bench.tracker --calls 500 --concurrency 64 --database both --repeats 15
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from openai import AsyncOpenAI
from rich.console import Console
from rich.table import Table
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.engine import make_url

from agents.chat import CallTag
from app.bench.machine import machine_facts
from app.cli.common import setup
from app.config import Settings, load_settings
from app.db.engine import check_reachable, get_engine, upgrade
from app.db.models import Batch, LLMCall, LLMRequest
from app.errors import DatabaseError, InputError
from app.llm import TrackedLLM
from app.usage import UsageRecorder
from tests.bench import run
from tests.fakevllm import BASE_URL, FakeServer, Reply

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
TARGET_MS_PER_CALL = 1.0

Database = Literal["sqlite", "postgresql", "both"]

# A node prompt of realistic size (~4 KB), so body encoding and compression cost what they do.
PROMPT = ("Close 187.2, SMA50 181.4, RSI14 61.3, MACD 1.21 over signal 0.98. " * 60).strip()


def bench_server() -> FakeServer:
    """Return the project's fake server answering at once with one short stream per call.

    Short on purpose: 8 content chunks, then the finish and the usage; the OpenAI client's
    per-chunk parsing is the same in both arms and only adds noise on top of the per-call
    cost being measured. /tokenize says 900 tokens of 32,768.
    """
    reply = Reply("".join(f" word{i}" for i in range(8)), chunks=8, prompt_tokens=900,
                  completion_tokens=8, cached_tokens=512)
    return FakeServer(lambda chat: reply, tokenize_count=900, max_model_len=32768,
                      model="bench")


def bench_settings() -> Settings:
    """Return production defaults pointed at the fake (context precheck and bodies on)."""
    return load_settings(llm_base_url=BASE_URL, retry_backoff_s=0)


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are a market analyst. Be concise."},
            {"role": "user", "content": f"Ticker #{i}. {PROMPT}"}]


async def run_baseline(settings: Settings, calls: int, concurrency: int) -> tuple[float, float]:
    """Send the calls through the raw OpenAI client; return wall and process CPU seconds."""
    gate = asyncio.Semaphore(concurrency)
    async with bench_server().client() as http:
        client = AsyncOpenAI(base_url=BASE_URL, api_key="EMPTY", max_retries=0,
                             timeout=settings.calls.call_timeout_s, http_client=http)

        async def one(i: int) -> None:
            # The body TrackedLLM.build_body would send, so both arms encode the same bytes.
            body: dict[str, Any] = {
                "model": settings.llm.model, "messages": messages(i), "max_tokens": 256,
                "temperature": settings.sampling.temperature, "top_p": settings.sampling.top_p,
                "presence_penalty": settings.sampling.presence_penalty, "seed": i,
                "extra_body": {"top_k": settings.sampling.top_k,
                               "chat_template_kwargs": {"enable_thinking": False}},
            }
            async with gate:
                stream = await client.chat.completions.create(
                    **body, stream=True, stream_options={"include_usage": True})
                content: list[str] = []
                async for chunk in stream:
                    for choice in chunk.choices:
                        if choice.delta and choice.delta.content:
                            content.append(choice.delta.content)

        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(i) for i in range(calls)))
        return time.perf_counter() - started, time.process_time() - cpu


def new_batch(engine: Engine, label: str) -> int:
    with engine.begin() as conn:
        result = conn.execute(Batch.__table__.insert().values(  # type: ignore[attr-defined]
            kind="bench", label=label, as_of=date.today(), status="running",
            created_at=datetime.now(UTC), settings={}, tickers_total=0,
            tickers_succeeded=0, tickers_failed=0))
        key = result.inserted_primary_key
        assert key is not None
        return int(key[0])


@dataclass
class TrackedRun:
    wall_s: float
    cpu_s: float
    flush_s: float
    rows: int
    bodies: int


async def run_tracked(settings: Settings, engine: Engine, calls: int,
                      concurrency: int) -> TrackedRun:
    """Send the calls through TrackedLLM + UsageRecorder; time the calls and the final flush."""
    batch_id = new_batch(engine, "tracker-bench")
    gate = asyncio.Semaphore(concurrency)
    async with bench_server().client() as http:
        async with UsageRecorder(engine) as recorder:
            llm = TrackedLLM(settings, recorder, http_client=http)
            # One untimed call first: a fresh client learns max-model-len from /tokenize, and
            # until then every concurrent call asks too (64 requests). A batch pays that once;
            # N short rounds would each pay it, so it is kept out of the per-call figure.
            # Each call's body is sent as it is built, unfitted: tracking alone is measured.
            warm = CallTag(batch_id, "WARMUP", "bench")
            await llm.send(warm, llm.build_body(warm, messages(-1), max_tokens=256))

            async def one(i: int) -> None:
                tag = CallTag(batch_id, f"T{i % 500}", "bench", sample=i)
                async with gate:
                    await llm.send(tag, llm.build_body(tag, messages(i), max_tokens=256))

            started, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(one(i) for i in range(calls)))
            # Process CPU counts the writer thread too; it shrugs off load from other processes.
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
            started = time.perf_counter()  # the recorder's exit writes what is left
        flush = time.perf_counter() - started
    with engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(LLMCall)
                            .where(LLMCall.batch_id == batch_id)).scalar_one()
        bodies = conn.execute(select(func.count()).select_from(LLMRequest)
                              .where(LLMRequest.batch_id == batch_id)).scalar_one()
    # The warm-up call is the one row beyond N.
    return TrackedRun(wall, cpu, flush, int(rows) - 1, int(bodies) - 1)


@contextlib.contextmanager
def sqlite_database(keep: Path | None = None) -> Iterator[str]:
    """Yield the URL of a blank, upgraded SQLite file in a temporary folder, or at ``keep``
    (a new file, kept afterwards)."""
    with tempfile.TemporaryDirectory(prefix="nightdesk-bench-") as folder:
        if keep is not None and keep.exists():
            raise InputError(f"{keep} exists already: give a new file")
        url = f"sqlite:///{keep.resolve() if keep else Path(folder) / 'bench.db'}"
        upgrade(url)
        try:
            yield url
        finally:
            get_engine(url).dispose()


@contextlib.contextmanager
def postgres_schema(url: str) -> Iterator[str]:
    """Yield a URL whose tables live in a private schema, dropped afterwards."""
    base = make_url(url)
    if base.get_backend_name() != "postgresql":
        raise InputError(f"--pg-url must be a postgresql URL, not {base.drivername}")
    if base.drivername == "postgresql":
        base = base.set(drivername="postgresql+psycopg")
    schema = f"nightdesk_bench_{os.getpid()}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT",
                          connect_args={"connect_timeout": 5})
    try:
        check_reachable(admin)
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        # search_path puts every table (and alembic_version) in the private schema.
        private = base.update_query_dict({"options": f"-csearch_path={schema}"})
        private_url = private.render_as_string(hide_password=False)
        try:
            upgrade(private_url)
            yield private_url
        finally:
            get_engine(private_url).dispose()
            with admin.connect() as conn:
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    finally:
        admin.dispose()


@dataclass
class ArmSummary:
    """The rounds of one arm and their medians."""

    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    flush_s: list[float] = field(default_factory=list)
    rows_ok: bool = True
    median_wall_s: float = 0.0
    median_cpu_s: float = 0.0
    median_flush_s: float = 0.0
    ms_per_call: float = 0.0
    added_ms_per_call: float | None = None
    added_cpu_ms_per_call: float | None = None
    added_ms_per_call_with_flush: float | None = None


@dataclass
class TrackerBench:
    calls: int
    concurrency: int
    repeats: int
    machine: dict[str, Any]
    date: str
    arms: dict[str, ArmSummary]
    target_ms_per_call: float = TARGET_MS_PER_CALL

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def meets_target(self) -> bool:
        return all(a.added_ms_per_call is not None and a.added_ms_per_call < self.target_ms_per_call
                   and a.rows_ok for name, a in self.arms.items() if name != "baseline")


async def _bench(calls: int, concurrency: int, repeats: int,
                 urls: dict[str, str]) -> dict[str, ArmSummary]:
    settings = bench_settings()
    engines = {name: get_engine(url) for name, url in urls.items()}
    arms = ["baseline", *engines]
    summary = {name: ArmSummary() for name in arms}
    # One small untimed round pays the lazy imports and first connections.
    await run_baseline(settings, min(calls, concurrency), concurrency)
    for engine in engines.values():
        await run_tracked(settings, engine, min(calls, concurrency), concurrency)
    for round_ in range(repeats):
        # Rotate the order, so no arm always runs first (or right after a database write).
        order = arms[round_ % len(arms):] + arms[:round_ % len(arms)]
        for name in order:
            gc.collect()
            if name == "baseline":
                wall, cpu = await run_baseline(settings, calls, concurrency)
                summary[name].wall_s.append(wall)
                summary[name].cpu_s.append(cpu)
                continue
            run = await run_tracked(settings, engines[name], calls, concurrency)
            summary[name].wall_s.append(run.wall_s)
            summary[name].cpu_s.append(run.cpu_s)
            summary[name].flush_s.append(run.flush_s)
            summary[name].rows_ok &= run.rows == calls and run.bodies == calls
    base = summary["baseline"]
    for arm in summary.values():
        arm.median_wall_s = statistics.median(arm.wall_s)
        arm.median_cpu_s = statistics.median(arm.cpu_s)
        arm.ms_per_call = arm.median_wall_s / calls * 1000
        if arm is base:
            continue
        arm.median_flush_s = statistics.median(arm.flush_s)

        # Pair each round with that round's baseline: slow drift on a shared machine cancels.
        def added(mine: list[float], theirs: list[float]) -> float:
            diffs = [a - b for a, b in zip(mine, theirs, strict=True)]
            return statistics.median(diffs) / calls * 1000

        arm.added_ms_per_call = added(arm.wall_s, base.wall_s)
        arm.added_cpu_ms_per_call = added(arm.cpu_s, base.cpu_s)
        arm.added_ms_per_call_with_flush = added(
            [w + f for w, f in zip(arm.wall_s, arm.flush_s, strict=True)], base.wall_s)
    return summary


def run_tracker_bench(calls: int, concurrency: int, database: Database, pg_url: str,
                      repeats: int) -> TrackerBench:
    """Run the whole benchmark on the chosen databases; private databases are removed after."""
    if calls < 1 or concurrency < 1 or repeats < 1:
        raise InputError("--calls, --concurrency and --repeats must be at least 1")
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        if database in ("sqlite", "both"):
            urls["sqlite"] = stack.enter_context(sqlite_database())
        if database in ("postgresql", "both"):
            try:
                urls["postgresql"] = stack.enter_context(postgres_schema(pg_url))
            except DatabaseError as error:
                raise DatabaseError(f"{error} (pass --pg-url or --database sqlite)") from None
        arms = asyncio.run(_bench(calls, concurrency, repeats, urls))
    return TrackerBench(calls=calls, concurrency=concurrency, repeats=repeats,
                        machine=machine_facts().model_dump(),
                        date=datetime.now(UTC).isoformat(timespec="seconds"), arms=arms)


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def tracker(
    calls: Annotated[int, typer.Option(help="Calls per arm and round.")] = 500,
    concurrency: Annotated[int, typer.Option(help="Calls in flight at once.")] = 64,
    database: Annotated[Literal["sqlite", "postgresql", "both"],
                        typer.Option(help="Where the tracked arm writes.")] = "both",
    pg_url: Annotated[str, typer.Option(help="PostgreSQL server; a private schema is "
                                             "created there and dropped after.")]
        = "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    repeats: Annotated[int, typer.Option(help="Interleaved rounds; medians are reported.")] = 15,
    json_out: Annotated[Path | None, typer.Option(help="Also write the figures here.")] = None,
) -> None:
    """Measure the wall time usage tracking adds per call against a zero-latency fake server."""
    setup()
    result = run_tracker_bench(calls, concurrency, database, pg_url, repeats)
    table = Table(title=f"tracker overhead: {calls} calls, {concurrency} concurrent, "
                        f"median of {repeats} rounds")
    for col in ("arm", "wall s", "ms/call", "+ms/call", "+CPU ms/call", "final flush s",
                "+ms/call incl. flush", "rows written"):
        table.add_column(col, justify="left" if col == "arm" else "right")
    for name, arm in result.arms.items():
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}"
        table.add_row(name, f"{arm.median_wall_s:.3f}", ms(arm.ms_per_call),
                      ms(arm.added_ms_per_call), ms(arm.added_cpu_ms_per_call),
                      "-" if name == "baseline" else f"{arm.median_flush_s:.3f}",
                      ms(arm.added_ms_per_call_with_flush),
                      "-" if name == "baseline" else ("all" if arm.rows_ok else "MISSING"))
    console = Console()
    if not console.is_terminal:
        # Piped into a log: do not fold the table into 80 columns.
        console = Console(width=130)
    console.print(table)
    m = result.machine
    console.print(f"{m['cpu_model']}, {m['cores']} cores, Python {m['python']}, {result.date}; "
                  f"target < {result.target_ms_per_call} ms/call added: "
                  + ("met" if result.meets_target() else "[bold red]missed[/]"))
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    if not all(a.rows_ok for a in result.arms.values()):
        raise typer.Exit(1)


if __name__ == "__main__":
    run(app)
