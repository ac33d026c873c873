"""The fake vLLM server of the tests: one for the unit tests, its stepped twin for the benches.

Nothing here ships in the wheel (pyproject.toml packages app, agents, serving, migrations).

- ``server``: ``FakeServer`` answers the OpenAI-style API through ``httpx.MockTransport``
  from a script, under a modelled load; ``FakeServers`` puts several behind one client.
- ``chat``: the request it saw and the ``Reply`` it gives.
- ``load``: the queue and KV cache it models, served as vLLM's ``/metrics`` text.
- ``stepped``: the same load decoding in GPU steps, served over HTTP on 127.0.0.1
  (tests/bench/fleet.py's endpoints).
"""

from tests.fakevllm.chat import (
    CONTEXT_LENGTH_MESSAGE,
    DEFAULT_DECISION,
    ChatRequest,
    Recorded,
    Reply,
    Script,
    default_reply,
    prompt_token_count,
)
from tests.fakevllm.server import BASE_URL, FakeServer, FakeServers

__all__ = ["BASE_URL", "CONTEXT_LENGTH_MESSAGE", "DEFAULT_DECISION", "ChatRequest",
           "FakeServer", "FakeServers", "Recorded", "Reply", "Script", "default_reply",
           "prompt_token_count"]
