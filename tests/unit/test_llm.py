"""Check what TrackedLLM records per attempt: timings, cached tokens, retries, context checks."""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import httpx
import pytest
import structlog
from sqlalchemy import Engine, select

from agents.chat import CallTag
from agents.fitting import fixed
from app.config import load_settings
from app.db.models import LLMCall, LLMRequest
from app.errors import (
    ContextLengthError,
    LLMConnectionError,
    LLMError,
    LLMHTTPError,
    LLMMalformedError,
    LLMStreamError,
)
from app.llm import Call, TrackedLLM
from app.promptsize import PromptCounter
from app.usage import UsageRecorder, decompress_body
from tests.fakevllm import BASE_URL, CONTEXT_LENGTH_MESSAGE, FakeServer, Reply
from tests.fakevllm.router import FakeRouter
from tests.unit.support.call_rows import new_batch
from tests.unit.support.llm_calls import MESSAGES, one_call

ANSWER = Reply("Hold the line.", chunks=4)


def answering(*replies: Reply) -> FakeServer:
    """Return a fake whose n-th attempt of a call gets the n-th reply (the last one repeats)."""
    return FakeServer(lambda chat: replies[min(chat.attempt, len(replies)) - 1])


async def test_time_to_first_token_is_recorded(sqlite_engine: Engine) -> None:
    # 0.15 s before decoding, then four one-token pieces 0.05 s apart: the first token
    # lands after 0.2 s and the last 0.15 s later.
    fake = answering(Reply("Hold the line.", chunks=4, completion_tokens=4, delay_s=0.15,
                           token_delay_s=0.05))
    result, rows = await one_call(sqlite_engine, fake)
    assert result.content == "Hold the line."
    (row,) = rows
    assert row.started_at < row.first_token_at < row.ended_at
    assert row.first_token_at - row.started_at >= timedelta(seconds=0.19)
    assert row.ended_at - row.first_token_at >= timedelta(seconds=0.14)
    assert row.latency_s >= 0.34
    assert row.finish_reason == "stop" and row.request_id.startswith("chatcmpl-")


async def test_usage_and_cached_tokens_come_from_the_final_chunk(sqlite_engine: Engine) -> None:
    fake = answering(Reply("Hold the line.", prompt_tokens=123, completion_tokens=45,
                           cached_tokens=96))
    result, rows = await one_call(sqlite_engine, fake)
    (row,) = rows
    assert (row.prompt_tokens, row.completion_tokens, row.cached_tokens) == (123, 45, 96)
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (123, 45, 96)
    assert row.status == "ok" and row.error_class is None and row.max_tokens == 100


async def test_the_openai_client_does_not_retry_on_its_own(sqlite_engine: Engine) -> None:
    # With one attempt allowed, a 500 must reach the server exactly once: were the OpenAI
    # client's default max_retries=2 active, the fake would see three requests.
    fake = answering(Reply(status=500, error="engine crashed"))
    result, rows = await one_call(sqlite_engine, fake, max_attempts=1)
    assert isinstance(result, LLMHTTPError) and result.http_status == 500
    assert len(fake.chats) == 1 == len(rows)


async def test_retries_write_one_row_per_attempt(sqlite_engine: Engine) -> None:
    fake = answering(Reply(status=500), Reply(status=500), ANSWER)
    result, rows = await one_call(sqlite_engine, fake, max_attempts=3)
    assert result.attempts == 3
    assert len(fake.chats) == 3 == len(rows)
    assert [(r.attempt, r.status, r.http_status) for r in rows] == [
        (1, "error", 500), (2, "error", 500), (3, "ok", None)]
    # Usage only on the answered attempt, and exactly what the fake reported for it.
    served = fake.chats[2].served
    assert served is not None
    assert rows[0].prompt_tokens is None
    assert (rows[2].prompt_tokens, rows[2].completion_tokens) == (
        served.prompt_tokens, served.completion_tokens)


async def test_a_call_sent_again_keeps_its_id_body_and_numbering(sqlite_engine: Engine) -> None:
    # The first send spends its two attempts; the second (failover's, on another client)
    # is the same call: its attempts go on at 3, and its body is stored once.
    fake = answering(Reply(status=500), Reply(status=500), ANSWER)
    batch_id = new_batch(sqlite_engine)
    settings = load_settings(llm_base_url=BASE_URL, retry_backoff_s=0, max_attempts=2,
                             check_context_length=False)
    tag, call = CallTag(batch_id, "AAPL", "analyst"), Call()
    async with fake.client() as http, UsageRecorder(sqlite_engine) as rec:
        with pytest.raises(LLMHTTPError):
            await TrackedLLM(settings, rec, http_client=http).chat(tag, fixed(MESSAGES),
                                                                   max_tokens=100, call=call)
        result = await TrackedLLM(settings, rec, http_client=http).chat(
            tag, fixed(MESSAGES), max_tokens=100, call=call)
        other = await TrackedLLM(settings, rec, http_client=http).chat(tag, fixed(MESSAGES),
                                                                       max_tokens=100)
    assert result.attempts == 3 and other.attempts == 1
    with sqlite_engine.connect() as conn:
        rows = conn.execute(select(LLMCall.call_id, LLMCall.attempt, LLMCall.status)
                            .order_by(LLMCall.id)).all()
        bodies = conn.execute(select(LLMRequest.call_id).order_by(LLMRequest.id)).scalars()
        assert list(bodies) == [call.id, rows[-1].call_id]
    assert [tuple(r) for r in rows[:3]] == [(call.id, 1, "error"), (call.id, 2, "error"),
                                            (call.id, 3, "ok")]
    assert rows[3].call_id != call.id and rows[3].attempt == 1


async def test_every_attempt_carries_the_tickers_routing_key(sqlite_engine: Engine) -> None:
    # A router hashes on the session headers or the OpenAI ``user`` field: one ticker's
    # calls (any node, any attempt, any batch) carry one key, another ticker's another.
    fake = answering(Reply(status=500), ANSWER)
    batch_id, other_batch = new_batch(sqlite_engine), new_batch(sqlite_engine)
    settings = load_settings(llm_base_url=BASE_URL, retry_backoff_s=0,
                             check_context_length=False)
    async with fake.client() as http, UsageRecorder(sqlite_engine) as rec:
        llm = TrackedLLM(settings, rec, http_client=http)
        for tag in (CallTag(batch_id, "AAPL", "analyst"), CallTag(batch_id, "AAPL", "risk"),
                    CallTag(batch_id, "MSFT", "analyst"), CallTag(other_batch, "AAPL", "risk")):
            await llm.chat(tag, fixed(MESSAGES), max_tokens=100)
    sent = [r for r in fake.requests if r.path == "/v1/chat/completions"]
    keys = [(r.headers.get("x-session-id"), r.headers.get("x-user-id"), r.body.get("user"))
            for r in sent]
    aapl, msft = "nightdesk:AAPL", "nightdesk:MSFT"
    # The first call's two attempts (its first meets the 500), then one for each other call;
    # AAPL in the other batch keeps its key (a replay sends what the night sent).
    assert keys == [(aapl,) * 3] * 3 + [(msft,) * 3] + [(aapl,) * 3]
    with sqlite_engine.connect() as conn:
        bodies = conn.execute(select(LLMRequest.body)).scalars().all()
    # The stored bodies are the prompt's alone.
    assert len(bodies) == 4 and all("user" not in decompress_body(b) for b in bodies)


async def test_a_call_goes_out_as_built_without_the_sdks_walk_of_its_messages(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given as typed parameters, the SDK transformed each message against every message
    # type it knows: 0.4 of the client's 1.3 ms for a call, most of a second when a fleet's
    # 2,000 first calls go out together. The body is plain JSON: it goes out as built.
    from openai._utils import _transform

    walked: list[str] = []
    walk = _transform._async_transform_typeddict

    async def counted(data: Any, expected_type: type) -> Any:
        walked.append(expected_type.__name__)
        return await walk(data, expected_type)

    monkeypatch.setattr(_transform, "_async_transform_typeddict", counted)
    fake = answering(ANSWER)
    settings = load_settings(llm_base_url=BASE_URL, check_context_length=False)
    tag = CallTag(new_batch(sqlite_engine), "AAPL", "analyst")
    async with fake.client() as http, UsageRecorder(sqlite_engine) as rec:
        llm = TrackedLLM(settings, rec, http_client=http)
        body = llm.build_body(tag, MESSAGES, max_tokens=100,
                              response_format={"type": "json_object"})
        await llm.send(tag, body)
    plain = {key: value for key, value in body.items() if key != "extra_body"}
    assert [r.body for r in fake.requests if r.path == "/v1/chat/completions"] == [
        {**plain, **body["extra_body"], "user": "nightdesk:AAPL", "stream": True,
         "stream_options": {"include_usage": True}}]
    assert len(walked) <= 1  # the SDK's own top-level parameters at most, never a message


async def test_a_dropped_connection_is_retried_and_recorded(sqlite_engine: Engine) -> None:
    fake = answering(Reply(drop=True), ANSWER)
    result, rows = await one_call(sqlite_engine, fake, max_attempts=3)
    assert result.content == "Hold the line." and result.attempts == 2
    assert [(r.attempt, r.status, r.error_class) for r in rows] == [
        (1, "error", "connection"), (2, "ok", None)]


async def test_a_connection_dropped_mid_stream_is_retried_and_its_text_never_used(
        sqlite_engine: Engine) -> None:
    fake = answering(Reply("FRAGMENT never to be used", chunks=4, cut_after=2), ANSWER)
    result, rows = await one_call(sqlite_engine, fake, max_attempts=3)
    # The answer is the retry's alone: nothing of the cut attempt's half answer is kept.
    assert result.content == "Hold the line." and result.attempts == 2
    assert [(r.attempt, r.status, r.error_class) for r in rows] == [
        (1, "error", "connection"), (2, "ok", None)]
    first, second = rows
    assert "mid-stream" in first.error
    assert first.first_token_at is not None
    assert first.completion_tokens is None and first.finish_reason is None
    assert second.finish_reason == "stop"


async def test_a_connection_reset_mid_stream_is_worded_without_the_sockets_errno(
        sqlite_engine: Engine) -> None:
    fake = answering(Reply("FRAGMENT", chunks=4, cut_after=2, cut="reset"), ANSWER)
    result, rows = await one_call(sqlite_engine, fake, max_attempts=3)
    assert result.content == "Hold the line." and result.attempts == 2
    assert rows[0].error == "connection dropped mid-stream: ReadError: Connection reset by peer"


async def test_context_precheck_fails_without_sending_the_chat(sqlite_engine: Engine) -> None:
    # As long in bytes as a real prompt of 2,000 tokens is at least (a token covers a byte),
    # so its size is not taken as proved by its bytes once the call's fit taught the limit.
    fake = FakeServer(tokenize_count=2000, max_model_len=2048)
    result, rows = await one_call(sqlite_engine, fake, check_context_length=True,
                                  messages=[{"role": "user", "content": "word " * 400}])
    assert isinstance(result, ContextLengthError)
    assert "2000" in str(result) and "2048" in str(result)
    assert fake.tokenize_calls == 1
    assert len(fake.chats) == 0
    (row,) = rows
    assert (row.status, row.error_class, row.http_status) == ("error", "context_length", None)
    assert row.prompt_tokens is None and row.first_token_at is None


async def test_context_precheck_lets_a_fitting_prompt_through(sqlite_engine: Engine) -> None:
    fake = FakeServer(lambda chat: ANSWER, tokenize_count=100, max_model_len=2048)
    result, rows = await one_call(sqlite_engine, fake, check_context_length=True)
    assert result.content == "Hold the line."
    assert fake.tokenize_calls == 1 and len(fake.chats) == 1 == len(rows)


async def test_a_server_context_length_400_is_a_context_length_error(
    sqlite_engine: Engine,
) -> None:
    fake = answering(Reply(status=400, error=CONTEXT_LENGTH_MESSAGE))
    result, rows = await one_call(sqlite_engine, fake, max_attempts=3)
    assert isinstance(result, ContextLengthError)
    assert not result.retryable
    assert len(fake.chats) == 1
    (row,) = rows
    assert (row.error_class, row.http_status) == ("context_length", 400)
    assert "maximum context length" in row.error


async def test_a_plain_400_is_an_http_error_and_not_retried(sqlite_engine: Engine) -> None:
    fake = answering(Reply(status=400, error="bad top_k"))
    result, rows = await one_call(sqlite_engine, fake, max_attempts=3)
    assert type(result) is LLMHTTPError
    assert len(fake.chats) == 1 == len(rows)
    assert (rows[0].error_class, rows[0].http_status) == ("http", 400)


async def test_a_hung_call_times_out_and_is_recorded(sqlite_engine: Engine) -> None:
    # The SDK imports its types on first use, for over 0.2 s in a fresh process: a call
    # first, so that the timed ones below are timed on sending alone (run alone, the second
    # attempt's 0.2 s went on imports and it never reached the server).
    await one_call(sqlite_engine, answering(Reply("Warm.")))
    fake = answering(Reply(delay_s=60))  # far past the call timeout
    result, rows = await one_call(sqlite_engine, fake, max_attempts=2, call_timeout_s=0.2)
    assert result.error_class == "timeout"
    assert len(fake.chats) == 2 == len(rows)
    for row in rows:
        assert (row.status, row.error_class, row.http_status) == ("error", "timeout", None)
        assert 0.19 <= row.latency_s < 2
    assert fake.in_flight == 0  # the abandoned requests left the server


async def test_a_stream_ending_without_finish_or_usage_is_truncated_and_retried(
        sqlite_engine: Engine) -> None:
    short = Reply("Hold the", chunks=4, cut_after=2, cut="end")
    fake = answering(short, short, ANSWER)
    result, rows = await one_call(sqlite_engine, fake, max_attempts=3)
    assert result.content == "Hold the line." and result.attempts == 3
    assert [(r.status, r.error_class) for r in rows] == [
        ("error", "stream"), ("error", "stream"), ("ok", None)]
    assert "truncated" in rows[0].error
    assert fake.usage_totals()["completion_tokens"] == rows[2].completion_tokens


async def test_a_truncated_stream_on_the_last_attempt_fails_the_call(
        sqlite_engine: Engine) -> None:
    fake = answering(Reply("Hold the", chunks=4, cut_after=2, cut="end"))
    result, rows = await one_call(sqlite_engine, fake, max_attempts=2)
    # Never a half answer passed on as if it were whole.
    assert isinstance(result, LLMStreamError)
    assert [r.status for r in rows] == ["error", "error"]


@pytest.mark.parametrize("cut", ["garbage", "misshapen"])
async def test_a_malformed_chunk_is_a_server_fault_retried_and_its_text_never_used(
        sqlite_engine: Engine, cut: str) -> None:
    broken = Reply("FRAGMENT never to be used", chunks=4, cut_after=2, cut=cut)
    fake = answering(broken, ANSWER)
    result, rows = await one_call(sqlite_engine, fake, max_attempts=3)
    assert result.content == "Hold the line." and result.attempts == 2
    assert [(r.attempt, r.status, r.error_class) for r in rows] == [
        (1, "error", "malformed"), (2, "ok", None)]
    assert "malformed stream chunk" in rows[0].error


async def test_malformed_chunks_on_every_attempt_fail_the_call_in_one_line(
        sqlite_engine: Engine) -> None:
    fake = answering(Reply("Hold the", chunks=4, cut_after=1, cut="garbage"))
    result, rows = await one_call(sqlite_engine, fake, max_attempts=2)
    assert isinstance(result, LLMMalformedError) and result.retryable
    assert "\n" not in str(result) and str(result).startswith("malformed stream chunk")
    assert [(r.status, r.error_class) for r in rows] == [("error", "malformed")] * 2


async def test_a_tokenize_answer_without_a_count_is_a_malformed_answer(
        sqlite_engine: Engine) -> None:
    # A count /tokenize cannot give is no answer about the prompt, and no chat attempt:
    # the prompt goes out as it is, and only the chat request the server saw has a row.
    fake = FakeServer(lambda chat: ANSWER)
    original = fake.handle

    async def no_count(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":  # answered, but not with a count
            return httpx.Response(200, text="<html>proxy page</html>")
        return await original(request)

    fake.handle = no_count  # type: ignore[method-assign]
    with structlog.testing.capture_logs() as logs:
        result, rows = await one_call(sqlite_engine, fake, check_context_length=True,
                                      max_attempts=2)
    assert not isinstance(result, Exception) and result.content == ANSWER.content, result
    assert [(r.status, r.error_class) for r in rows] == [("ok", None)] == [
        ("ok", None) for _ in fake.chats]
    uncounted = [e["error"] for e in logs
                 if e["event"] == "prompt could not be counted; sent as it is"]
    assert uncounted and all(e.startswith("/tokenize answered no token count")
                             for e in uncounted)
    with pytest.raises(LLMMalformedError, match="no token count"):  # what the count says
        async with fake.client() as http:
            await PromptCounter(load_settings(), http, "http://fake.test/tokenize").count(
                "m", [{"role": "user", "content": "x"}])


def streaming(*bodies: bytes) -> FakeServer:
    """Return a fake whose n-th chat attempt streams the n-th raw SSE body (then ANSWER)."""
    fake = FakeServer(lambda chat: ANSWER)
    original, sent = fake.handle, iter(bodies)

    async def raw(request: httpx.Request) -> httpx.Response:
        body = next(sent, None) if request.url.path.endswith("/chat/completions") else None
        if body is None:
            return await original(request)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    fake.handle = raw  # type: ignore[method-assign]
    return fake


async def test_an_error_event_inside_the_stream_is_a_stream_fault_retried(
        sqlite_engine: Engine) -> None:
    died = (b'data: {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": "Hal"}}]}'
            b'\n\ndata: {"error": {"message": "engine died", "code": 500}}\n\n')
    result, rows = await one_call(sqlite_engine, streaming(died), max_attempts=2)
    assert result.content == "Hold the line." and result.attempts == 2
    assert [(r.attempt, r.status, r.error_class) for r in rows] == [
        (1, "error", "stream"), (2, "ok", None)]
    assert rows[0].error == "server error during the stream: engine died"


async def test_a_chunk_without_choices_is_malformed(sqlite_engine: Engine) -> None:
    odd = b'data: {"id": "chatcmpl-1", "object": "chat.completion.chunk"}\n\n'
    result, rows = await one_call(sqlite_engine, streaming(odd, odd), max_attempts=2)
    assert isinstance(result, LLMMalformedError), result
    assert [(r.status, r.error_class) for r in rows] == [("error", "malformed")] * 2


async def test_a_server_not_listening_is_named_by_the_transport_error(
        sqlite_engine: Engine) -> None:
    # The SDK's own message is only "Connection error.": the row says what failed beneath.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens on it once closed
    batch_id = new_batch(sqlite_engine)
    settings = load_settings(llm_base_url=f"http://127.0.0.1:{port}/v1", max_attempts=1,
                             check_context_length=False)
    async with UsageRecorder(sqlite_engine, flush_interval_s=0.01) as rec:
        llm = TrackedLLM(settings, rec)
        try:
            with pytest.raises(LLMConnectionError) as raised:
                await llm.chat(CallTag(batch_id, "AAPL", "analyst"), fixed(MESSAGES), max_tokens=10)
        finally:
            await llm.aclose()
    assert "Connection error. (ConnectError: " in str(raised.value)
    with sqlite_engine.connect() as conn:
        (row,) = conn.execute(select(LLMCall).where(LLMCall.batch_id == batch_id)).all()
    assert row.error == str(raised.value) and row.error_class == "connection"


@pytest.mark.parametrize(("reply", "says"), [
    (Reply(status=500, error="engine crashed"), "HTTP 500: engine crashed"),
    (Reply(status=400, error="bad top_k"), "HTTP 400: bad top_k"),
    (Reply(status=400, error=CONTEXT_LENGTH_MESSAGE),
     f"server rejected the prompt as too long: {CONTEXT_LENGTH_MESSAGE}"),
    (Reply(status=404, error="The model `x` does not exist."),
     "HTTP 404 from the LLM server: The model `x` does not exist. (check "
     "NIGHTDESK_LLM_BASE_URL and NIGHTDESK_LLM_MODEL)"),
])
async def test_an_error_status_says_what_the_server_said_without_the_clients_wrapping(
        sqlite_engine: Engine, reply: Reply, says: str) -> None:
    # The error becomes the ticker's reason in the digest, the report and the pages: the
    # server's message, not the client library's "Error code: 500 - {'error': {...}}".
    result, rows = await one_call(sqlite_engine, answering(reply), max_attempts=1)
    assert isinstance(result, LLMError)
    assert str(result) == says
    assert rows[-1].error == says


async def test_a_server_gone_is_worded_without_the_sockets_errno(sqlite_engine: Engine) -> None:
    # The fake refuses as a closed port does ("[Errno 111] Connection refused"): the row and
    # the log lines of a night say the reason alone, in the preflight's words.
    fake = FakeServer(lambda chat: ANSWER)
    fake.crash()
    result, rows = await one_call(sqlite_engine, fake, max_attempts=1)
    assert isinstance(result, LLMConnectionError), result
    assert str(result).endswith("Connection error. (ConnectError: Connection refused)")
    assert [r.error for r in rows] == [str(result)]
    async with fake.client() as http:
        counter = PromptCounter(load_settings(max_attempts=1, retry_backoff_s=0), http,
                                "http://fake.test/tokenize")
        with structlog.testing.capture_logs() as logs:
            assert await counter.measure(MESSAGES, max_tokens=10) is None
    (said,) = [e["error"] for e in logs if e["event"] == "prompt could not be counted"]
    assert said == "cannot reach http://fake.test/tokenize to count tokens: Connection refused"


async def test_behind_a_router_prompts_are_fitted_to_its_shortest_server() -> None:
    # The router sends each /tokenize where its body hashes (here the long server always):
    # its max_model_len fitted a ticker's prompts that the short server then refused.
    long, short = (FakeServer(model="smollm2-135m", max_model_len=length)
                   for length in (34_816, 4_096))
    router = FakeRouter({"http://long.test": long, "http://short.test": short}, policy="first")
    async with router.client() as http:
        counter = PromptCounter(load_settings(llm_model="smollm2-135m"), http,
                                "http://router.test/tokenize")
        size = await counter.measure([{"role": "user", "content": "word " * 100}],
                                     max_tokens=100, exact=True)
    assert counter.max_model_len == 4_096
    assert size is not None and size.limit == 4_096 - counter.budget(100)
