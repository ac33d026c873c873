"""Send chat completions through one client that records every HTTP attempt in ``llm_calls``."""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
import uuid
import zlib
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import openai
import structlog
import tenacity
from openai import AsyncOpenAI
from openai._streaming import SSEDecoder

from agents.chat import CallTag, ChatResult
from agents.fitting import Measure, Prompt, Trim, fit
from app.config import Settings
from app.db.text import storable
from app.errors import (
    ContextLengthError,
    LLMCancelled,
    LLMConnectionError,
    LLMError,
    LLMHTTPError,
    LLMMalformedError,
    LLMStreamError,
    LLMTimeoutError,
    ServerBusy,
)
from app.promptsize import PromptCounter
from app.usage import UsageRecorder
from serving.errors import reason
from serving.urls import redact, server_root

log = structlog.get_logger(__name__)

_jitter = random.Random()


@dataclass
class CallStats:
    """Running totals for live progress; the database rows remain the record."""

    calls: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_start: datetime | None = None
    last_end: datetime | None = None


@dataclass
class Call:
    """One chat call: its id keys its body and groups its attempts' rows, numbered 1, 2, 3.

    Made where the call starts; a call sent again on another endpoint keeps it, so its
    attempts there go on from the ones already made.
    """

    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    attempts: int = 0  # HTTP attempts made so far, on any endpoint


@dataclass(frozen=True)
class Ask:
    """A node's call before it is fitted: its prompt and what it is sent with."""

    prompt: Prompt
    max_tokens: int
    response_format: dict[str, Any] | None = None


@dataclass
class _Attempt:
    """What one HTTP attempt saw, filled in as the stream arrives."""

    started_at: datetime
    t0: float
    ready_at: datetime | None = None  # when the graph issued the call (before any gate)
    first_token_s: float | None = None
    content: list[str] = field(default_factory=list)
    usage: dict[str, Any] | None = None  # the final chunk's ``usage``, as sent
    finish_reason: str | None = None
    request_id: str | None = None
    trim: Trim | None = None  # what the context guard left out of the call
    served_by: str | None = None  # the server a router in front named, if it did


def backoff_delay(base_s: float, retry: int, rng: random.Random | None = None) -> float:
    """Return the wait before retry ``retry`` (0-based): full jitter under ``base * 2**retry``.

    Random over the whole range, so the calls that failed together when a server died do
    not all come back at the same instant when it returns.
    """
    return (rng or _jitter).uniform(0.0, base_s * 2 ** retry)


# The headers routers hash or pin a session on: vllm-router's consistent_hash reads
# X-Session-ID first, vLLM production stack's session router is usually keyed on x-user-id.
ROUTING_HEADERS = ("X-Session-ID", "X-User-ID")


def routing_key(tag: CallTag) -> str:
    """Return the key every call of one ticker carries (headers and ``user``), so a router in
    front of several servers sends them all to one server's prefix cache. It names no batch:
    a replay sends exactly what the night sent."""
    return f"nightdesk:{tag.ticker}"


def call_seed(tag: CallTag) -> int:
    """Derive a stable per-call seed, so samples differ from each other and replays repeat."""
    return zlib.crc32(f"{tag.ticker}|{tag.node}|{tag.sample}".encode()) & 0x7FFFFFFF


class TrackedLLM(PromptCounter):
    """Wrap ``openai.AsyncOpenAI``: one layer of retries, one ``llm_calls`` row per attempt.

    It counts its prompts against the server's context itself (a PromptCounter on the
    same connection pool), so a call's /tokenize check and its stream are one object's.
    """

    def __init__(
        self,
        settings: Settings,
        recorder: UsageRecorder,
        *,
        http_client: httpx.AsyncClient | None = None,
        base_url: str | None = None,
        max_in_flight: int | None = None,
    ) -> None:
        self.settings = settings
        self.recorder = recorder
        self.base_url = base_url or settings.llm.url
        # How this endpoint is named wherever it is shown or stored: never with its password.
        self.endpoint = redact(self.base_url)
        # httpx's default pool (100 connections) would queue requests the engine admitted,
        # silently: size it from the most the engine lets out at once (None: no cap).
        self._http = http_client or httpx.AsyncClient(
            timeout=httpx.Timeout(30.0),
            limits=httpx.Limits(max_connections=max_in_flight,
                                max_keepalive_connections=max_in_flight))
        self._owns_http = http_client is None
        self._client = AsyncOpenAI(
            base_url=self.base_url,
            api_key=settings.llm.api_key.get_secret_value(),
            # Retries live in chat() only, so rows equal attempts.
            max_retries=0,
            timeout=settings.calls.call_timeout_s,
            http_client=self._http,
        )
        self.stats = CallStats()
        # The weights the batch's answers come from (other_model), and whether it was asked.
        self.weights: str | None = None
        self.asked = False
        super().__init__(settings, self._http, server_root(self.base_url) + "/tokenize")

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def other_model(self) -> str | None:
        """Read the weights the server serves under the model's name (its /v1/models entry's
        ``root``). Return, in one line, that they are not ``weights`` (the first reading's,
        or the batch's as recorded); None when they are, or the server cannot say."""
        self.asked = True
        try:
            response = await self._http.get(
                self.base_url.rstrip("/") + "/models", timeout=10.0, headers={
                    "Authorization": f"Bearer {self.settings.llm.api_key.get_secret_value()}"})
            response.raise_for_status()
            entry = next(m for m in response.json()["data"] if m["id"] == self.settings.llm.model)
            weights = str(entry.get("root") or entry["id"])
        except (httpx.HTTPError, ValueError, LookupError, TypeError, StopIteration) as error:
            log.warning("served model not read", endpoint=self.endpoint,
                        error=reason(error, typed=True)[:200])
            return None
        first, self.weights = self.weights, self.weights or weights
        if not first or first == weights:
            return None
        return redact(f"the LLM server at {self.endpoint} came back serving {weights!r} as "
                      f"{self.settings.llm.model!r}, not {first!r}: one night's ranking is "
                      f"one model's; serve {first!r} again")

    def build_body(
        self,
        tag: CallTag,
        messages: list[dict[str, str]],
        *,
        max_tokens: int,
        response_format: dict[str, Any] | None = None,
        ignore_eos: bool = False,
    ) -> dict[str, Any]:
        """Return the full request body: what is sent, recorded and later replayed."""
        s = self.settings
        extra: dict[str, Any] = {
            "top_k": s.sampling.top_k,
            "chat_template_kwargs": {"enable_thinking": s.sampling.enable_thinking},
        }
        if ignore_eos:
            extra["ignore_eos"] = True
        body: dict[str, Any] = {
            "model": s.llm.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": s.sampling.temperature,
            "top_p": s.sampling.top_p,
            "presence_penalty": s.sampling.presence_penalty,
            "extra_body": extra,
        }
        if s.calls.request_seeds:
            body["seed"] = call_seed(tag)
        if response_format is not None:
            body["response_format"] = response_format
        return body

    async def chat(
        self,
        tag: CallTag,
        prompt: Prompt,
        *,
        max_tokens: int,
        response_format: dict[str, Any] | None = None,
        call: Call | None = None,
    ) -> ChatResult:
        """Make one call straight to this server (no gate): fit ``prompt`` to its context,
        then send it, retrying what may pass (``Tries``); raise LLMError when it cannot. A
        batch's calls go through app.traffic.client instead, which runs the same loop at its
        gate and fits a call at each server it goes to."""
        body, trimmed = await self.fitted(tag, Ask(prompt, max_tokens, response_format),
                                          self.measure)
        return await self.send(tag, body, trimmed=trimmed, call=call)

    async def fitted(self, tag: CallTag, ask: Ask,
                     measure: Measure) -> tuple[dict[str, Any], Trim | None]:
        """Return the body of ``ask`` with its prompt fitted by ``measure``'s counts
        (agents.fitting.fit), and what the fit left out."""
        messages, trimmed = await fit(measure, ask.prompt.render, ask.prompt.units,
                                      max_tokens=ask.max_tokens)
        return self.build_body(tag, messages, max_tokens=ask.max_tokens,
                               response_format=ask.response_format), trimmed

    async def send(self, tag: CallTag, body: dict[str, Any], *, trimmed: Trim | None = None,
                   call: Call | None = None) -> ChatResult:
        """Send a prepared body (``chat``'s, or a replay's) as ``call`` (default: a new one),
        retried; a call sent before goes on numbering its attempts."""
        call, tries, ready = call or Call(), Tries(self.settings), datetime.now(UTC)
        try:
            async for attempt in tries.retrying(tag, call):
                with attempt:
                    try:
                        result = await self.attempt(tag, call, body, ready_at=ready,
                                                    trimmed=trimmed)
                    except LLMError as error:
                        tries.note(error)
                        raise
        except LLMError as error:
            busy = tries.verdict(error, self.endpoint)
            if busy is error:
                raise
            raise busy from error
        return result

    async def attempt(self, tag: CallTag, call: Call, body: dict[str, Any], *,
                      priority: int | None = None, ready_at: datetime | None = None,
                      trimmed: Trim | None = None) -> ChatResult:
        """Make one HTTP attempt of ``call`` (numbered on from its earlier ones, on any server)
        and write its ``llm_calls`` row; raise its LLMError.

        A call's first attempt records its body under the call's id first: a decision's
        re-ask and a replay's calls are stored too, so any batch can be replayed. ``ready_at``
        is when the graph issued the call (default: now); ``trimmed`` what the context guard
        left out. The result's ``attempts`` counts the call's attempts so far.
        """
        if self.settings.store.record_requests and call.attempts == 0:
            self.recorder.record_request({**asdict(tag), "call_id": call.id}, body)
        call.attempts += 1
        if priority is not None and self.settings.calls.priority_scheduling:
            body = {**body, "extra_body": {**body.get("extra_body", {}), "priority": priority}}
        # Added after the body is recorded: the stored body is the prompt's alone.
        body = {**body, "user": routing_key(tag)}
        seen = _Attempt(started_at=datetime.now(UTC), t0=time.monotonic(),
                        ready_at=ready_at or datetime.now(UTC), trim=trimmed)
        key = (call.id, call.attempts)  # this attempt's row
        error: LLMError | None
        try:
            async with asyncio.timeout(self.settings.calls.call_timeout_s):
                await self.check(body)
                await self._stream(body, seen)
        except LLMError as exc:
            error = exc
        except TimeoutError:
            limit = self.settings.calls.call_timeout_s
            error = LLMTimeoutError(f"no complete answer within {limit}s")
        except openai.APITimeoutError:
            error = LLMTimeoutError("request timed out")
        except openai.APIStatusError as exc:
            self._take_server(exc.response.headers, seen)
            error = _classify_status(exc)
        except openai.APIConnectionError as exc:
            # The SDK says only "Connection error."; the transport's own error says which.
            cause = exc.__cause__
            why = f" ({reason(cause, typed=True)[:300]})" if cause is not None else ""
            error = LLMConnectionError(redact(f"cannot reach {self.base_url}: {exc}{why}"))
        except httpx.TimeoutException as exc:
            # Raised while reading the stream: the OpenAI client only wraps the request itself.
            error = LLMTimeoutError(redact(f"stream stalled: {reason(exc, typed=True)}"))
        except httpx.TransportError as exc:
            # The connection dropped mid-stream (server killed or restarted): the answer is
            # cut, and another attempt may well pass.
            error = LLMConnectionError(
                redact(f"connection dropped mid-stream: {reason(exc, typed=True)}"))
        except openai.APIError as exc:
            # Any other failure the SDK reports (an error event in the stream is _take's).
            error = LLMStreamError(redact(f"server error during the stream: {exc.message}"))
        except httpx.HTTPError as exc:
            # Any other failure of the body as it arrived (e.g. an undecodable chunk).
            error = LLMStreamError(redact(f"the stream broke: {reason(exc, typed=True)}"))
        except BaseException as exc:
            # Anything else (cancellation included) still leaves its row, then propagates.
            why = redact(f"{type(exc).__name__}: {exc}")[:500]
            self._record(tag, key, body, seen,
                         LLMCancelled(f"cancelled in flight ({why})")
                         if isinstance(exc, asyncio.CancelledError) else LLMError(why))
            raise
        else:
            error = None
        self._record(tag, key, body, seen, error)
        if error is not None:
            raise error
        usage = seen.usage or {}
        return ChatResult(
            # Cleaned here, once: the text goes on into prompts, checkpoints and rows.
            content=storable("".join(seen.content)),
            prompt_tokens=usage.get("prompt_tokens") or 0,
            completion_tokens=usage.get("completion_tokens") or 0,
            cached_tokens=_cached(usage),
            finish_reason=seen.finish_reason,
            request_id=seen.request_id,
            attempts=call.attempts,
        )

    async def _stream(self, body: dict[str, Any], seen: _Attempt) -> None:
        # The raw body through the SDK's own SSE decoder, each event's JSON taken as a dict:
        # the SDK's typed object per chunk cost the client most of its CPU at fleet scale.
        key = body.get("user")
        headers = {name: key for name in ROUTING_HEADERS} if key else None
        # The body is plain JSON already. Given as typed parameters, the SDK checked each
        # message against every message type it knows (a third of the client's CPU for a call);
        # as ``extra_body`` it is merged into the request untouched, over ``messages=[]``.
        sent = {**{k: v for k, v in body.items() if k != "extra_body"},
                **body.get("extra_body", {}), "stream_options": {"include_usage": True}}
        async with self._client.chat.completions.with_streaming_response.create(
            model=body["model"], messages=[], stream=True, extra_body=sent,
            extra_headers=headers,
        ) as response:
            self._take_server(response.headers, seen)
            try:
                async for sse in SSEDecoder().aiter_bytes(response.iter_bytes()):
                    # Stop at [DONE]: the connection then closes rather than going back to
                    # the pool, where a late reader would race the server's keep-alive.
                    if sse.data.startswith("[DONE]"):
                        break
                    _take(sse.json(), seen)
            except (ValueError, TypeError, AttributeError, KeyError) as exc:
                # A data line that is not JSON, or JSON not shaped like a chunk: the
                # server's fault, and a new attempt may well be whole.
                raise LLMMalformedError(redact(f"malformed stream chunk from the server: "
                                               f"{type(exc).__name__}: {exc}")[:300]) from None
        if seen.finish_reason is None:
            # A stream that stops without saying why was cut: its text is a fragment.
            raise LLMStreamError(
                "stream ended without a finish reason"
                + ("" if seen.usage is not None else " or usage")
                + f": truncated answer of {len(''.join(seen.content))} characters discarded")

    def _take_server(self, headers: httpx.Headers, seen: _Attempt) -> None:
        """Note the server a router in front says answered (``llm_server_header``)."""
        name = self.settings.llm.server_header
        said = headers.get(name, "").strip() if name else ""
        if said:
            seen.served_by = redact(said)[:300]

    def _record(
        self, tag: CallTag, key: tuple[str, int], body: dict[str, Any], seen: _Attempt,
        error: LLMError | None,
    ) -> None:
        elapsed = time.monotonic() - seen.t0
        usage = seen.usage or {}
        ended_at = seen.started_at + timedelta(seconds=elapsed)
        trim = seen.trim
        stats = self.stats
        stats.calls += 1
        stats.failed += error is not None
        stats.prompt_tokens += usage.get("prompt_tokens") or 0
        stats.completion_tokens += usage.get("completion_tokens") or 0
        stats.first_start = min(stats.first_start or seen.started_at, seen.started_at)
        stats.last_end = max(stats.last_end or ended_at, ended_at)
        self.recorder.record_call({
            **asdict(tag),
            "call_id": key[0],
            "attempt": key[1],
            "model": body["model"],
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "cached_tokens": _cached(usage),
            "max_tokens": body["max_tokens"],
            "finish_reason": seen.finish_reason,
            "status": "ok" if error is None else "error",
            "error_class": None if error is None else error.error_class,
            "http_status": None if error is None else error.http_status,
            "error": None if error is None else str(error)[:2000],
            "started_at": seen.started_at,
            "first_token_at": (None if seen.first_token_s is None
                               else seen.started_at + timedelta(seconds=seen.first_token_s)),
            "ended_at": ended_at,
            "ready_at": seen.ready_at,
            "latency_s": elapsed,
            "request_id": seen.request_id,
            "context_trimmed_tokens": None if trim is None else trim.tokens,
            "context_trimmed": None if trim is None else trim.describe()[:200],
            "endpoint": self.endpoint,
            "served_by": seen.served_by,
        })


@dataclass
class Tries:
    """One call's failed attempts on its server, and what comes of each: another try after
    a wait (``note``, ``delay``), or the error; one policy for every loop of attempts.

    Back-pressure (HTTP 429/503) is the server saying "not now": it is waited out for up
    to the outage budget, from the first such answer, as the server's ``Retry-After`` says
    or backing off, and uses up none of the ``max_attempts`` that every other fault that
    may pass has (full jitter, ``backoff_delay``). No wait is longer than
    ``retry_wait_max_s``. A call sent to another server (``resend``) starts its count over.
    """

    settings: Settings
    counted: int = 0  # failed attempts other than back-pressure
    pressed: int = 0  # back-pressure answers since the last other failure
    pressed_since: float | None = None
    pressed_s: float = 0.0  # how long back-pressure has lasted, at the last answer
    due: bool = False  # the last failure is tried again
    sends_left: int = 0  # how often it may yet go to a server after one failed it (client.py)
    _wait_s: float = 0.0  # before that try
    _resent: bool = False  # that try is on another server (its resender logs it)

    def note(self, error: LLMError) -> bool:
        """Count a failed attempt; return (and keep as ``due``) whether it is tried again."""
        base, cap = self.settings.calls.retry_backoff_s, self.settings.calls.retry_wait_max_s
        asked = error.retry_after_s if isinstance(error, LLMHTTPError) else None
        self._resent = False
        if not error.retryable:
            self.due = False
        elif isinstance(error, LLMHTTPError) and error.back_pressure:
            now = time.monotonic()
            if self.pressed_since is None:
                self.pressed_since = now
            self.pressed += 1
            self.pressed_s = now - self.pressed_since
            self.due = self.pressed_s < self.settings.batch.outage_budget_s
            # Half fixed, half jittered: a burst of refusals is never met with tries a few
            # milliseconds apart, and calls refused together do not return together.
            half = min(cap, base * 2 ** (self.pressed - 1)) / 2
            self._wait_s = half + _jitter.uniform(0.0, half)
        else:
            self.counted += 1
            self.pressed, self.pressed_since = 0, None
            self.due = self.counted < self.settings.calls.max_attempts
            self._wait_s = min(cap, backoff_delay(base, self.counted - 1))
        if asked is not None:
            self._wait_s = min(asked, cap)
        return self.due

    def resend(self) -> None:
        """The call goes to another server now: a fresh count there, no wait."""
        self.counted = self.pressed = 0
        self.pressed_since, self.due, self._wait_s, self._resent = None, True, 0.0, True

    def retrying(self, tag: CallTag, call: Call) -> tenacity.AsyncRetrying:
        """Return the loop of ``call``'s attempts: again while the last failure is ``due``."""
        def waiting(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            if not self._resent and isinstance(error, LLMError):  # only those are tried again
                log.warning("llm call failed; retrying", node=tag.node, ticker=tag.ticker,
                            attempt=call.attempts, error_class=error.error_class,
                            http_status=error.http_status, delay_s=round(self._wait_s, 3))

        return tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(lambda error: isinstance(error, LLMError)
                                              and self.due),
            wait=lambda state: self._wait_s, before_sleep=waiting, reraise=True)

    def verdict(self, error: LLMError, endpoint: str) -> LLMError | ServerBusy:
        """Return what a call whose last attempt failed with ``error`` raises: ServerBusy once
        back-pressure outlasted the outage budget, else the error itself."""
        if not (isinstance(error, LLMHTTPError) and error.back_pressure
                and self.pressed_since is not None):
            return error
        return ServerBusy(
            f"the LLM server at {endpoint} answered HTTP {error.http_status} "
            f"(busy) for {self.pressed_s:.1f} s, {self.pressed} times in a row for one "
            f"call, past the outage budget ({self.settings.batch.outage_budget_s:g} s)")


def retry_after(value: str | None) -> float | None:
    """Return the seconds a ``Retry-After`` header asks to wait (delay-seconds or an
    HTTP-date); None when it is absent or unreadable."""
    if not value:
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # an HTTP-date is GMT; a sloppy one without a zone is too
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _take(chunk: dict[str, Any], seen: _Attempt) -> None:
    """Add one stream chunk (its JSON, as a dict) to what the attempt has seen."""
    error = chunk.get("error")
    if error:
        # An error event inside an open stream (e.g. the engine died mid-generation).
        said = error.get("message") if isinstance(error, dict) else None
        raise LLMStreamError(redact(f"server error during the stream: "
                                    f"{said or 'An error occurred during streaming'}"))
    seen.request_id = seen.request_id or chunk.get("id")
    if chunk.get("usage") is not None:
        seen.usage = chunk["usage"]
    for choice in chunk["choices"]:
        content = (choice.get("delta") or {}).get("content")
        if content:
            if seen.first_token_s is None:
                seen.first_token_s = time.monotonic() - seen.t0
            seen.content.append(content)
        if choice.get("finish_reason"):
            seen.finish_reason = choice["finish_reason"]


def _cached(usage: dict[str, Any]) -> int | None:
    """Return the prompt tokens the server took from its prefix cache, if it said."""
    details = usage.get("prompt_tokens_details")
    return details.get("cached_tokens") if isinstance(details, dict) else None


def _server_said(exc: openai.APIStatusError) -> str:
    """Return what the server said, without the client library's wrapping: the ``message``
    (or ``detail``) of its JSON error, else its text without "Error code: N - " before it."""
    body = exc.body if isinstance(exc.body, dict) else {}
    said = body.get("message") or body.get("detail")
    if isinstance(said, str) and said.strip():
        return " ".join(said.split())
    text = str(exc.message)
    prefix = f"Error code: {exc.status_code} - "
    return " ".join(text.removeprefix(prefix).split())


def _classify_status(exc: openai.APIStatusError) -> LLMError:
    status = exc.status_code
    # A proxy's error page may quote the request URL, password and all.
    text = redact(_server_said(exc))
    if status == 400 and any(said in text.lower() for said in CONTEXT_TOO_LONG):
        return ContextLengthError(f"server rejected the prompt as too long: {text}",
                                  http_status=400)
    if status in (401, 403, 404):
        # These stop the batch (every call would meet them): say what to check, in one line.
        said = text[:200]
        hint = ("check NIGHTDESK_LLM_API_KEY" if status != 404 else
                "check NIGHTDESK_LLM_BASE_URL and NIGHTDESK_LLM_MODEL")
        return LLMHTTPError(f"HTTP {status} from the LLM server: {said} ({hint})",
                            http_status=status)
    # vllm-router answers 500 "Request failed: error sending request for url (...)" when the
    # server it chose cannot be reached (killed, restarting) until its health check drops it.
    return LLMHTTPError(f"HTTP {status}: {text[:300]}", http_status=status,
                        retry_after_s=retry_after(exc.response.headers.get("retry-after")),
                        upstream_gone=status >= 500 and UPSTREAM_GONE in str(exc.message))


UPSTREAM_GONE = "error sending request"
CONTEXT_TOO_LONG = ("context length", "max_model_len", "maximum model length")
