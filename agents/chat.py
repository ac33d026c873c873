"""Declare what the pipeline asks of its LLM client: a call tag, a reply and two methods.

The service's tracked client (``app.llm.TrackedLLM``) satisfies ``ChatClient``; the pipeline
never imports it, so it can be reused and tested with any client that has ``chat`` and
``measure``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from agents.fitting import Sizer, Trim


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


class ChatClient(Sizer, Protocol):
    """Send one chat completion; raise ``agents.errors.LLMError`` when it cannot be had.

    As a ``Sizer`` it also counts a prompt against the server's context, so a node can
    leave out context before sending (agents.fitting).
    """

    async def chat(
        self,
        tag: CallTag,
        messages: list[dict[str, str]],
        *,
        max_tokens: int,
        response_format: dict[str, Any] | None = None,
        trimmed: Trim | None = None,
    ) -> ChatResult: ...
