"""A JSON webhook on 127.0.0.1 for the digest's tests: Apprise's ``json://`` posts land here.

Started inside the test (an ``http.server`` on a free port, in a thread the context manager
stops and joins), so a digest travels the real way: Apprise, HTTP, a listener.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Webhook:
    port: int
    posts: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    def url(self, path: str = "digest") -> str:
        """Return the Apprise URL that posts JSON to this listener."""
        return f"json://127.0.0.1:{self.port}/{path}"


@contextmanager
def webhook() -> Iterator[Webhook]:
    """Listen on 127.0.0.1 for JSON posts while open; answer each 200."""
    hook: Webhook

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            hook.posts.append(json.loads(self.rfile.read(length)))
            hook.paths.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_args: Any) -> None:  # keep test output clean
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook = Webhook(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, name="test-webhook")
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def closed_port() -> int:
    """Return a port on 127.0.0.1 that nothing listens on: a destination that is down, or
    one a test starts a server on (the unit tests' one such helper)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
