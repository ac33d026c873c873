"""Calls through TrackedLLM and its UsageRecorder against a fake server, with the rows they
leave."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Table, select
from sqlalchemy.exc import OperationalError

import app.usage
from agents.chat import CallTag
from agents.fitting import fixed
from app.config import Settings, load_settings
from app.db.models import LLMCall
from app.errors import (
    ContextLengthError,
    LLMHTTPError,
)
from app.llm import TrackedLLM
from app.usage import UsageRecorder
from tests.fakevllm import BASE_URL, CONTEXT_LENGTH_MESSAGE, ChatRequest, FakeServer, Reply
from tests.unit.support.call_rows import new_batch


async def drive_concurrent_calls(engine: Engine, n: int = 200) -> Drive:
    """Send ``n`` scripted calls at once through TrackedLLM and return what happened."""
    batch_id = new_batch(engine)
    fake = FakeServer(scripted)
    settings = load_settings(llm_base_url=BASE_URL, check_context_length=False,
                             call_timeout_s=CALL_TIMEOUT_S, retry_backoff_s=0, max_attempts=3)
    await warm_up(settings, engine)
    # Small batches and a short interval so rows are written while calls are still in flight.
    recorder = UsageRecorder(engine, flush_interval_s=0.02, max_rows=40)
    async with fake.client() as http, recorder:
        llm = TrackedLLM(settings, recorder, http_client=http)
        results = await asyncio.gather(
            *(llm.chat(CallTag(batch_id, f"T{i % 25}", f"node{i // 25}", sample=0),
                       fixed([{"role": "system", "content": "You are terse."},
                              {"role": "user", "content": f"call-{i}"}]), max_tokens=64)
              for i in range(n)),
            return_exceptions=True,
        )
    with engine.connect() as conn:
        rows = conn.execute(select(LLMCall).where(LLMCall.batch_id == batch_id)).all()
    return Drive(fake, batch_id, list(results), list(rows), recorder)


def check_drive(d: Drive, n: int = 200) -> None:
    """Assert rows == attempts, exact token sums, unique keys and per-kind outcomes."""
    fake, rows = d.fake, d.rows
    assert len(rows) == len(fake.chats)
    keys = Counter((r.call_id, r.attempt) for r in rows)
    assert max(keys.values()) == 1
    # One call id per call: its attempts carry its (ticker, node), numbered 1, 2, 3.
    calls: dict[str, list[Any]] = {}
    for r in sorted(rows, key=lambda r: r.attempt):
        calls.setdefault(r.call_id, []).append(r)
    assert len(calls) == n
    for attempts in calls.values():
        assert len({(r.ticker, r.node) for r in attempts}) == 1
        assert [r.attempt for r in attempts] == list(range(1, len(attempts) + 1))

    totals = fake.usage_totals()
    assert sum(r.prompt_tokens or 0 for r in rows) == totals["prompt_tokens"]
    assert sum(r.completion_tokens or 0 for r in rows) == totals["completion_tokens"]
    assert sum(r.cached_tokens or 0 for r in rows) == totals["cached_tokens"]
    assert sum(1 for r in rows if r.status == "ok") == len(fake.served())

    # Join rows to what the fake answered on the same attempt of the same call.
    call_of = {(f"T{i % 25}", f"node{i // 25}"): f"call-{i}" for i in range(n)}
    from_rows = {(call_of[(r.ticker, r.node)], r.attempt, r.status, r.error_class, r.http_status)
                 for r in rows}
    from_fake = {(c.key, c.attempt, *EXPECTED_ROW[outcome_of(c.key, c.attempt)])
                 for c in fake.chats}
    assert from_rows == from_fake

    # Attempts per call follow the retry rules: 5xx and timeouts retried up to 3, 4xx never.
    tries = Counter(c.key for c in fake.chats)
    for i in range(n):
        plan = plan_for(i)
        want = {"500": 3, "400": len(plan), "400ctx": 1}.get(plan[-1], len(plan))
        assert tries[f"call-{i}"] == want, (i, plan)
        result = d.results[i]
        if plan[-1] == "ok":
            assert not isinstance(result, BaseException), result
            assert result.attempts == len(plan)
            assert result.content == "Hold the line."
        else:
            expected = {"500": LLMHTTPError, "400": LLMHTTPError,
                        "400ctx": ContextLengthError}[plan[-1]]
            assert type(result) is expected, (i, result)
    for r in rows:
        assert r.started_at <= r.ended_at
        assert r.latency_s >= 0
        assert r.model == "smollm2-135m" and r.max_tokens == 64
    assert d.recorder.written == len(rows)


def flaky_insert(fail_times: int, *, after_write: bool) -> tuple[Any, Counter[str]]:
    """Wrap the real insert so its first ``fail_times`` calls raise OperationalError.

    With ``after_write`` the rows are committed before the error is raised: the write
    succeeded but the writer was told it failed, the case a retry could double.
    """
    real = app.usage.insert_ignoring_duplicates
    count: Counter[str] = Counter()

    def insert(engine: Engine, table: Table, rows: list[dict[str, Any]]) -> None:
        count["calls"] += 1
        if count["calls"] <= fail_times:
            if after_write:
                real(engine, table, rows)
            raise OperationalError("INSERT INTO ...", {}, Exception("database is locked"))
        real(engine, table, rows)

    return insert, count


async def one_call(engine: Engine, fake: FakeServer, *,
                   messages: list[dict[str, str]] | None = None,
                   **overrides: Any) -> tuple[Any, list[Any]]:
    """Make one chat call of ``messages`` (default ``MESSAGES``) through a fresh tracker;
    return its result (or error) and rows."""
    batch_id = new_batch(engine)
    settings = load_settings(llm_base_url=BASE_URL,
                             **{"check_context_length": False, "retry_backoff_s": 0,
                                **overrides})
    result: Any
    async with fake.client() as http, UsageRecorder(engine, flush_interval_s=0.01) as rec:
        llm = TrackedLLM(settings, rec, http_client=http)
        try:
            result = await llm.chat(CallTag(batch_id, "AAPL", "analyst"),
                                    fixed(messages or MESSAGES), max_tokens=100)
        except Exception as error:
            result = error
    with engine.connect() as conn:
        rows = conn.execute(select(LLMCall).where(LLMCall.batch_id == batch_id)
                            .order_by(LLMCall.id)).all()
    return result, list(rows)


# What each scripted outcome must look like in its row: (status, error_class, http_status).
EXPECTED_ROW = {
    "ok": ("ok", None, None),
    "500": ("error", "http", 500),
    "400": ("error", "http", 400),
    "400ctx": ("error", "context_length", 400),
    "hang": ("error", "timeout", None),
}


def plan_for(i: int) -> list[str]:
    """Script call ``i``: a mix of clean, retried, failing and hanging calls."""
    kind = i % 20
    if kind in (0, 10):
        return ["500", "ok"]           # fails once, passes on retry
    if kind == 1:
        return ["500"]                 # fails every attempt
    if kind in (2, 12):
        return ["400"]                 # not retried
    if kind == 3:
        return ["hang", "ok"]          # times out once, then passes
    if kind == 13:
        return ["hang", "400"]         # times out, then fails for good on the retry
    if kind == 4:
        return ["400ctx"]              # server says the prompt is too long
    return ["ok"]


def outcome_of(key: str, attempt: int) -> str:
    """Return what the script says attempt ``attempt`` of call ``key`` gets (the last repeats)."""
    plan = plan_for(int(key.split("-")[1])) if key.startswith("call-") else ["ok"]
    return plan[min(attempt, len(plan)) - 1]


@dataclass
class Drive:
    """What a 200-call drive produced: the fake's view, the callers' view and the rows."""

    fake: FakeServer
    batch_id: int
    results: list[Any]
    rows: list[Any]
    recorder: UsageRecorder


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "AAPL?"}]


# Far above what an instant answer takes with 200 in flight (about 0.4 s on 2 idle cores, all
# spent in the OpenAI client; under -n 2 beside other work, over 1.5 s was seen, and a call
# that times out before the fake saw it is an attempt the fake cannot count), yet short
# enough that the hanging calls (three attempts each) keep the test under 20 s.
CALL_TIMEOUT_S = 5.0


def scripted(chat: ChatRequest) -> Reply:
    """Answer each attempt as ``plan_for`` says, with usage that differs per call and attempt."""
    outcome = outcome_of(chat.key, chat.attempt)
    if outcome == "500":
        return Reply(status=500, error="engine crashed")
    if outcome == "400":
        return Reply(status=400, error="bad top_k")
    if outcome == "400ctx":
        return Reply(status=400, error=CONTEXT_LENGTH_MESSAGE)
    if outcome == "hang":
        return Reply(delay_s=60)  # longer than any test's call timeout
    i = int(chat.key.split("-")[1]) if chat.key.startswith("call-") else 0
    return Reply("Hold the line.", chunks=4, prompt_tokens=30 + i,
                 completion_tokens=3 + (i * chat.attempt) % 11, cached_tokens=(i % 5) * 8)


async def warm_up(settings: Settings, engine: Engine) -> None:
    """Send one untracked call, so the OpenAI client's lazy imports (~0.7 s) hit no timeout."""
    async with FakeServer(scripted).client() as http:
        llm = TrackedLLM(settings, UsageRecorder(engine), http_client=http)
        await llm.chat(CallTag(0, "WARM", "warm"), fixed([{"role": "user", "content": "hi"}]),
                       max_tokens=4)
