"""vLLM's router in front of several vLLM servers: its command line, and its list of them.

``nightdesk server start --gpus 0,1 --router`` runs ``vllm-router`` (the ``nightdesk[router]``
extra) with ``router_command`` in front of the servers it started; the launcher runs it
like a server (its pid and log files under the key ``<profile>-router``).

vllm-router answers ``GET /workers`` with ``{"workers": [{"url": ..., "is_healthy": ...},
...], "total": N}``; a vLLM server (or any other front) has no such path. What nightdesk
does with the list (each server's /metrics read, their KV capacity summed) is the service's
business (app/traffic/sampler.py).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from serving.errors import ServerError
from serving.profiles import ServerCommand
from serving.urls import redact, server_root, unique_servers

# consistent_hash: a ticker's calls carry one key (app/llm.py), so they share one server.
POLICY = "consistent_hash"
# vllm-router's own health check, as 0.1.17 spells it: /health every 5 s, two failures in a
# row to mark a server unhealthy (about 10 s). Its defaults (every 60 s, three failures) left
# a dead server listed healthy for up to three minutes: only the circuit breaker, opened by
# calls failing there, moved keys off it, and /workers (what nightdesk reads capacity from)
# kept counting it.
HEALTH_FLAGS = ("--health-check-interval-secs", "5", "--health-failure-threshold", "2")


def find_binary() -> str:
    """Return the ``vllm-router`` executable: beside this interpreter (the extra installed
    in this venv), else on PATH; a ServerError saying how to install it when there is none."""
    found = (shutil.which("vllm-router", path=str(Path(sys.executable).parent))
             or shutil.which("vllm-router"))
    if found is None:
        raise ServerError("vllm-router is not installed: pip install 'nightdesk[router]'")
    return found


def router_key(profile: str) -> str:
    """Return the launcher key (pid, log and facts files) of a profile's router."""
    return f"{profile}-router"


def router_command(binary: str, host: str, port: int, workers: list[str], *,
                   policy: str = POLICY, extra: Sequence[str] = ()) -> ServerCommand:
    """Return the command that runs vllm-router on ``host:port`` in front of ``workers``
    (server root URLs) with ``policy`` (by default one that keeps each ticker on one server),
    the health check of ``HEALTH_FLAGS``, and ``extra`` flags as vllm-router spells them
    (after those, so one of them given again in ``extra`` wins)."""
    return ServerCommand(argv=[binary, "--host", host, "--port", str(port), "--policy", policy,
                               *HEALTH_FLAGS, *extra, "--worker-urls", *workers], env={})


def workers_url(base_url: str) -> str:
    """Return the /workers URL for an OpenAI base URL (…/v1) or a server root."""
    return server_root(base_url) + "/workers"


@dataclass(frozen=True)
class Worker:
    """One server a router lists: its root URL and the router's own verdict on it."""

    url: str
    healthy: bool | None  # the router's ``is_healthy`` (None: it said nothing)


def parse_workers(response: httpx.Response) -> list[Worker] | None:
    """Return the servers in a ``/workers`` answer (None: not a router's list, e.g. 404)."""
    if response.status_code != 200:
        return None
    try:
        workers = response.json().get("workers")
    except (ValueError, AttributeError):
        return None
    if not isinstance(workers, list):
        return None
    listed = [Worker(w["url"].rstrip("/"),
                     w.get("is_healthy") if isinstance(w.get("is_healthy"), bool) else None)
              for w in workers
              if isinstance(w, dict) and isinstance(w.get("url"), str) and w["url"]]
    return listed or None


def fetch_workers(base_url: str, *, timeout_s: float = 5.0) -> list[Worker] | None:
    """Return what a vllm-router at ``base_url`` lists (None: no router's list there);
    unreachable is a ServerError. Blocking: for the command line."""
    url = workers_url(base_url)
    try:
        response = httpx.get(url, timeout=timeout_s)
    except httpx.HTTPError as error:
        raise ServerError(redact(f"cannot read {url}: {error}")) from None
    return parse_workers(response)


async def afetch_workers(base_url: str, *, client: httpx.AsyncClient,
                         timeout_s: float = 5.0) -> list[str] | None:
    """Return the servers' URLs a vllm-router at ``base_url`` lists, each server once (None:
    no /workers there, a 4xx such as a vLLM server's 404; empty: a router listing none yet);
    unreachable or a 5xx (a router starting) is a ServerError."""
    url = workers_url(base_url)
    try:
        response = await client.get(url, timeout=timeout_s)
    except httpx.HTTPError as error:
        raise ServerError(redact(f"cannot read {url}: {error}")) from None
    if response.status_code >= 500:
        raise ServerError(redact(f"{url} answered {response.status_code}"))
    if response.status_code >= 400:
        return None
    # One server under two names (vllm-router lists http://localhost:8000 and
    # http://127.0.0.1:8000/ as two workers) is read once: its capacity is one server's.
    return unique_servers([w.url for w in parse_workers(response) or []])


async def ashortest_context(base_url: str, servers: Sequence[str], model: str, *,
                            client: httpx.AsyncClient, headers: dict[str, str] | None = None,
                            timeout_s: float = 5.0) -> tuple[str, int] | None:
    """Return the server behind a router at ``base_url`` whose max_model_len for ``model`` is
    the smallest, and that length, as each server's ``/v1/models`` tells it; None: no router
    there (no ``servers`` named and no /workers list), or no server told; a router whose
    /workers cannot be read now is a ServerError. The router hashes a ticker's calls, and a
    /tokenize, to any one of them: a prompt must fit the shortest."""
    listed = list(servers) or await afetch_workers(base_url, client=client,
                                                   timeout_s=timeout_s) or []

    async def length(url: str) -> int | None:
        try:
            response = await client.get(server_root(url) + "/v1/models", headers=headers,
                                        timeout=timeout_s)
            response.raise_for_status()
            entry = next(m for m in response.json()["data"] if m.get("id") == model)
            return int(entry["max_model_len"])
        except (httpx.HTTPError, ValueError, LookupError, TypeError, AttributeError,
                StopIteration):
            return None  # not reachable from here, or says nothing: the others decide

    urls = unique_servers(listed)  # asked together: one unreachable costs one timeout
    async with asyncio.TaskGroup() as group:
        asked = [group.create_task(length(url)) for url in urls]
    told = {url: n for url, task in zip(urls, asked, strict=True)
            if (n := task.result()) is not None}
    if not told:
        return None
    shortest = min(told, key=told.__getitem__)
    return redact(shortest), told[shortest]


async def aanswers(base_url: str, *, client: httpx.AsyncClient, timeout_s: float = 5.0) -> None:
    """Return when the front at ``base_url`` answers ``GET /health`` at all (any status: with
    every server behind it down vllm-router answers 503, and is there); a ServerError when
    it does not (a router restarting refuses connections while the servers still answer)."""
    url = server_root(base_url) + "/health"
    try:
        await client.get(url, timeout=timeout_s)
    except httpx.HTTPError as error:
        raise ServerError(redact(f"the router does not answer at {url}: {error}")) from None
