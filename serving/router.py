"""Ask a router in front of several vLLM servers which servers it routes to.

vllm-router answers ``GET /workers`` with ``{"workers": [{"url": ..., "is_healthy": ...},
...], "total": N}``; a vLLM server (or any other front) has no such path. What nightdesk
does with the list (each server's /metrics read, their KV capacity summed) is the service's
business (app/traffic/sampler.py).
"""

from __future__ import annotations

import httpx

from serving.errors import ServerError
from serving.urls import redact, server_root


def workers_url(base_url: str) -> str:
    """Return the /workers URL for an OpenAI base URL (…/v1) or a server root."""
    return server_root(base_url) + "/workers"


async def afetch_workers(base_url: str, *, client: httpx.AsyncClient,
                         timeout_s: float = 5.0) -> list[str] | None:
    """Return the servers' URLs a vllm-router at ``base_url`` lists (None: no router's list
    there, e.g. a vLLM server's 404); unreachable is a ServerError."""
    url = workers_url(base_url)
    try:
        response = await client.get(url, timeout=timeout_s)
    except httpx.HTTPError as error:
        raise ServerError(redact(f"cannot read {url}: {error}")) from None
    if response.status_code != 200:
        return None
    try:
        workers = response.json().get("workers")
    except (ValueError, AttributeError):
        return None
    if not isinstance(workers, list):
        return None
    urls = [w["url"].rstrip("/") for w in workers
            if isinstance(w, dict) and isinstance(w.get("url"), str) and w["url"]]
    return urls or None
