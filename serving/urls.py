"""Derive a vLLM server's URLs from the OpenAI base URL that clients are configured with."""

from __future__ import annotations


def server_root(base_url: str) -> str:
    """Return the server's root URL (where /tokenize, /health and /metrics live)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root
