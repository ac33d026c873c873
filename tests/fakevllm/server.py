"""Fake a vLLM server at the HTTP edge: the one fake for the unit tests and the tracker bench.

Hand its client to the code under test, then read what it saw::

    server = FakeServer(script, nodes=node_names(config), tickers=["AAPL"], capacity=4)
    llm = TrackedLLM(settings, recorder, http_client=server.client())
    ...
    assert [c.node for c in server.chats] == [...]

What it answers, through ``httpx.MockTransport``:

- ``POST /v1/chat/completions``: SSE chunks (``stream: true``) ending in a usage chunk
  (``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``) and
  ``[DONE]``, or one JSON completion; an error ``Reply`` gives that HTTP status instead.
- ``POST /tokenize``: ``{count, max_model_len, tokens}`` (404 with ``tokenize=False``).
- ``GET /health``, ``GET /v1/models``, and ``GET /metrics`` in vLLM's Prometheus text,
  reflecting the load (``capacity``, ``kv_tokens``: see ``tests.fakevllm.load``).
- HTTP 401 on ``/v1/`` without ``api_key``, when one is set (vLLM's ``--api-key``).

``script`` is called with each chat request (a ``ChatRequest``) and returns a ``Reply``, a
plain string (the reply text), or None for the default: a valid decision JSON for a
``response_format`` request, ``max_tokens`` tokens for an ``ignore_eos`` one, else prose.
It may be sync or async. Faults come from the reply (status, ``drop``, ``cut_after`` with
``cut`` "drop", "end", "garbage" or "misshapen", ``page``: a proxy's 200 with a body of its
own, ``delay_s``, ``hold``) or on cue for the
next requests of a path (``cue``, e.g. ``cue(Reply(status=503), times=6,
path="/metrics")``), or as a burst of HTTP errors among the chat requests (``burst``: 429 or
503 for ``count`` answers from the request ``at``, or from a node's first request, with or
without ``Retry-After``). ``crash()`` takes the whole server away (every request refused and
counted in ``refused``, answers in progress cut) until ``revive()``, which brings it back
with its counters reset, as a restarted vLLM's are.

Several fakes can stand for several endpoints behind one client: ``FakeServers`` routes
each request to the fake whose base URL's host and port it names. ``sync_client()`` serves
blocking code (the preflight checks; no chat). Where only a real socket will do (a client's
connection pool), ``asgi()`` answers the same way and ``serving`` puts it on a port of
127.0.0.1.

Nodes are recognised from the request's seed (``call_seed`` of ticker, node and sample), so
prompts need no markers: pass the node names and tickers you expect. The request and reply
types live in ``tests.fakevllm.chat``, the load and its ``/metrics`` in ``tests.fakevllm.load``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
from collections import Counter, deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import uvicorn

from agents.chat import CallTag
from app.llm import call_seed
from tests.fakevllm.chat import (
    ChatRequest,
    Recorded,
    Reply,
    Script,
    count_tokens,
    default_reply,
    prompt_token_count,
    split,
    spread,
)
from tests.fakevllm.load import Sequence, ServerLoad

__all__ = ["BASE_URL", "FakeServer", "FakeServers", "serving"]

# An ASGI application: what uvicorn serves.
ASGIApp = Callable[..., Awaitable[None]]

BASE_URL = "http://fake.test/v1"
# Bound at import: the preflight tests put a factory of these clients in httpx.Client's place.
_BLOCKING_CLIENT = httpx.Client
CHAT_PATH = "/v1/chat/completions"
# The one chunk a ``Reply(cut=...)`` sends before the stream stops (see chat.Reply).
MALFORMED = {"garbage": b'data: {"id": "chatcmpl-cut", "choices": [{"delta": {"cont\n\n',
             "misshapen": b'data: {"id": "chatcmpl-odd", "object": "chat.completion.chunk", '
                          b'"created": 0, "model": "m", "choices": 7}\n\n'}


@dataclass
class FakeServer:
    """Answer OpenAI-style requests from a script under a modelled load; record everything."""

    script: Script | None = None
    nodes: Iterable[str] = ()
    tickers: Iterable[str] = ()
    samples: Iterable[int] = range(4)
    max_model_len: int = 34_816
    tokenize: bool = True
    tokenize_count: int | None = None  # None: counted from the messages
    model: str = "fake-model"
    root: str | None = None  # the weights /v1/models names (None: the model's name)
    capacity: int = 1_000_000  # requests served at once; the rest wait
    kv_tokens: int = 1_000_000_000  # KV cache size; requests wait for room in it too
    block_size: int = 16
    requests: list[Recorded] = field(default_factory=list)
    chats: list[ChatRequest] = field(default_factory=list)
    api_key: str | None = None  # vLLM's --api-key: /v1/ requests without it get 401
    down: bool = False  # crashed: see crash() and revive()
    refused: int = 0  # requests refused while down
    # (ticker, node) of each chat request refused while down
    refused_chats: list[tuple[str | None, str | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._by_seed = {
            call_seed(CallTag(0, t, n, s)): (t, n, s)
            for t, n, s in itertools.product(list(self.tickers), list(self.nodes),
                                             list(self.samples))
        }
        self._ids = itertools.count(1)
        self._attempts: Counter[str] = Counter()
        self._cues: dict[str, deque[Reply]] = {}
        self._bursts: list[_Burst] = []
        self.load = ServerLoad(capacity=self.capacity, kv_tokens=self.kv_tokens,
                               block_size=self.block_size, model=self.model)

    # --- wiring and cues ---------------------------------------------------------------------

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def client(self) -> httpx.AsyncClient:
        """Return an AsyncClient for ``TrackedLLM``, the metrics sampler or an OpenAI client."""
        return httpx.AsyncClient(transport=self.transport())

    def sync_client(self) -> httpx.Client:
        """Return a blocking client, for the checks made before any event loop runs
        (preflight); it answers every path but chat."""
        return _BLOCKING_CLIENT(transport=httpx.MockTransport(self.handle_sync))

    def asgi(self) -> ASGIApp:
        """Return an ASGI app that answers as ``handle`` does, for ``serving`` on a socket.

        A fault that drops the connection (``drop``, a crash) becomes uvicorn's HTTP 500
        there: ASGI has no way to close a connection unanswered.
        """
        return asgi(self.handle)

    def cue(self, reply: Reply, times: int = 1, path: str = CHAT_PATH) -> None:
        """Answer the next ``times`` requests to ``path`` with ``reply``, ahead of the script.

        On other paths than chat only ``status``, ``drop``, ``page`` and ``delay_s`` apply.
        """
        self._cues.setdefault(path, deque()).extend([reply] * times)

    def burst(self, status: int, count: int, *, at: int = 0, node: str | None = None,
              retry_after: str | None = None) -> None:
        """Answer ``count`` chat requests in a row with HTTP ``status`` (429, 503: a server
        shedding load), from the first whose index is ``at`` or more and, given ``node``,
        that is a request of that node; with ``retry_after``, the ``Retry-After`` header."""
        headers = {} if retry_after is None else {"Retry-After": retry_after}
        self._bursts.append(_Burst(Reply(status=status, error=f"fake burst of {status}",
                                         headers=headers), count, at, node))

    @property
    def burst_answers(self) -> int:
        """Return how many chat requests a burst has answered so far."""
        return sum(b.answered for b in self._bursts)

    def preempt(self, count: int = 1) -> None:
        self.load.preempt(count)

    def restart(self) -> None:
        self.load.restart()

    def crash(self) -> None:
        """Go away: refuse every request and cut every answer in progress, until revived.

        A request held (``Reply.hold``) stays held: a server that hangs rather than refuses.
        """
        self.down = True

    def revive(self) -> None:
        """Come back as a restarted server: answering again, every counter back at zero."""
        self.down = False
        self.load.restart()

    # --- what tests read ---------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self.load.running) + len(self.load.waiting)

    @property
    def max_in_flight(self) -> int:
        return self.load.max_in_flight

    @property
    def tokenize_calls(self) -> int:
        return sum(1 for r in self.requests if r.path == "/tokenize")

    def served(self) -> list[ChatRequest]:
        """Return the chat requests answered in full, usage included, in arrival order."""
        return [c for c in self.chats if c.completed]

    def usage_totals(self) -> dict[str, int]:
        """Sum the usage reported in complete answers (what ``llm_calls`` should hold)."""
        totals = {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}
        for chat in self.served():
            assert chat.served is not None
            totals["prompt_tokens"] += chat.served.prompt_tokens or 0
            totals["completion_tokens"] += chat.served.completion_tokens or 0
            totals["cached_tokens"] += chat.served.cached_tokens or 0
        return totals

    def by_node(self, node: str) -> list[ChatRequest]:
        return [c for c in self.chats if c.node == node]

    # --- the server --------------------------------------------------------------------------

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body, refused = self._arrive(request)
        if refused is not None:
            return refused
        path = request.url.path
        if path.endswith("/chat/completions") and request.method == "POST":
            return await self._chat(request, body)
        cued = self._cued(path)
        if cued is not None:
            await asyncio.sleep(cued.delay_s)
        return self._answer(request, body, cued)

    def handle_sync(self, request: httpx.Request) -> httpx.Response:
        """Answer as ``handle`` does, blocking, for every path but chat; cued delays skipped."""
        body, refused = self._arrive(request)
        if refused is not None:
            return refused
        if request.url.path.endswith("/chat/completions"):
            raise NotImplementedError("the blocking client does not chat: use client()")
        return self._answer(request, body, self._cued(request.url.path))

    def _arrive(self, request: httpx.Request) -> tuple[Any, httpx.Response | None]:
        """Record the request; refuse it when down, answer 401 on a wrong ``api_key``."""
        raw = request.content
        body: Any = json.loads(raw) if raw else None
        path = request.url.path
        self.requests.append(Recorded(request.method, path, body, dict(request.headers)))
        if self.down:
            self.refused += 1
            if path.endswith("/chat/completions") and isinstance(body, dict):
                self.refused_chats.append(self._by_seed.get(body.get("seed", -1),
                                                            (None, None, None))[:2])
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        # vLLM's --api-key guards the OpenAI routes only; /health, /metrics, /tokenize stay open.
        if (self.api_key is not None and path.startswith("/v1/")
                and request.headers.get("authorization") != f"Bearer {self.api_key}"):
            return body, httpx.Response(401, json={"error": "Unauthorized"})
        return body, None

    def _answer(self, request: httpx.Request, body: Any, cued: Reply | None) -> httpx.Response:
        """Answer anything but chat: ``cued`` (its delay already waited) ahead of the rest."""
        path = request.url.path
        if cued is not None:
            if cued.drop:
                raise httpx.RemoteProtocolError("Server disconnected without sending a "
                                                "response.", request=request)
            if cued.status != 200:
                return self._error(cued)
            if cued.page is not None:
                return _page(cued)
        if path.endswith("/tokenize") and request.method == "POST":
            if not self.tokenize:
                return httpx.Response(404, json={"detail": "Not Found"})
            count = self.tokenize_count
            if count is None:
                count = prompt_token_count(body.get("messages", []))
            return httpx.Response(200, json={"count": count, "max_model_len": self.max_model_len,
                                             "tokens": list(range(min(count, 16)))})
        if path.endswith("/health"):
            return httpx.Response(200)
        if path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": self.model, "object": "model", "root": self.root or self.model,
                 "max_model_len": self.max_model_len}]})
        if path.endswith("/metrics"):
            return httpx.Response(200, text=self.load.metrics_text(),
                                  headers={"content-type": "text/plain; version=0.0.4"})
        return httpx.Response(404, json={"detail": "Not Found"})

    def _cued(self, path: str) -> Reply | None:
        queue = self._cues.get(path)
        return queue.popleft() if queue else None

    async def _chat(self, request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        ticker, node, sample = self._by_seed.get(body.get("seed", -1), (None, None, None))
        messages = body.get("messages") or [{}]
        key = str(messages[-1].get("content", ""))
        self._attempts[key] += 1
        chat = ChatRequest(len(self.chats), body, ticker, node, sample, key=key,
                           attempt=self._attempts[key])
        self.chats.append(chat)
        reply = await self._reply(chat)
        chat.served = reply
        if reply.page is not None:
            return _page(reply)
        if reply.drop or reply.status != 200:
            # Refused before any scheduling, as vLLM refuses a bad request.
            await asyncio.sleep(reply.delay_s)
            if reply.drop:
                raise httpx.RemoteProtocolError("Server disconnected without sending a "
                                                "response.", request=request)
            return self._error(reply)
        assert reply.prompt_tokens is not None and reply.completion_tokens is not None
        seq = Sequence(reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens or 0)
        await self.load.enter(seq)
        try:
            await asyncio.sleep(reply.delay_s)
            if reply.hold is not None:
                await reply.hold.wait()
        except BaseException:
            self.load.leave(seq, None)
            raise
        request_id = f"chatcmpl-fake-{next(self._ids)}"
        if body.get("stream"):
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  stream=_Stream(self._sse(request, chat, seq, reply,
                                                           request_id)))
        pieces: list[str] = []
        try:
            async for piece in self._decode(request, seq, reply):
                pieces.append(piece)
        except _EndedEarly:
            self.load.leave(seq, None)
            cut = self._completion(request_id, reply)
            # The text so far, with no finish reason and no usage: not completed.
            cut["choices"][0].update(finish_reason=None,
                                     message={"role": "assistant", "content": "".join(pieces)})
            del cut["usage"]
            return httpx.Response(200, json=cut)
        except BaseException:
            self.load.leave(seq, None)
            raise
        self.load.leave(seq, reply.finish_reason)
        chat.completed = True
        return httpx.Response(200, json=self._completion(request_id, reply))

    async def _reply(self, chat: ChatRequest) -> Reply:
        for burst in self._bursts:
            if burst.answers(chat):
                return replace(burst.reply)
        answer: Any = self._cued(CHAT_PATH)
        if answer is None and self.script is not None:
            answer = self.script(chat)
            if inspect.isawaitable(answer):
                answer = await answer
        if answer is None:
            answer = default_reply(chat)
        reply = Reply(content=answer) if isinstance(answer, str) else replace(answer)
        # Fill in the usage now, so what was served is what the test compares against.
        if reply.prompt_tokens is None:
            reply.prompt_tokens = prompt_token_count(chat.messages)
        if reply.completion_tokens is None:
            reply.completion_tokens = count_tokens(reply.content) if reply.content else 0
        return reply

    def _error(self, reply: Reply) -> httpx.Response:
        kind = "BadRequestError" if reply.status < 500 else "InternalServerError"
        return httpx.Response(reply.status, headers=reply.headers, json={"error": {
            "message": reply.error, "type": kind, "param": None, "code": reply.status}})

    async def _decode(self, request: httpx.Request, seq: Sequence,
                      reply: Reply) -> AsyncIterator[str]:
        """Yield the content pieces, each after its tokens' decode time; cut on cue."""
        pieces = split(reply.content, reply.chunks)
        tokens = spread(reply.completion_tokens or 0, max(1, len(pieces)))
        for i, share in enumerate(tokens):
            if reply.token_delay_s and share:
                await asyncio.sleep(reply.token_delay_s * share)
            self.load.generate(seq, share)
            if self.down or (reply.cut_after is not None and i >= reply.cut_after):
                if reply.cut == "reset" and not self.down:
                    raise httpx.ReadError("[Errno 104] Connection reset by peer",
                                          request=request)
                if reply.cut != "drop" and not self.down:
                    raise _EndedEarly
                raise httpx.RemoteProtocolError("peer closed connection without sending "
                                                "complete message body", request=request)
            if i < len(pieces):
                yield pieces[i]

    def _usage(self, reply: Reply) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": (reply.prompt_tokens or 0) + (reply.completion_tokens or 0),
        }
        if reply.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
        return usage

    async def _sse(self, request: httpx.Request, chat: ChatRequest, seq: Sequence, reply: Reply,
                   request_id: str) -> AsyncGenerator[bytes, None]:
        def event(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
            chunk = {"id": request_id, "object": "chat.completion.chunk", "created": 0,
                     "model": self.model, "choices": choices, "usage": usage}
            return f"data: {json.dumps(chunk)}\n\n".encode()

        try:
            yield event([{"index": 0, "delta": {"role": "assistant", "content": ""},
                          "finish_reason": None}])
            try:
                async for piece in self._decode(request, seq, reply):
                    yield event([{"index": 0, "delta": {"content": piece},
                                  "finish_reason": None}])
            except _EndedEarly:
                yield MALFORMED.get(reply.cut, b"")
                yield b"data: [DONE]\n\n"  # no finish reason, no usage: not completed
                return
            yield event([{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}])
            # The work is done: leave before the last bytes, which a client may never ask for.
            chat.completed = True
            self.load.leave(seq, reply.finish_reason)
            yield event([], self._usage(reply)) + b"data: [DONE]\n\n"
        finally:
            if not chat.completed:
                self.load.leave(seq, None)

    def _completion(self, request_id: str, reply: Reply) -> dict[str, Any]:
        return {
            "id": request_id, "object": "chat.completion", "created": 0, "model": self.model,
            "choices": [{"index": 0, "finish_reason": reply.finish_reason,
                         "message": {"role": "assistant", "content": reply.content}}],
            "usage": self._usage(reply),
        }


def _page(reply: Reply) -> httpx.Response:
    """A proxy's own 200 answer in place of the server's."""
    return httpx.Response(200, text=reply.page, headers={"content-type": reply.page_type})


@dataclass
class _Burst:
    """A run of ``count`` error answers, started by the first chat request it matches."""

    reply: Reply
    count: int
    at: int
    node: str | None
    answered: int = 0

    def answers(self, chat: ChatRequest) -> bool:
        """Tell whether this burst answers ``chat`` (counting it if so)."""
        started = self.answered > 0
        if self.answered >= self.count or not (
                started or (chat.index >= self.at and self.node in (None, chat.node))):
            return False
        self.answered += 1
        return True


class _EndedEarly(Exception):
    """A ``cut`` other than "drop" stops here: the answer ends, unfinished (after its
    malformed chunk, if it has one)."""
@dataclass
class FakeServers:
    """Several fakes behind one client, one per base URL: endpoints of one batch.

    ``base_urls`` is the value for ``NIGHTDESK_LLM_BASE_URL``.
    """

    servers: dict[str, FakeServer]

    @property
    def base_urls(self) -> str:
        return ",".join(self.servers)

    def transport(self) -> httpx.MockTransport:
        by_host = {httpx.URL(url).netloc: server for url, server in self.servers.items()}

        async def handle(request: httpx.Request) -> httpx.Response:
            server = by_host.get(request.url.netloc)
            if server is None:
                raise httpx.ConnectError(f"no fake at {request.url.netloc.decode()}",
                                         request=request)
            return await server.handle(request)

        return httpx.MockTransport(handle)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=self.transport())


class _Stream(httpx.AsyncByteStream):
    """Carry an answer's bytes; closing it (the client gave up) ends the answer at once."""

    def __init__(self, chunks: AsyncGenerator[bytes, None]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._chunks:
            yield chunk

    async def aclose(self) -> None:
        await self._chunks.aclose()


def asgi(handle: Callable[[httpx.Request], Awaitable[httpx.Response]]) -> ASGIApp:
    """Return an ASGI app that answers every HTTP request as ``handle`` does."""
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        host, port = scope["server"]
        url = httpx.URL(scheme=scope["scheme"], host=host, port=port, path=scope["path"],
                        query=scope["query_string"])
        response = await handle(httpx.Request(scope["method"], url, content=body,
                                              headers=scope["headers"]))
        # Sent as it comes (chunked): a stream's length is not known at its start.
        headers = [(k, v) for k, v in response.headers.raw if k.lower() != b"content-length"]
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": headers})
        if response.is_stream_consumed:  # a whole body (JSON, text), read when built
            await send({"type": "http.response.body", "body": response.content})
            return
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


@contextlib.asynccontextmanager
async def serving(apps: list[ASGIApp], ports: list[int] | None = None
                  ) -> AsyncIterator[list[int]]:
    """Serve each app on 127.0.0.1 while open, on ``ports`` (default: free ones); yield them.

    Leaving stops the servers: connections still open are closed.
    """
    servers = [uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                             log_level="warning", lifespan="off",
                                             access_log=False))
               for app, port in zip(apps, ports or [0] * len(apps), strict=True)]
    async with asyncio.TaskGroup() as group:
        for server in servers:
            group.create_task(server.serve())
        while not all(s.started for s in servers):
            await asyncio.sleep(0.02)
        try:
            yield [s.servers[0].sockets[0].getsockname()[1] for s in servers]
        finally:
            for server in servers:
                server.should_exit = True
