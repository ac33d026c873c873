"""Declare what the pipeline asks of its LLM client: a call tag, a reply and one method.

The service's clients (``app.traffic.client.TickerClient`` in a batch, ``app.llm.TrackedLLM``
straight to one server) satisfy ``ChatClient``; the pipeline never imports them, so it can
be reused and tested with any client that has ``chat``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from agents.fitting import Prompt


@dataclass(frozen=True)
class CallTag:
    """Who a call is for: the batch, ticker, node and sample its ``llm_calls`` rows carry."""

    batch_id: int
    ticker: str
    node: str
    sample: int = 0


@dataclass
class ChatResult:
    """One completed chat call: the reply, the server's usage, and the HTTP attempts it took."""

    content: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    finish_reason: str | None
    request_id: str | None
    attempts: int = 1


class ChatClient(Protocol):
    """Make one call: fit ``prompt`` into the server's context (``agents.fitting.fit``, what
    it leaves out recorded on the call's rows), then send it as one chat completion; raise
    ``agents.errors.LLMError`` when it cannot be had. A node calls its client once per call.
    """

    async def chat(
        self,
        tag: CallTag,
        prompt: Prompt,
        *,
        max_tokens: int,
        response_format: dict[str, Any] | None = None,
    ) -> ChatResult: ...
