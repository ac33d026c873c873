"""A chat client that answers the decision node from a script, and the call it is asked."""

from __future__ import annotations

from typing import Any

from agents.chat import CallTag, ChatResult
from agents.fitting import Prompt

TAG = CallTag(batch_id=1, ticker="ACME", node="portfolio_manager")


def prompt(_left_out: int) -> list[dict[str, str]]:
    """Render the node's prompt: MESSAGES, with nothing to leave out."""
    return MESSAGES


class ScriptedLLM:
    """Answer chat() from a list of contents (or exceptions), recording each call."""

    def __init__(self, replies: list[Any], attempts_per_call: int = 1) -> None:
        self.replies = list(replies)
        self.attempts_per_call = attempts_per_call
        self.calls: list[dict[str, Any]] = []

    async def chat(self, tag: CallTag, prompt: Prompt, *, max_tokens: int,
                   response_format: dict[str, Any] | None = None,
                   priority: int | None = None) -> ChatResult:
        # It cannot count: every prompt goes out as it is, nothing left out.
        self.calls.append({"messages": prompt.render(0), "response_format": response_format,
                           "priority": priority})
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return ChatResult(content=reply, prompt_tokens=10, completion_tokens=5,
                          cached_tokens=0, finish_reason="stop", request_id="r",
                          attempts=self.attempts_per_call)


MESSAGES = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
