"""One call meeting back-pressure (HTTP 429/503): waited out, Retry-After honoured, budgeted.

A burst of refusals is the server shedding load, not a verdict on the request: it uses up
none of the call's ``max_attempts``, is waited out as ``Retry-After`` says (seconds or an
HTTP-date) or backing off, and past the outage budget ends in ServerBusy, which stops the
batch resumable. Other faults keep their ``max_attempts`` (tests/unit/test_llm.py).
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from sqlalchemy import Engine

from app.config import load_settings
from app.errors import LLMHTTPError, ServerBusy
from app.llm import TrackedLLM, retry_after
from app.traffic.strategy import Strategy
from app.usage import UsageRecorder
from tests.fakevllm import BASE_URL, FakeServer, Reply
from tests.unit.support.call_rows import new_batch
from tests.unit.support.llm_calls import one_call
from tests.unit.support.servers import ask, one_server


def test_retry_after_is_read_as_seconds_or_as_an_http_date() -> None:
    assert retry_after("2") == 2.0
    assert retry_after(" 0 ") == 0.0
    assert retry_after("-3") == 0.0  # never a negative wait
    ahead = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    waited = retry_after(ahead)
    assert waited is not None and 28.0 <= waited <= 30.0  # whole seconds, read just after
    past = format_datetime(datetime.now(UTC) - timedelta(hours=1), usegmt=True)
    assert retry_after(past) == 0.0
    assert retry_after(None) is None and retry_after("") is None
    assert retry_after("soon, maybe") is None


async def test_a_429_with_retry_after_waits_what_the_server_asked(
        sqlite_engine: Engine) -> None:
    fake = FakeServer()
    fake.burst(429, 2, retry_after="1")
    result, rows = await one_call(sqlite_engine, fake, max_attempts=1)
    assert result.attempts == 3  # two refusals, then the answer: beyond max_attempts=1
    arrivals = [chat.at for chat in fake.chats]
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert len(gaps) == 2 and all(gap >= 0.99 for gap in gaps), gaps
    assert [(r.attempt, r.status, r.http_status) for r in rows] == [
        (1, "error", 429), (2, "error", 429), (3, "ok", None)]


async def test_a_burst_of_503_longer_than_the_attempts_is_waited_out_backing_off(
        sqlite_engine: Engine) -> None:
    fake = FakeServer()
    fake.burst(503, 10)
    base, cap = 0.01, 0.04
    result, rows = await one_call(sqlite_engine, fake, max_attempts=3, retry_backoff_s=base,
                                  retry_wait_max_s=cap)
    assert result.attempts == 11 and len(rows) == 11 == len(fake.chats)
    assert [r.http_status for r in rows] == [503] * 10 + [None]
    arrivals = [chat.at for chat in fake.chats]
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    # Each wait is at least half its exponential step (never a burst of tries ms apart),
    # the steps doubling from the base up to the cap.
    floors = [min(cap, base * 2 ** n) / 2 for n in range(10)]
    assert all(gap >= floor * 0.95 for gap, floor in zip(gaps, floors, strict=True)), gaps


async def test_back_pressure_past_the_outage_budget_ends_in_server_busy(
        sqlite_engine: Engine) -> None:
    fake = FakeServer()
    fake.burst(503, 10_000, retry_after="0")
    result, rows = await one_call(sqlite_engine, fake, outage_budget_s=0.3,
                                  retry_backoff_s=0.01)
    assert isinstance(result, ServerBusy) and result.exit_code == 5
    assert isinstance(result.__cause__, LLMHTTPError)
    said = str(result)
    assert "HTTP 503" in said and "past the outage budget (0.3 s)" in said
    assert "\n" not in said
    assert len(rows) == len(fake.chats) >= 3  # every refused attempt has its row


@pytest.mark.parametrize("status", [500, 502])
async def test_other_server_errors_keep_their_attempts(sqlite_engine: Engine,
                                                       status: int) -> None:
    fake = FakeServer()
    fake.burst(status, 10)
    result, rows = await one_call(sqlite_engine, fake, max_attempts=3)
    assert isinstance(result, LLMHTTPError) and result.http_status == status
    assert len(rows) == 3 == len(fake.chats)


async def test_a_routers_unreachable_server_is_waited_out_not_counted(
        sqlite_engine: Engine) -> None:
    # vllm-router's answer while the server it picked is dead and its health check has not
    # yet noticed: five in a row, more than max_attempts, and the call still gets through.
    gone = Reply(status=500, error="Request failed: error sending request for url "
                                   "(http://10.0.0.2:8000/v1/chat/completions)")
    fake = FakeServer(lambda chat: gone if len(fake.chats) <= 5 else None)
    result, rows = await one_call(sqlite_engine, fake, max_attempts=3, outage_budget_s=30)
    assert not isinstance(result, Exception), result
    assert [r.http_status for r in rows] == [500] * 5 + [None]
    # Past the outage budget it is the server's outage, said as back-pressure is.
    fake = FakeServer(lambda chat: gone)
    result, rows = await one_call(sqlite_engine, fake, max_attempts=3, outage_budget_s=0.3,
                                  retry_backoff_s=0.01)
    assert isinstance(result, ServerBusy) and len(rows) >= 3


async def test_a_retry_after_holds_back_every_call_to_that_server(
        sqlite_engine: Engine) -> None:
    # A's first attempt is told to come back in a second; B, issued after that answer, waits
    # for the same second instead of meeting the server at once.
    fake = FakeServer()
    fake.burst(429, 1, retry_after="1")
    settings = load_settings(llm_base_url=BASE_URL, retry_backoff_s=0,
                             check_context_length=False)
    batch_id = new_batch(sqlite_engine)
    async with fake.client() as http, UsageRecorder(sqlite_engine) as recorder:
        servers = one_server(TrackedLLM(settings, recorder, http_client=http),
                             Strategy.parse("fixed-2"))

        async with asyncio.TaskGroup() as group:
            group.create_task(ask(servers, batch_id, "A", 0))
            while not fake.chats:
                await asyncio.sleep(0.005)
            group.create_task(ask(servers, batch_id, "B", 1))
    refused, *later = fake.chats
    assert refused.key == "A?" and {c.key for c in later} == {"A?", "B?"} and len(later) == 2
    assert all(chat.at - refused.at >= 0.99 for chat in later), [c.at - refused.at
                                                                  for c in later]
