"""Send chat completions through one client that records every HTTP attempt in ``llm_calls``."""

from __future__ import annotations

import asyncio
import time
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import openai
import structlog
from openai import AsyncOpenAI

from agents.chat import CallTag, ChatResult
from app.config import Settings
from app.errors import (
    ContextLengthError,
    LLMConnectionError,
    LLMError,
    LLMHTTPError,
    LLMStreamError,
    LLMTimeoutError,
)
from app.usage import UsageRecorder
from serving.urls import server_root

log = structlog.get_logger(__name__)

# Chat-template tokens a message adds beyond its text; generous, it only skips a /tokenize call.
TEMPLATE_OVERHEAD_TOKENS = 64


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
class _Attempt:
    """What one HTTP attempt saw, filled in as the stream arrives."""

    started_at: datetime
    t0: float
    first_token_s: float | None = None
    content: list[str] = field(default_factory=list)
    usage: Any = None
    finish_reason: str | None = None
    request_id: str | None = None


def call_seed(tag: CallTag) -> int:
    """Derive a stable per-call seed, so samples differ from each other and replays repeat."""
    return zlib.crc32(f"{tag.ticker}|{tag.node}|{tag.sample}".encode()) & 0x7FFFFFFF


class TrackedLLM:
    """Wrap ``openai.AsyncOpenAI``: one layer of retries, one ``llm_calls`` row per attempt."""

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
        self.base_url = base_url or settings.base_url
        # httpx's default pool (100 connections) would queue requests the engine admitted,
        # silently: size it from the most the engine lets out at once (None: no cap).
        self._http = http_client or httpx.AsyncClient(
            timeout=httpx.Timeout(30.0),
            limits=httpx.Limits(max_connections=max_in_flight,
                                max_keepalive_connections=max_in_flight))
        self._owns_http = http_client is None
        self._client = AsyncOpenAI(
            base_url=self.base_url,
            api_key=settings.llm_api_key.get_secret_value(),
            # Retries live in chat() only, so rows equal attempts.
            max_retries=0,
            timeout=settings.call_timeout_s,
            http_client=self._http,
        )
        self.stats = CallStats()
        self._max_model_len: int | None = None
        self._learning_limit = asyncio.Lock()
        self._tokenize_supported = settings.check_context_length

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

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
            "top_k": s.top_k,
            "chat_template_kwargs": {"enable_thinking": s.enable_thinking},
        }
        if ignore_eos:
            extra["ignore_eos"] = True
        body: dict[str, Any] = {
            "model": s.llm_model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "presence_penalty": s.presence_penalty,
            "extra_body": extra,
        }
        if s.request_seeds:
            body["seed"] = call_seed(tag)
        if response_format is not None:
            body["response_format"] = response_format
        return body

    async def chat(
        self,
        tag: CallTag,
        messages: list[dict[str, str]],
        *,
        max_tokens: int,
        response_format: dict[str, Any] | None = None,
        priority: int | None = None,
        first_attempt: int = 1,
    ) -> ChatResult:
        """Send one chat completion, retrying what may pass; raise LLMError when it cannot.

        ``first_attempt`` numbers the rows of a caller-level retry (a decision that failed
        validation) after the attempts already recorded for the same node.
        """
        body = self.build_body(tag, messages, max_tokens=max_tokens,
                               response_format=response_format)
        if self.settings.record_requests:
            self.recorder.record_request(
                {"batch_id": tag.batch_id, "ticker": tag.ticker, "node": tag.node,
                 "sample": tag.sample},
                body,
            )
        return await self.send(tag, body, priority=priority, first_attempt=first_attempt)

    async def send(
        self, tag: CallTag, body: dict[str, Any], *, priority: int | None = None,
        first_attempt: int = 1,
    ) -> ChatResult:
        """Send a prepared body (also used by replay), with bounded retries."""
        if priority is not None and self.settings.priority_scheduling:
            body = {**body, "extra_body": {**body.get("extra_body", {}), "priority": priority}}
        last = first_attempt + self.settings.max_attempts - 1
        attempt = first_attempt
        while True:
            try:
                result = await self._attempt(tag, attempt, body)
                result.attempts = attempt - first_attempt + 1
                return result
            except LLMError as error:
                if not error.retryable or attempt >= last:
                    raise
                delay = self.settings.retry_backoff_s * 2 ** (attempt - first_attempt)
                log.warning("llm call failed; retrying", node=tag.node, ticker=tag.ticker,
                            attempt=attempt, error_class=error.error_class, delay_s=delay)
                await asyncio.sleep(delay)
                attempt += 1

    async def _attempt(self, tag: CallTag, attempt: int, body: dict[str, Any]) -> ChatResult:
        seen = _Attempt(started_at=datetime.now(UTC), t0=time.monotonic())
        error: LLMError | None
        try:
            async with asyncio.timeout(self.settings.call_timeout_s):
                await self._check_context(body)
                await self._stream(body, seen)
        except LLMError as exc:
            error = exc
        except TimeoutError:
            error = LLMTimeoutError(f"no complete answer within {self.settings.call_timeout_s}s")
        except openai.APITimeoutError:
            error = LLMTimeoutError("request timed out")
        except openai.APIStatusError as exc:
            error = _classify_status(exc)
        except openai.APIConnectionError as exc:
            error = LLMConnectionError(f"cannot reach {self.base_url}: {exc}")
        except openai.APIError as exc:
            # An error event inside an open stream (e.g. the engine died mid-generation).
            error = LLMStreamError(f"server error during the stream: {exc.message}")
        except httpx.TimeoutException:
            error = LLMTimeoutError("the stream stalled past the read timeout")
        except httpx.HTTPError as exc:
            # The connection broke mid-answer: the OpenAI client wraps transport errors only
            # until the stream opens, so a cut stream arrives here as httpx's own error.
            error = LLMStreamError(f"connection lost during the stream: {exc}")
        except BaseException as exc:
            # Anything else (cancellation included) still leaves its row, then propagates.
            self._record(tag, attempt, body, seen,
                         LLMError(f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__))
            raise
        else:
            error = None
        self._record(tag, attempt, body, seen, error)
        if error is not None:
            raise error
        usage = seen.usage
        details = getattr(usage, "prompt_tokens_details", None)
        return ChatResult(
            content="".join(seen.content),
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            cached_tokens=getattr(details, "cached_tokens", None),
            finish_reason=seen.finish_reason,
            request_id=seen.request_id,
        )

    async def _stream(self, body: dict[str, Any], seen: _Attempt) -> None:
        stream = await self._client.chat.completions.create(
            **body, stream=True, stream_options={"include_usage": True}
        )
        async for chunk in stream:
            seen.request_id = seen.request_id or chunk.id
            if chunk.usage is not None:
                seen.usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta and choice.delta.content:
                    if seen.first_token_s is None:
                        seen.first_token_s = time.monotonic() - seen.t0
                    seen.content.append(choice.delta.content)
                if choice.finish_reason:
                    seen.finish_reason = choice.finish_reason

    async def _check_context(self, body: dict[str, Any]) -> None:
        """Fail a prompt that cannot fit before it reaches the chat endpoint."""
        if not self._tokenize_supported:
            return
        budget = body["max_tokens"] if self.settings.context_check_includes_output else 0
        if self._fits_without_counting(body, budget):
            return
        if self._max_model_len is None:
            # One /tokenize teaches every call waiting here the limit; without the lock a batch
            # that starts with 64 calls in flight would send 64 of them.
            async with self._learning_limit:
                if self._max_model_len is None:
                    await self._count_tokens(body, budget)
                    return
            if not self._tokenize_supported or self._fits_without_counting(body, budget):
                return
        await self._count_tokens(body, budget)

    def _fits_without_counting(self, body: dict[str, Any], budget: int) -> bool:
        """Return True when the prompt's bytes alone prove it fits (a token covers ≥ 1 byte)."""
        if self._max_model_len is None:
            return False
        upper = sum(len(m["content"].encode()) for m in body["messages"])
        upper += TEMPLATE_OVERHEAD_TOKENS * (len(body["messages"]) + 1)
        return upper + budget <= self._max_model_len

    async def _count_tokens(self, body: dict[str, Any], budget: int) -> None:
        """Count the prompt with the server's /tokenize; raise ContextLengthError if too long."""
        try:
            response = await self._http.post(
                server_root(self.base_url) + "/tokenize",
                json={"model": body["model"], "messages": body["messages"],
                      "add_generation_prompt": True},
                headers={"Authorization": f"Bearer {self.settings.llm_api_key.get_secret_value()}"},
            )
        except httpx.HTTPError as exc:
            raise LLMConnectionError(
                f"cannot reach {self.base_url} to count tokens: {exc}") from None
        if response.status_code == 404:
            log.warning("server has no /tokenize; prompt length is not checked before sending")
            self._tokenize_supported = False
            return
        if response.status_code != 200:
            raise LLMHTTPError(f"/tokenize answered {response.status_code}",
                               http_status=response.status_code)
        data = response.json()
        count, limit = int(data["count"]), int(data["max_model_len"])
        self._max_model_len = limit
        if count + budget > limit:
            raise ContextLengthError(
                f"prompt of {count} tokens + max_tokens {budget} exceeds max-model-len {limit}"
            )

    def _record(
        self, tag: CallTag, attempt: int, body: dict[str, Any], seen: _Attempt,
        error: LLMError | None,
    ) -> None:
        elapsed = time.monotonic() - seen.t0
        usage = seen.usage
        details = getattr(usage, "prompt_tokens_details", None)
        ended_at = seen.started_at + timedelta(seconds=elapsed)
        stats = self.stats
        stats.calls += 1
        stats.failed += error is not None
        stats.prompt_tokens += getattr(usage, "prompt_tokens", 0) or 0
        stats.completion_tokens += getattr(usage, "completion_tokens", 0) or 0
        stats.first_start = min(stats.first_start or seen.started_at, seen.started_at)
        stats.last_end = max(stats.last_end or ended_at, ended_at)
        self.recorder.record_call({
            "batch_id": tag.batch_id,
            "ticker": tag.ticker,
            "node": tag.node,
            "sample": tag.sample,
            "attempt": attempt,
            "model": body["model"],
            "prompt_tokens": getattr(usage, "prompt_tokens", None),
            "completion_tokens": getattr(usage, "completion_tokens", None),
            "cached_tokens": getattr(details, "cached_tokens", None),
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
            "latency_s": elapsed,
            "request_id": seen.request_id,
            "endpoint": self.base_url,
        })


def _classify_status(exc: openai.APIStatusError) -> LLMError:
    status = exc.status_code
    text = str(exc.message)
    if status == 400 and ("context length" in text.lower() or "max_model_len" in text.lower()
                          or "maximum model length" in text.lower()):
        return ContextLengthError(f"server rejected the prompt as too long: {text}",
                                  http_status=400)
    return LLMHTTPError(f"HTTP {status}: {text[:300]}", http_status=status)
