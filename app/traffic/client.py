"""The one client a ticker's graph calls through: its server's gate and budget on every call.

A ticker's calls go to the endpoint it was routed to (app/traffic/server.py), through that
endpoint's gate and token budget. When the endpoint goes down the ticker *continues* on an
endpoint that is up; its chain is not restarted: the graph's state lives in this process,
so the nodes already answered stay answered, and only the call that was cut short is sent
again (the new endpoint recomputes the prefix it had not cached). That call is:

- one waiting for a place, or in flight, when the endpoint is declared down: cancelled and
  sent to the new endpoint (its row records the cancellation);
- one that failed at the server (connection, stream, timeout, 5xx) once the client's
  retries were spent: sent on when the endpoint's reads say it is down or restarted, else
  failed as it always was (``ServerSet.after_failure``).

A call sent again is the same call (``app.llm.Call``): its attempts there go on from the
ones made before, and ``ChatResult.attempts`` counts both tries. A call is sent at most
twice per endpoint; past that its last failure stands.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import structlog

from agents.chat import CallTag, ChatResult
from agents.fitting import PromptSize
from app.errors import (
    ContextLengthError,
    LLMConnectionError,
    LLMError,
    LLMHTTPError,
    LLMMalformedError,
    LLMStreamError,
    LLMTimeoutError,
)
from app.llm import Admit, Call, TrackedLLM
from app.traffic.budget import Claim
from app.traffic.server import Server, ServerSet
from app.traffic.tasks import cancel_and_wait, wait_first
from app.traffic.ticket import Ticket

log = structlog.get_logger(__name__)

Send = Callable[[TrackedLLM, int, Call, Admit], Awaitable[ChatResult]]
"""Send one call with a client: (client, priority rank, the call, the endpoint's admission
of each attempt) -> result."""


class EndpointGone(LLMConnectionError):
    """The call's endpoint went down while the call waited or ran; it is sent elsewhere."""


def server_fault(error: LLMError) -> bool:
    """Tell whether a failed call says something about its server rather than the request."""
    if isinstance(error, ContextLengthError):
        return False
    if isinstance(error, LLMHTTPError):
        return error.http_status is None or error.http_status >= 500
    return isinstance(error, LLMConnectionError | LLMStreamError | LLMTimeoutError
                      | LLMMalformedError)


class TickerClient:
    """The one client a ticker's graph calls through: its server's gate and budget on each call.

    A call passes the ticker's server (a chain slot when prefetching, the budget's claim, a
    place at the gate per attempt) and is sent by that server's TrackedLLM. When the server
    goes down the ticker moves to one that is up (the module's doc). ``rank`` gives each
    request's priority (the scheduler's tail rule; start order without it).
    """

    def __init__(self, servers: ServerSet, server: Server, ticket: Ticket,
                 on_request: asyncio.Event | None = None, *,
                 rank: Callable[[Ticket], int] | None = None,
                 on_finish: Callable[[Ticket], None] | None = None,
                 on_redo: Callable[[Ticket], None] | None = None,
                 may_pass: Callable[[Ticket], bool] | None = None) -> None:
        self.servers = servers
        self.server = server
        self.ticket = ticket
        self.settings = server.llm.settings
        self._on_request = on_request
        self._rank = rank
        self._on_finish = on_finish
        self._on_redo = on_redo
        self._may_pass = may_pass  # an urgent ticker's chain need not wait for a slot
        server.arrive(ticket)
        server.started += 1

    @property
    def priority(self) -> int:
        return self.ticket.order

    @asynccontextmanager
    async def _request(self) -> AsyncIterator[int]:
        """Count one request of the ticker, from its first attempt to its last."""
        if self._on_request is not None:
            self._on_request.set()
        # The priority is decided per request: a ticker can turn urgent on the way.
        rank = self._rank(self.ticket) if self._rank is not None else self.ticket.order
        try:
            yield rank
        finally:
            self.ticket.done += 1
            if self._on_finish is not None:
                self._on_finish(self.ticket)

    async def measure(self, messages: list[dict[str, str]], *, max_tokens: int,
                      exact: bool = False) -> PromptSize | None:
        """Count a prompt for the context guard; not a request, so it needs no place."""
        return await self.server.llm.measure(messages, max_tokens=max_tokens, exact=exact)

    def close(self) -> None:
        """Release what the ticker still holds: its work is over (call once)."""
        self.server.gate.drop_hold(self.ticket)
        self.server.leave(self.ticket)
        self.servers.changed.set()

    async def chat(self, tag: CallTag, messages: list[dict[str, str]], **kwargs: Any) -> ChatResult:
        kwargs.pop("priority", None)
        sized = {"messages": messages, "max_tokens": kwargs.get("max_tokens", 0)}
        ready = datetime.now(UTC)  # issued by the graph: a wait from here on is ours
        return await self._routed(tag, sized, lambda llm, rank, call, admit: llm.chat(
            tag, messages, priority=rank, admit=admit, ready_at=ready, call=call, **kwargs))

    async def send(self, tag: CallTag, body: dict[str, Any]) -> ChatResult:
        ready = datetime.now(UTC)
        return await self._routed(tag, body, lambda llm, rank, call, admit: llm.send(
            tag, body, priority=rank, admit=admit, ready_at=ready, call=call))

    async def _routed(self, tag: CallTag, sized: dict[str, Any], send: Send) -> ChatResult:
        call = Call()  # the same call on every endpoint it is sent to
        loop = asyncio.get_running_loop()
        # A server that keeps flapping must not keep one call going round for ever.
        sends_left = 2 * len(self.servers)
        while True:
            sends_left -= 1
            endpoint = self._here()
            if endpoint.strategy.prefetch and not self.ticket.chained:
                # Outside the call: a wait for a chain slot is not an attempt at the server.
                await endpoint.enter_chain(self.ticket, self._may_pass)
            started = loop.time()
            try:
                result = await self._unless_gone(
                    endpoint, self._on(endpoint, tag, sized, send, call))
            except LLMError as error:
                if not server_fault(error) or sends_left == 0:
                    raise
                target = await self.servers.after_failure(
                    endpoint, started, reached=not isinstance(error, LLMConnectionError))
                if target is None:
                    raise
                log.warning("call sent again", node=tag.node, ticker=tag.ticker,
                            failed_at=endpoint.name, to=target.name, error=str(error)[:200])
                self.ticket.done -= 1
                if self._on_redo is not None:
                    self._on_redo(self.ticket)
                self._move(target)
                continue
            return result

    def _here(self) -> Server:
        """Return the ticker's endpoint, moving the ticker first when that one is down."""
        if not self.server.up:
            target = self.servers.alternative(self.server)
            if target is not None:
                self._move(target)
        return self.server

    def _move(self, target: Server) -> None:
        if target is self.server:
            return  # already there: another of its calls (samples, analysts) moved it
        log.warning("ticker moved", frm=self.server.name, to=target.name,
                    order=self.ticket.order)
        self.server.leave(self.ticket)
        self.server.moved_out += 1
        target.arrive(self.ticket)
        target.moved_in += 1
        self.server = target
        self.servers.changed.set()

    async def _on(self, endpoint: Server, tag: CallTag, sized: dict[str, Any], send: Send,
                  call: Call) -> ChatResult:
        """Send one call through ``endpoint``'s gate and budget."""
        held_by = self.ticket.held_by
        if held_by is not None and held_by is not endpoint.gate:
            held_by.release_hold(self.ticket)  # its context is in another replica's cache
        budget = endpoint.limits.budget
        if budget is not None:
            await endpoint.count_first(sized["messages"])
        claim = budget.claim(tag.node, sized) if budget is not None else Claim(0)
        async with self._request() as rank:
            # Each attempt takes a place (and the tokens) at this endpoint's gate; a retry's
            # backoff waits outside it, as on one endpoint .
            admit = functools.partial(endpoint.gate.slot, rank, claim, self.ticket)
            result = await send(endpoint.llm, rank, call, admit)
        if budget is not None:
            budget.learn(tag.node, sized, result.prompt_tokens, result.completion_tokens)
        return result

    async def _unless_gone(self, endpoint: Server,
                           call: Coroutine[Any, Any, ChatResult]) -> ChatResult:
        """Await the call; if its endpoint goes down first and another is up, cancel it."""
        if not self.servers.several:
            return await call  # one endpoint: nowhere to go, so nothing to watch
        task = asyncio.create_task(call)
        try:
            while not task.done():
                await wait_first(task, endpoint.gone.wait() if endpoint.up
                                 else self.servers.health_event().wait())
                if task.done() or endpoint.up or self.servers.alternative(endpoint) is None:
                    continue  # all down: the call goes on where it is, as with one server
                await cancel_and_wait(task)
                if task.cancelled():
                    raise EndpointGone(f"{endpoint.name} went down during the call")
                break  # it finished just before the cancel: keep its answer
            return task.result()
        finally:
            await cancel_and_wait(task)
