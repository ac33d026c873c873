"""Fake an OpenAI-compatible (vLLM-style) server at the HTTP edge, scripted per prompt.

Each chat request is keyed by the content of its last message; the script for that key
lists what successive attempts get, the last entry repeating: ``ok``, ``500``, ``400``,
``400ctx``, ``hang``, ``cut`` (the connection drops after two content chunks) or ``short``
(the stream ends cleanly after two content chunks, with no finish reason and no usage).
The fake counts every chat attempt and every usage it reported, so a test can compare
the database with what really crossed the wire.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

BASE_URL = "http://fake-llm.test/v1"

CONTEXT_MESSAGE = (
    "This model's maximum context length is 2048 tokens. However, you requested 2600 "
    "tokens (2100 in the messages, 500 in the completion). Please reduce the length of "
    "the messages or completion."
)


@dataclass
class Usage:
    """What the fake reported in one successful attempt's final usage chunk."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass
class Seen:
    """One chat attempt as the fake saw it, and what it answered."""

    key: str
    attempt: int
    outcome: str
    usage: Usage | None = None


def sse(events: list[dict[str, Any]]) -> bytes:
    """Encode chunks as a server-sent-event stream ending with [DONE]."""
    lines = [f"data: {json.dumps(e)}\n\n" for e in events]
    return ("".join(lines) + "data: [DONE]\n\n").encode()


def chunk(request_id: str, model: str, *, content: str | None = None,
          finish: str | None = None, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build one ``chat.completion.chunk`` as vLLM streams it."""
    choices: list[dict[str, Any]] = []
    if content is not None or finish is not None:
        delta = {"content": content} if content is not None else {}
        choices = [{"index": 0, "delta": delta, "finish_reason": finish}]
    body: dict[str, Any] = {"id": request_id, "object": "chat.completion.chunk",
                            "created": 0, "model": model, "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return body


@dataclass
class FakeEdge:
    """Answer ``/v1/chat/completions`` and ``/tokenize`` from a script; count what it saw."""

    script: dict[str, list[str]] = field(default_factory=dict)
    default: str = "ok"
    usage_for: Callable[[str, int], Usage] = field(
        default=lambda key, attempt: Usage(prompt_tokens=40 + len(key), completion_tokens=7,
                                           cached_tokens=16))
    pieces: tuple[str, ...] = ("Hold", " the", " line", ".")
    # Seconds to wait before the first content chunk and after the last (time-to-first-token).
    first_token_delay_s: float = 0.0
    tail_delay_s: float = 0.0
    tokenize_count: int | None = None
    max_model_len: int = 2048
    seen: list[Seen] = field(default_factory=list)
    tokenize_calls: int = 0
    _tries: Counter[str] = field(default_factory=Counter)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=self.transport())

    @property
    def chat_attempts(self) -> int:
        return len(self.seen)

    def reported(self) -> list[Usage]:
        """Return the usage of every attempt the fake answered in full."""
        return [s.usage for s in self.seen if s.usage is not None]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":
            return self._tokenize(request)
        if request.url.path != "/v1/chat/completions":
            return httpx.Response(404, json={"error": {"message": "not found"}})
        body = json.loads(request.content)
        key = body["messages"][-1]["content"]
        self._tries[key] += 1
        attempt = self._tries[key]
        plan = self.script.get(key, [self.default])
        outcome = plan[min(attempt, len(plan)) - 1]
        seen = Seen(key=key, attempt=attempt, outcome=outcome)
        self.seen.append(seen)
        if outcome == "500":
            return httpx.Response(500, json={"object": "error", "message": "engine crashed",
                                             "type": "InternalServerError", "code": 500})
        if outcome == "400":
            return httpx.Response(400, json={"object": "error", "message": "bad top_k",
                                             "type": "BadRequestError", "code": 400})
        if outcome == "400ctx":
            return httpx.Response(400, json={"object": "error", "message": CONTEXT_MESSAGE,
                                             "type": "BadRequestError", "code": 400})
        if outcome == "hang":
            # Longer than any test's call timeout: the client's timeout must cut it.
            await asyncio.sleep(60)
            return httpx.Response(504)
        assert outcome in ("ok", "cut", "short"), outcome
        usage = self.usage_for(key, attempt)
        seen.usage = usage
        rid = f"chatcmpl-{len(self.seen)}"
        model = body["model"]
        events = [chunk(rid, model, content=p) for p in self.pieces]
        events.append(chunk(rid, model, finish="stop"))
        events.append(chunk(rid, model, usage={
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        }))
        headers = {"content-type": "text/event-stream"}
        if outcome in ("cut", "short"):
            seen.usage = None  # the fake never reported usage for a broken stream
            return httpx.Response(200, headers=headers,
                                  content=self._broken(events[:2], drop=outcome == "cut"))
        if not (self.first_token_delay_s or self.tail_delay_s):
            return httpx.Response(200, headers=headers, content=sse(events))
        return httpx.Response(200, headers=headers, content=self._paced(events))

    async def _paced(self, events: list[dict[str, Any]]) -> AsyncIterator[bytes]:
        await asyncio.sleep(self.first_token_delay_s)
        for e in events[:-1]:
            yield f"data: {json.dumps(e)}\n\n".encode()
        await asyncio.sleep(self.tail_delay_s)
        yield f"data: {json.dumps(events[-1])}\n\ndata: [DONE]\n\n".encode()

    async def _broken(self, events: list[dict[str, Any]], *, drop: bool) -> AsyncIterator[bytes]:
        for e in events:
            yield f"data: {json.dumps(e)}\n\n".encode()
        if drop:
            # What httpx raises when the peer closes mid-body (e.g. the server process died).
            raise httpx.RemoteProtocolError("peer closed connection without sending complete "
                                            "message body (incomplete chunked read)")
        yield b"data: [DONE]\n\n"

    def _tokenize(self, request: httpx.Request) -> httpx.Response:
        self.tokenize_calls += 1
        body = json.loads(request.content)
        count = self.tokenize_count
        if count is None:
            count = sum(len(m["content"].split()) for m in body["messages"]) + 8
        return httpx.Response(200, json={"count": count, "max_model_len": self.max_model_len,
                                         "tokens": list(range(min(count, 16)))})
