"""Count prompts against the server's context with its ``/tokenize``, asking as little as possible.

vLLM refuses a prompt (plus ``max_tokens`` on 0.24) over max-model-len with HTTP 400; a
failed call is worse than one not sent, so the client checks first. ``/tokenize`` answers
both the count and max-model-len. Two things keep it cheap: once the limit is known, a
prompt whose bytes alone prove it fits is not counted (a token covers at least one byte),
and the last counts are kept, since the context guard counts a prompt just before the call
checks it again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import httpx
import structlog
import tenacity

from agents.fitting import PromptSize
from app.config import Settings
from app.errors import (
    ContextLengthError,
    LLMConnectionError,
    LLMError,
    LLMHTTPError,
    LLMMalformedError,
)
from serving.errors import ServerError, reason
from serving.router import ashortest_context
from serving.urls import redact

log = structlog.get_logger(__name__)

# Chat-template tokens a message adds beyond its text; generous, it only skips a /tokenize call.
TEMPLATE_OVERHEAD_TOKENS = 64
# Prompts whose /tokenize count is kept.
COUNT_CACHE = 256


def message_bytes(messages: list[dict[str, Any]]) -> int:
    """Return the UTF-8 size of chat messages' texts (what a token count is compared with)."""
    return sum(len(str(m.get("content", "")).encode()) for m in messages)


@dataclass
class Counted:
    """What a server's /tokenize has counted so far: message bytes and the tokens they came
    to (the token budget costs prompts by them before any answer, app/traffic/budget.py)."""

    bytes: int = 0
    tokens: int = 0


class PromptCounter:
    """Know the server's max-model-len and count prompts with its /tokenize."""

    def __init__(self, settings: Settings, http: httpx.AsyncClient, tokenize_url: str) -> None:
        self.settings = settings
        self.max_model_len: int | None = None
        self.supported = settings.calls.check_context_length
        self._http = http
        self._url = tokenize_url
        self._learning_limit = asyncio.Lock()
        # Behind a router: the shortest server's (url, max_model_len), which caps what
        # /tokenize tells (one server's, whichever the body hashed to); asked once.
        self.shortest: tuple[str, int] | None = None
        self._fleet_asked = False
        self._asking_fleet = asyncio.Lock()
        self._counted: OrderedDict[str, int] = OrderedDict()
        self.counted = Counted()

    def budget(self, max_tokens: int) -> int:
        """Return the output tokens the server counts against the context with the prompt
        (``context_check_includes_output``)."""
        return max_tokens if self.settings.calls.context_check_includes_output else 0

    async def check(self, body: dict[str, Any]) -> None:
        """Fail a prompt that cannot fit before it reaches the chat endpoint."""
        if not self.supported:
            return
        budget = self.budget(body["max_tokens"])
        if self.fits_without_counting(body["messages"], budget):
            return
        if self.max_model_len is None:
            # One /tokenize teaches every call waiting here the limit; without the lock a batch
            # that starts with 64 calls in flight would send 64 of them.
            async with self._learning_limit:
                if self.max_model_len is None:
                    await self._check_count(body, budget)
                    return
            if not self.supported or self.fits_without_counting(body["messages"], budget):
                return
        await self._check_count(body, budget)

    def fits_without_counting(self, messages: list[dict[str, str]], budget: int) -> bool:
        """Return True when the prompt's bytes alone prove it fits (a token covers ≥ 1 byte)."""
        if self.max_model_len is None:
            return False
        upper = message_bytes(messages)
        upper += TEMPLATE_OVERHEAD_TOKENS * (len(messages) + 1)
        return upper + budget <= self.max_model_len

    async def _check_count(self, body: dict[str, Any], budget: int) -> None:
        """Count the prompt with the server's /tokenize; raise ContextLengthError if too long.
        A prompt /tokenize cannot count now goes out as it is (as ``measure``'s)."""
        try:
            count = await self.count(body["model"], body["messages"])
        except LLMError as error:
            # A failing /tokenize says nothing about the prompt, and it is no chat attempt:
            # raised here it became one (an llm_calls row, HTTP 503 and all, for a chat
            # request the server never saw, and an attempt used up). The chat itself
            # meets the server's fault, if it lasts, and is judged on its own answer.
            log.warning("prompt could not be counted; sent as it is", error=str(error)[:200])
            return
        if count is None or self.max_model_len is None:
            return
        limit = self.max_model_len
        if count + budget > limit:
            raise ContextLengthError(
                f"prompt of {count} tokens + max_tokens {budget} exceeds max-model-len {limit}"
            )

    async def count(self, model: str, messages: list[dict[str, str]]) -> int | None:
        """Return the prompt's tokens by the server's /tokenize (None: it has none)."""
        key = hashlib.sha256(json.dumps([model, messages], sort_keys=True).encode()).hexdigest()
        if key in self._counted:
            self._counted.move_to_end(key)
            return self._counted[key]
        await self._learn_shortest()
        try:
            response = await self._http.post(
                self._url,
                json={"model": model, "messages": messages, "add_generation_prompt": True},
                headers={"Authorization": f"Bearer {self.settings.llm.api_key.get_secret_value()}"},
            )
        except httpx.HTTPError as exc:
            raise LLMConnectionError(
                redact(f"cannot reach {self._url} to count tokens: {reason(exc)}")) from None
        if response.status_code == 404:
            log.warning("server has no /tokenize; prompt length is not checked before sending")
            self.supported = False
            return None
        if response.status_code != 200:
            raise LLMHTTPError(f"/tokenize answered {response.status_code}",
                               http_status=response.status_code)
        try:
            data = response.json()
            count = int(data["count"])
            told = int(data["max_model_len"])
        except (ValueError, KeyError, TypeError) as exc:
            raise LLMMalformedError(f"/tokenize answered no token count: "
                                    f"{type(exc).__name__}: {exc}"[:300]) from None
        self.max_model_len = told if self.shortest is None else min(told, self.shortest[1])
        self._counted[key] = count
        self.counted.bytes += message_bytes(messages)
        self.counted.tokens += count
        if len(self._counted) > COUNT_CACHE:
            self._counted.popitem(last=False)
        return count

    async def _learn_shortest(self) -> None:
        """Learn, once, the shortest max_model_len among the servers behind a router here
        (``llm_router_servers``, else its /workers): a ticker's calls and the preflight's
        count land on whichever server their key hashes to, and a prompt fitted to a longer
        one fails on a shorter one. A front that cannot be asked now is asked again."""
        if self._fleet_asked:
            return
        async with self._asking_fleet:
            if self._fleet_asked:
                return
            root = self._url.removesuffix("/tokenize")
            try:
                self.shortest = await ashortest_context(
                    root, self.settings.llm.router_urls, self.settings.llm.model,
                    client=self._http, headers={"Authorization": "Bearer " +
                                                self.settings.llm.api_key.get_secret_value()})
            except ServerError:
                return
            self._fleet_asked = True
        if self.shortest is not None:
            log.info("behind the router, prompts are fitted to its shortest server",
                     server=self.shortest[0], max_model_len=self.shortest[1])

    async def measure(self, messages: list[dict[str, str]], *, max_tokens: int,
                      exact: bool = False) -> PromptSize | None:
        """Return the prompt's size against the server's context (an agents.fitting.Measure).

        None when the server cannot count (no /tokenize, the check turned off, or the server
        kept failing): the call then goes out as it is and the server has the last word.
        """
        try:
            return await self.size(messages, max_tokens=max_tokens, exact=exact)
        except LLMError as error:
            log.warning("prompt could not be counted", error=str(error))
            return None

    async def size(self, messages: list[dict[str, str]], *, max_tokens: int,
                   exact: bool = False) -> PromptSize | None:
        """Return what ``measure`` does, but raise the last try's LLMError: a server fault is
        for the caller to judge (app.traffic.client waits for the server, as for a call)."""
        return await tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(
                lambda error: isinstance(error, LLMError) and error.retryable),
            stop=tenacity.stop_after_attempt(self.settings.calls.max_attempts),
            # No wait between tries: a server that stays away is the caller's to wait for.
            reraise=True,
        )(self._measure_once, messages, self.budget(max_tokens), exact)

    async def _measure_once(self, messages: list[dict[str, str]], budget: int,
                            exact: bool) -> PromptSize | None:
        """Size the prompt once; raise what /tokenize raised (``size`` retries it)."""
        # Looked at on every try: a try in between may have taught the limit or found no
        # /tokenize at all.
        if not self.supported:
            return None
        if (not exact and self.max_model_len is not None
                and self.fits_without_counting(messages, budget)):
            return PromptSize(None, self.max_model_len - budget)
        count = await self.count(self.settings.llm.model, messages)
        if count is None or self.max_model_len is None:
            return None
        return PromptSize(count, self.max_model_len - budget)
