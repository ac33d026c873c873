"""A fake server's script that stops this process the way ``systemctl stop`` does, mid-call."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from tests.fakevllm import ChatRequest, Reply

Script = Callable[[ChatRequest], Reply | None]


def sigterm_at_first(node: str, answer: Callable[[ChatRequest], Reply]) -> Script:
    """Return a script that sends this process SIGTERM when the first call of ``node``
    arrives, and answers that call with ``answer(chat)``; every other call, the default."""
    sent: list[bool] = []

    def script(chat: ChatRequest) -> Reply | None:
        if not sent and chat.node == node:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
            return answer(chat)
        return None

    return script
