"""Fake vllm-router in front of several ``FakeServer``s, at the HTTP edge.

What it answers is what vllm-router 0.1.17 was seen to answer in front of two servers:
``GET /workers`` lists them (``{"workers": [{"url", "is_healthy", ...}], "total"}``),
``GET /metrics`` is the first server's page as it is (one server's figures), and every
other request goes to one server: ``policy="consistent_hash"`` picks it from the
``X-Session-ID`` header (else the body's ``user``), ``"first"`` always the first.
``workers=False`` makes it a front without ``/workers`` (404), like another gateway;
``workers_status`` (e.g. 503) one whose ``/workers`` is not ready yet.
``down`` takes the router itself away (its port refuses connections: a restart) while the
servers behind it still answer when read directly.
``names_server`` (a header name) makes it a front that names, in that response header, the
server it sent a request to; vllm-router 0.1.17 names none.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

import httpx

from tests.fakevllm.server import ASGIApp, FakeServer, asgi


@dataclass
class FakeRouter:
    """Route requests over ``servers`` (root URL -> fake) the way vllm-router would."""

    servers: dict[str, FakeServer]
    root: str = "http://router.test"
    policy: str = "consistent_hash"
    workers: bool = True
    names_server: str | None = None
    workers_status: int = 200  # e.g. 503: a router still starting
    down: bool = False  # the router's port refuses connections; its servers still answer

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    def pick(self, request: httpx.Request) -> FakeServer:
        fakes = list(self.servers.values())
        key = request.headers.get("x-session-id")
        if key is None and request.method == "POST":
            key = (json.loads(request.content or b"{}") or {}).get("user")
        if self.policy != "consistent_hash" or key is None:
            return fakes[0]
        return fakes[zlib.crc32(key.encode()) % len(fakes)]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        host = request.url.netloc
        for root, fake in self.servers.items():
            if httpx.URL(root).netloc == host:  # a server read directly
                return await fake.handle(request)
        if host != httpx.URL(self.root).netloc or self.down:
            raise httpx.ConnectError(f"nothing at {host.decode()}", request=request)
        if request.url.path == "/workers":
            if not self.workers:
                return httpx.Response(404, json={"detail": "Not Found"})
            if self.workers_status != 200:
                return httpx.Response(self.workers_status, text="starting")
            listed: list[dict[str, Any]] = [
                {"url": root, "model_id": "unknown", "worker_type": "regular",
                 "is_healthy": not fake.down, "load": fake.in_flight}
                for root, fake in self.servers.items()]
            return httpx.Response(200, json={"workers": listed, "total": len(listed)})
        if request.url.path == "/metrics":
            return await next(iter(self.servers.values())).handle(request)
        picked = self.pick(request)
        response = await picked.handle(request)
        if self.names_server is not None:
            root = next(root for root, fake in self.servers.items() if fake is picked)
            response.headers[self.names_server] = root
        return response

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handle))

    def asgi(self) -> ASGIApp:
        """Return an ASGI app of the router, for ``serving`` on a socket (``root`` must then
        be where it is served; its servers' roots, where they are)."""
        return asgi(self.handle)
