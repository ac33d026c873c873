"""Declare the tables: batches, ticker runs, LLM calls, bodies, decisions, node texts, warnings,
samples; and ``batch_row``, the one reader of a batch's row by its id."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime
from typing import Any, Literal

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    Select,
    String,
    Text,
    UniqueConstraint,
    func,
    select,
)
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.sql import ColumnElement
from sqlalchemy.types import TypeDecorator

from app.db.text import CleanText
from app.errors import InputError

# BigInteger keys autoincrement on PostgreSQL; SQLite only autoincrements INTEGER.
BigId = BigInteger().with_variant(Integer(), "sqlite")


# Whose a failed ticker's failure was (``TickerRun.failure_class``; app/batch/faults.py).
FailureClass = Literal["own", "infrastructure"]
OWN: FailureClass = "own"
INFRASTRUCTURE: FailureClass = "infrastructure"

class Timestamp(TypeDecorator[datetime]):
    """Store aware datetimes; SQLite drops the zone, so values come back as UTC-aware."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to a timezone-aware column")
        if value is not None and dialect.name == "sqlite":
            return value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    pass


class OfBatch:
    """A row of one batch: its own id, then the batch's (indexed), the table's first columns."""

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True, sort_order=-2)
    batch_id: Mapped[int] = mapped_column(BigId, ForeignKey("batches.id"), index=True,
                                          sort_order=-1)


# A batch in one of these states is a finished night whose rows are final: ``partial`` when
# some tickers failed (the ranking shows it and names what it lacks).
FINISHED_STATUSES = ("succeeded", "partial")
# The kinds of batch ``run --resume`` takes; a replay or a bench arm is run again anew.
RESUMABLE_KINDS = ("nightly", "rerun")


class Batch(Base):
    """One run over a universe: nightly, rerun, replay or bench."""

    __tablename__ = "batches"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))  # nightly | rerun | replay | bench
    label: Mapped[str | None] = mapped_column(String(200))
    as_of: Mapped[date] = mapped_column(Date)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    created_at: Mapped[datetime] = mapped_column(Timestamp)
    started_at: Mapped[datetime | None] = mapped_column(Timestamp)
    finished_at: Mapped[datetime | None] = mapped_column(Timestamp)
    heartbeat_at: Mapped[datetime | None] = mapped_column(Timestamp)
    # Read and written only as app/db/batchsettings.py's BatchSettings (its JSON, versioned).
    settings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    server_facts: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    source_batch_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("batches.id"))
    tickers_total: Mapped[int] = mapped_column(Integer, default=0)
    tickers_succeeded: Mapped[int] = mapped_column(Integer, default=0)
    tickers_failed: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(CleanText)


def batch_row(engine: Engine, batch_id: int) -> Batch:
    """Return a batch's row (every column loaded, no session held); InputError when there is
    no such batch."""
    with Session(engine) as session:
        found = session.get(Batch, batch_id)
    if found is None:
        raise InputError(f"no batch with id {batch_id}")
    return found


def nights_newest_first(*where: ColumnElement[bool]) -> Select[tuple[Batch]]:
    """Return the query of nightly batches (with ``where``), this morning's night first.

    The one order of "the latest night" (the ranking, the night's status, the ticker page,
    quality's defaults): the latest as-of date first, since an older date analyzed again is
    not this morning's night; of one date, the batch last active (finished, else its last
    heartbeat, else created: a resumed night finishes after a later one began), then the id.
    """
    return select(Batch).where(Batch.kind == "nightly", *where).order_by(*newest_first())


def newest_first() -> tuple[ColumnElement[Any], ...]:
    """Return ``nights_newest_first``'s order, for a query of batches of any kind."""
    last_active = func.coalesce(Batch.finished_at, Batch.heartbeat_at, Batch.created_at)
    return Batch.as_of.desc(), last_active.desc(), Batch.id.desc()


def night_of_each_date(engine: Engine, *where: ColumnElement[bool]) -> list[Batch]:
    """Return the newest night (``nights_newest_first``) of each as-of date, newest first."""
    with Session(engine) as session:
        nights = session.scalars(nights_newest_first(*where)).all()
    firsts = {n.as_of: n for n in reversed(nights)}  # the last written of a date is its first
    return sorted(firsts.values(), key=lambda n: n.as_of, reverse=True)


class TickerRun(OfBatch, Base):
    """One ticker inside one batch; unique per (batch, ticker)."""

    __tablename__ = "ticker_runs"
    __table_args__ = (UniqueConstraint("batch_id", "ticker", name="uq_ticker_runs_batch_ticker"),)

    ticker: Mapped[str] = mapped_column(String(12))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    samples: Mapped[int] = mapped_column(Integer, default=1)
    started_at: Mapped[datetime | None] = mapped_column(Timestamp)
    finished_at: Mapped[datetime | None] = mapped_column(Timestamp)
    error: Mapped[str | None] = mapped_column(CleanText)
    # Whose failure it was, for a failed ticker: OWN (its answer, data, prompt) or
    # INFRASTRUCTURE (the server, the database): `run --resume` takes the latter up.
    failure_class: Mapped[str | None] = mapped_column(String(16))


class LLMCall(OfBatch, Base):
    """One HTTP attempt of one chat completion, with the server's usage and our timings.

    ``call_id`` names the chat call (its body, every attempt of it on any endpoint) and
    ``attempt`` numbers the call's attempts 1, 2, 3 in the order they were made.
    """

    __tablename__ = "llm_calls"
    __table_args__ = (
        UniqueConstraint("call_id", "attempt", name="uq_llm_calls_call_attempt"),
    )

    ticker: Mapped[str] = mapped_column(String(12))
    node: Mapped[str] = mapped_column(String(40))
    sample: Mapped[int] = mapped_column(Integer, default=0)
    # A uuid's hex (a row given none is a call of its own); rows from before calls had
    # ids carry "batch:ticker:node:sample:first" (migrations/versions/0011_call_id.py).
    call_id: Mapped[str] = mapped_column(String(100), default=lambda: uuid.uuid4().hex)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    model: Mapped[str] = mapped_column(String(200))
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)
    max_tokens: Mapped[int | None] = mapped_column(Integer)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))  # ok | error
    error_class: Mapped[str | None] = mapped_column(String(32))
    http_status: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(CleanText)
    started_at: Mapped[datetime] = mapped_column(Timestamp)
    first_token_at: Mapped[datetime | None] = mapped_column(Timestamp)
    ended_at: Mapped[datetime] = mapped_column(Timestamp)
    # When the graph issued the call, before the client's gate held it (every attempt of
    # the call carries its first issue): time to first token is fair from here.
    ready_at: Mapped[datetime | None] = mapped_column(Timestamp)
    latency_s: Mapped[float] = mapped_column(Float)
    request_id: Mapped[str | None] = mapped_column(String(200))
    # Set when the context guard dropped context to make the prompt fit: the tokens it
    # removed and what (e.g. "2 debate turns, 3 news items"); NULL when sent whole.
    context_trimmed_tokens: Mapped[int | None] = mapped_column(Integer)
    context_trimmed: Mapped[str | None] = mapped_column(String(200))
    # The OpenAI base URL the attempt went to (None on rows older than several endpoints).
    endpoint: Mapped[str | None] = mapped_column(String(300))
    # The server that answered, as a router in front names it in the response header
    # ``llm_server_header``; None where nothing named one (then ``endpoint`` is the router).
    served_by: Mapped[str | None] = mapped_column(String(300))


class LLMRequest(OfBatch, Base):
    """The exact body of one chat call, zlib-compressed, for replay; its rows share its call_id.

    A node makes one call, or more when its decision is asked again (each its own body).
    """

    __tablename__ = "llm_requests"
    __table_args__ = (UniqueConstraint("call_id", name="uq_llm_requests_call"),)

    ticker: Mapped[str] = mapped_column(String(12))
    node: Mapped[str] = mapped_column(String(40))
    sample: Mapped[int] = mapped_column(Integer, default=0)
    call_id: Mapped[str] = mapped_column(String(100))
    body: Mapped[bytes] = mapped_column(LargeBinary)


class Decision(OfBatch, Base):
    """The portfolio manager's structured decision for one sample of one ticker."""

    __tablename__ = "decisions"
    __table_args__ = (
        UniqueConstraint("batch_id", "ticker", "sample", name="uq_decisions_sample"),
    )

    ticker: Mapped[str] = mapped_column(String(12))
    sample: Mapped[int] = mapped_column(Integer, default=0)
    rating: Mapped[str] = mapped_column(String(16))
    score: Mapped[float] = mapped_column(Float)
    confidence: Mapped[float] = mapped_column(Float)
    summary: Mapped[str] = mapped_column(CleanText)
    created_at: Mapped[datetime] = mapped_column(Timestamp)
    # True when the score lies outside the rating's band (agents.decision.SCORE_BANDS), as
    # judged when the row was written: the bands the model was shown at the time.
    contradicts: Mapped[bool | None] = mapped_column(Boolean)


class BatchWarning(OfBatch, Base):
    """One warning the quality monitor wrote about a finished batch."""

    __tablename__ = "batch_warnings"

    kind: Mapped[str] = mapped_column(String(40))  # grade_share | distribution_jump
    message: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(Timestamp)


class ServerSample(OfBatch, Base):
    """One reading of the vLLM server's /metrics during a batch."""

    __tablename__ = "server_samples"

    sampled_at: Mapped[datetime] = mapped_column(Timestamp)
    running: Mapped[float] = mapped_column(Float)
    waiting: Mapped[float] = mapped_column(Float)
    kv_cache_usage: Mapped[float] = mapped_column(Float)
    preemptions_total: Mapped[float] = mapped_column(Float)
    prompt_tokens_total: Mapped[float] = mapped_column(Float)
    generation_tokens_total: Mapped[float] = mapped_column(Float)
    prefix_cache_queries_total: Mapped[float | None] = mapped_column(Float)
    prefix_cache_hits_total: Mapped[float | None] = mapped_column(Float)
    spec_drafts_total: Mapped[float | None] = mapped_column(Float)
    spec_draft_tokens_total: Mapped[float | None] = mapped_column(Float)
    spec_accepted_tokens_total: Mapped[float | None] = mapped_column(Float)
    prefill_time_s_total: Mapped[float | None] = mapped_column(Float)
    decode_time_s_total: Mapped[float | None] = mapped_column(Float)
    # The OpenAI base URL whose /metrics this is (None on rows older than several endpoints).
    endpoint: Mapped[str | None] = mapped_column(String(300))
    # The most our own event loop ran late since the reading before (app/traffic/sampler.py):
    # a client too busy reading its streams has stale gauges (None on older rows).
    client_lag_s: Mapped[float | None] = mapped_column(Float)
    # The tickers whose chains the token budget kept going once this reading had moved it
    # (app/traffic/limits.py ``chain_slots``; None: no cap, no budget, or an older row): the
    # ETA runs the chains left through that many slots, the senior ticker first.
    chain_slots: Mapped[int | None] = mapped_column(Integer)


class NodeText(OfBatch, Base):
    """The text one node produced for one sample of one ticker, kept for the ticker page."""

    __tablename__ = "node_outputs"
    __table_args__ = (
        UniqueConstraint("batch_id", "ticker", "sample", "node", name="uq_node_outputs_node"),
    )

    ticker: Mapped[str] = mapped_column(String(12))
    sample: Mapped[int] = mapped_column(Integer, default=0)
    node: Mapped[str] = mapped_column(String(40))
    position: Mapped[int] = mapped_column(Integer)  # place in the graph's dependency order
    text: Mapped[str] = mapped_column(CleanText)  # LLM text: NUL and lone surrogates cleaned
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(Timestamp)


class SchedulerBeat(Base):
    """The ``nightdesk scheduler`` daemon's latest sign of life: one row per host."""

    __tablename__ = "scheduler_heartbeats"

    host: Mapped[str] = mapped_column(String(255), primary_key=True)
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(Timestamp)
    beat_at: Mapped[datetime] = mapped_column(Timestamp)
    # The daemon's own next run: a night missed and still due shows here before the cron's.
    next_run_at: Mapped[datetime | None] = mapped_column(Timestamp)
    schedule: Mapped[str] = mapped_column(String(200))  # crontab line and zone


class ProgressReading(OfBatch, Base):
    """One reading of a running batch's progress: the inputs of its ETA and the ETA itself
    (``app.batch.eta``), kept so that a night's estimates can be replayed and checked."""

    __tablename__ = "progress_readings"

    taken_at: Mapped[datetime] = mapped_column(Timestamp)
    calls_expected: Mapped[int] = mapped_column(Integer)
    calls_done: Mapped[int] = mapped_column(Integer)  # calls answered, not attempts
    attempts: Mapped[int] = mapped_column(Integer)  # HTTP attempts so far, re-asks included
    output_tokens: Mapped[int] = mapped_column(Integer)  # every attempt's, so far
    tokens_left: Mapped[float] = mapped_column(Float)
    # tokens left ÷ the work bound (and at its slowest and fastest pace): the rate the work
    # left comes out at. Rows written by earlier releases hold the servers' output rate.
    rate_tok_s: Mapped[float | None] = mapped_column(Float)
    rate_low_tok_s: Mapped[float | None] = mapped_column(Float)
    rate_high_tok_s: Mapped[float | None] = mapped_column(Float)
    # before: the night before's shares × pace; night: this night's (older rows: server |
    # calls | batch, where their rate came from)
    rate_source: Mapped[str | None] = mapped_column(String(16))
    chain_left: Mapped[int] = mapped_column(Integer)
    chain_s: Mapped[float | None] = mapped_column(Float)  # chain left at median latencies
    chain_low_s: Mapped[float | None] = mapped_column(Float)  # ... at their quartiles
    chain_high_s: Mapped[float | None] = mapped_column(Float)
    # The ETA and its interval (app.morning.eta: the share of recorded nights' readings it
    # held is its stated level). Rows written by earlier releases hold a spread of inputs.
    eta_s: Mapped[float | None] = mapped_column(Float)
    eta_low_s: Mapped[float | None] = mapped_column(Float)
    eta_high_s: Mapped[float | None] = mapped_column(Float)


class NightRefusal(Base):
    """A night refused at its start, which leaves no batch row (the server down, no snapshot,
    the wrong model, the preflight, its date analyzed, missed): what its digest said, so the
    morning's status can name why (``app.morning.nightstatus``) until a later night starts."""

    __tablename__ = "night_refusals"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    refused_at: Mapped[datetime] = mapped_column(Timestamp, index=True)
    as_of: Mapped[date | None] = mapped_column(Date)  # None: not known (a missed fire)
    title: Mapped[str] = mapped_column(CleanText)  # the digest's: "night of … REFUSED …"
    why: Mapped[str] = mapped_column(CleanText)  # one line
    advice: Mapped[str] = mapped_column(CleanText)  # what to do, in words
    command: Mapped[str | None] = mapped_column(String(500))  # the command in the advice
