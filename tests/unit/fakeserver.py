"""Fake an OpenAI-compatible (vLLM-like) server at the HTTP edge, scripted per request.

Build one, hand its client to the code under test, then inspect what it saw::

    server = FakeServer(script, nodes=node_names(settings), tickers=["AAPL"])
    llm = TrackedLLM(settings, recorder, http_client=server.client())
    ...
    assert [r.node for r in server.chats] == [...]

``script`` is called with each chat request (a ``ChatRequest``) and returns a ``Reply``,
a plain string (the reply text), or None for the default reply: prose for a plain request,
a valid decision JSON for a ``response_format`` request. It may be sync or async.

What it answers:

- ``POST /v1/chat/completions``: SSE chunks (``stream: true``) ending in a usage chunk
  (``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``) and
  ``[DONE]``, or one JSON completion; an error ``Reply`` gives that HTTP status instead.
- ``POST /tokenize``: ``{count, max_model_len, tokens}`` (404 with ``tokenize=False``).
- ``GET /health``, ``GET /v1/models``, ``GET /metrics`` (``metrics_text``; 503 for the
  first ``metrics_fail_first`` reads).

Nodes are recognised from the request's seed (``app.llm.call_seed`` of ticker, node and
sample), so prompts need no markers: pass the node names and tickers you expect.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from app.llm import CallTag, call_seed

DEFAULT_DECISION = {
    "rating": "Overweight",
    "score": 0.4,
    "confidence": 0.6,
    "summary": "Fake decision: steady trend and sound fundamentals outweigh the risks.",
}


def count_tokens(text: str) -> int:
    """Count 'tokens' the fake way: one per 4 bytes, at least 1; deterministic and cheap."""
    return max(1, len(text.encode()) // 4)


def prompt_token_count(messages: list[dict[str, Any]]) -> int:
    """Count a chat prompt's tokens: content plus a fixed per-message template overhead.

    Never more than the prompt's bytes, as ``TrackedLLM``'s short-prompt shortcut assumes.
    """
    return sum(count_tokens(str(m.get("content") or "")) + 4 for m in messages)


@dataclass
class Reply:
    """What the fake answers to one chat request."""

    content: str = ""
    status: int = 200  # anything but 200 answers with an OpenAI-style error body instead
    error: str = "fake server error"
    prompt_tokens: int | None = None  # None: counted from the request
    completion_tokens: int | None = None  # None: counted from ``content``
    cached_tokens: int | None = 0  # None: leave ``prompt_tokens_details`` out
    finish_reason: str = "stop"
    delay_s: float = 0.0  # before the first byte (an error waits too)
    chunk_delay_s: float = 0.0  # between content chunks of a stream
    chunks: int = 3  # content split into this many SSE deltas
    # Break the stream after this many content deltas: "drop" the connection (the server
    # died), or "end" it cleanly with no finish reason and no usage (a truncated answer).
    cut_after: int | None = None
    cut: str = "drop"


@dataclass
class ChatRequest:
    """One chat completion request as the fake saw it."""

    index: int  # 0-based order of arrival among chat requests
    body: dict[str, Any]
    ticker: str | None  # from the seed, when it matches a known (ticker, node, sample)
    node: str | None
    sample: int | None
    served: Reply | None = None  # filled once answered

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))

    @property
    def system(self) -> str:
        return next((m["content"] for m in self.messages if m["role"] == "system"), "")

    @property
    def user(self) -> str:
        """Return the first user message (the node's prompt)."""
        return next((m["content"] for m in self.messages if m["role"] == "user"), "")

    @property
    def structured(self) -> bool:
        return self.body.get("response_format") is not None

    @property
    def max_tokens(self) -> int | None:
        return self.body.get("max_tokens")


@dataclass
class Recorded:
    """Any HTTP request that reached the fake."""

    method: str
    path: str
    body: Any
    headers: dict[str, str]


# Returns Reply | str | None, or an awaitable of one.
Script = Callable[[ChatRequest], Any]


@dataclass
class FakeServer:
    """Answer OpenAI-style requests from a script; record every request and every usage served."""

    script: Script | None = None
    nodes: Iterable[str] = ()
    tickers: Iterable[str] = ()
    samples: Iterable[int] = range(4)
    max_model_len: int = 34_816
    tokenize: bool = True
    model: str = "fake-model"
    metrics_text: str = (
        'vllm:num_requests_running{model_name="fake-model"} 0.0\n'
        'vllm:num_requests_waiting{model_name="fake-model"} 0.0\n'
        'vllm:kv_cache_usage_perc{model_name="fake-model"} 0.0\n'
        'vllm:num_preemptions_total{model_name="fake-model"} 0.0\n'
        'vllm:prompt_tokens_total{model_name="fake-model"} 0.0\n'
        'vllm:generation_tokens_total{model_name="fake-model"} 0.0\n'
    )
    requests: list[Recorded] = field(default_factory=list)
    chats: list[ChatRequest] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    metrics_fail_first: int = 0  # the first N reads of /metrics answer 503
    metrics_reads: int = 0

    def __post_init__(self) -> None:
        self._by_seed = {
            call_seed(CallTag(0, t, n, s)): (t, n, s)
            for t, n, s in itertools.product(list(self.tickers), list(self.nodes),
                                             list(self.samples))
        }
        self._ids = itertools.count(1)

    # --- wiring -----------------------------------------------------------------------------

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def client(self) -> httpx.AsyncClient:
        """Return an AsyncClient for ``TrackedLLM(http_client=...)`` or an OpenAI client."""
        return httpx.AsyncClient(transport=self.transport())

    # --- what tests read --------------------------------------------------------------------

    def served(self) -> list[ChatRequest]:
        """Return the chat requests answered with 200, in arrival order."""
        return [c for c in self.chats if c.served is not None and c.served.status == 200]

    def usage_totals(self) -> dict[str, int]:
        """Sum the usage reported in successful answers (what ``llm_calls`` should hold)."""
        totals = {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}
        for chat in self.served():
            assert chat.served is not None
            totals["prompt_tokens"] += chat.served.prompt_tokens or 0
            totals["completion_tokens"] += chat.served.completion_tokens or 0
            totals["cached_tokens"] += chat.served.cached_tokens or 0
        return totals

    def by_node(self, node: str) -> list[ChatRequest]:
        return [c for c in self.chats if c.node == node]

    # --- the server -------------------------------------------------------------------------

    async def handle(self, request: httpx.Request) -> httpx.Response:
        raw = request.content
        body: Any = json.loads(raw) if raw else None
        path = request.url.path
        self.requests.append(Recorded(request.method, path, body, dict(request.headers)))
        if path.endswith("/chat/completions") and request.method == "POST":
            return await self._chat(body)
        if path.endswith("/tokenize") and request.method == "POST":
            if not self.tokenize:
                return httpx.Response(404, json={"detail": "Not Found"})
            count = prompt_token_count(body.get("messages", []))
            return httpx.Response(200, json={"count": count, "max_model_len": self.max_model_len,
                                             "tokens": list(range(count))})
        if path.endswith("/health"):
            return httpx.Response(200)
        if path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": self.model, "object": "model", "max_model_len": self.max_model_len}]})
        if path.endswith("/metrics"):
            self.metrics_reads += 1
            if self.metrics_reads <= self.metrics_fail_first:
                return httpx.Response(503, text="metrics unavailable")
            return httpx.Response(200, text=self.metrics_text)
        return httpx.Response(404, json={"detail": "Not Found"})

    async def _chat(self, body: dict[str, Any]) -> httpx.Response:
        who = self._by_seed.get(body.get("seed", -1), (None, None, None))
        chat = ChatRequest(len(self.chats), body, *who)
        self.chats.append(chat)
        reply = await self._reply(chat)
        chat.served = reply
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            if reply.status != 200:
                return httpx.Response(reply.status, json={"error": {
                    "message": reply.error, "type": "BadRequestError" if reply.status < 500
                    else "InternalServerError", "param": None, "code": reply.status}})
            request_id = f"chatcmpl-fake-{next(self._ids)}"
            if body.get("stream"):
                return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                      content=self._sse(request_id, reply))
            return httpx.Response(200, json=self._completion(request_id, reply))
        finally:
            self.in_flight -= 1

    async def _reply(self, chat: ChatRequest) -> Reply:
        answer = self.script(chat) if self.script is not None else None
        if inspect.isawaitable(answer):
            answer = await answer
        if answer is None:
            answer = default_reply(chat)
        reply = Reply(content=answer) if isinstance(answer, str) else answer
        # Fill in the usage now, so what was served is what the test compares against.
        if reply.prompt_tokens is None:
            reply.prompt_tokens = prompt_token_count(chat.messages)
        if reply.completion_tokens is None:
            reply.completion_tokens = count_tokens(reply.content)
        return reply

    def _usage(self, reply: Reply) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": (reply.prompt_tokens or 0) + (reply.completion_tokens or 0),
        }
        if reply.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
        return usage

    async def _sse(self, request_id: str, reply: Reply) -> Any:
        def event(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
            chunk = {"id": request_id, "object": "chat.completion.chunk", "created": 0,
                     "model": self.model, "choices": choices, "usage": usage}
            return f"data: {json.dumps(chunk)}\n\n".encode()

        yield event([{"index": 0, "delta": {"role": "assistant", "content": ""},
                      "finish_reason": None}])
        for sent, piece in enumerate(split(reply.content, reply.chunks)):
            if reply.cut_after is not None and sent == reply.cut_after:
                if reply.cut == "drop":
                    # What httpx raises when the peer closes in the middle of the body.
                    raise httpx.RemoteProtocolError("peer closed connection without sending "
                                                    "complete message body")
                yield b"data: [DONE]\n\n"
                return
            if reply.chunk_delay_s:
                await asyncio.sleep(reply.chunk_delay_s)
            yield event([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
        yield event([{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}])
        yield event([], self._usage(reply))
        yield b"data: [DONE]\n\n"

    def _completion(self, request_id: str, reply: Reply) -> dict[str, Any]:
        return {
            "id": request_id, "object": "chat.completion", "created": 0, "model": self.model,
            "choices": [{"index": 0, "finish_reason": reply.finish_reason,
                         "message": {"role": "assistant", "content": reply.content}}],
            "usage": self._usage(reply),
        }


def split(text: str, parts: int) -> list[str]:
    """Split text into up to ``parts`` non-empty pieces that join back to it."""
    if not text:
        return []
    size = max(1, -(-len(text) // max(1, parts)))
    return [text[i:i + size] for i in range(0, len(text), size)]


def default_reply(chat: ChatRequest) -> str:
    """Return a decision JSON for a structured request, otherwise a short deterministic report."""
    if chat.structured:
        return json.dumps(DEFAULT_DECISION)
    who = f"{chat.node or 'node'} on {chat.ticker or 'ticker'}"
    return f"[{who}] Fake analysis #{chat.index}: the evidence is mixed."
