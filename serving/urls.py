"""Derive a vLLM server's URLs from its OpenAI base URL, and make any URL safe to show.

``redact`` is the one way a URL's password is kept out of what nightdesk prints, logs,
stores and serves: base URLs, ``/metrics`` URLs, database URLs, and error text that quotes
one (httpx and the OpenAI client put the request URL in their messages).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# scheme://user:password@ — the password runs to the last "@" of its URL (an unencoded "@"
# in a password is taken by some parsers), a URL ending at whitespace, a comma (lists of
# endpoints), a quote or an angle bracket (URLs quoted in reprs, JSON and HTML).
_USERINFO = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@,'\"<>]*):(?P<password>[^\s,'\"<>]*)@")
MASK = "***"


def redact(text: str) -> str:
    """Return ``text`` with the password of every URL in it replaced by ``***``.

    Works on one URL, a comma-separated list of them, or any message quoting URLs; a URL
    without a password, one whose password is a placeholder in angle brackets (the
    ``user:<password>@host`` of an example in nightdesk's own messages), and all other text
    are returned as they were.
    """
    return _USERINFO.sub(lambda m: f"{m['head']}:{MASK}@", text)


def server_root(base_url: str) -> str:
    """Return the server's root URL (where /tokenize, /health and /metrics live)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


# The host names that are this host: a server there is one whose process nightdesk may see.
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def is_local(url: str) -> bool:
    """Return whether ``url`` names this host (127.0.0.1, localhost or ::1)."""
    return urlsplit(url).hostname in LOCAL_HOSTS


def same_server(url: str) -> tuple[str, str, int | None, str]:
    """Return what names one server in ``url``: scheme and host in lower case, this host's
    names (``LOCAL_HOSTS``) as one, the port the scheme implies filled in, the path without
    its trailing slash. Two URLs with one key are one server: listed twice, its capacity
    would be counted twice (each read as a server of its own). Names resolving alike
    (a host name and its address) are left apart on purpose: a proxy or an ingress on one
    address and port serves each name (its Host) from a server of its own, and DNS's
    answer is one moment's (a round-robin name has several)."""
    parts = urlsplit(url.strip())
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    try:
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
    except ValueError:  # not a port: no server to compare
        port = None
    return (scheme, "localhost" if host in LOCAL_HOSTS else host, port,
            parts.path.rstrip("/"))


def unique_servers(urls: list[str]) -> list[str]:
    """Return ``urls`` with each server (``same_server``) once, at its first place."""
    seen: dict[tuple[str, str, int | None, str], str] = {}
    for url in urls:
        seen.setdefault(same_server(url), url)
    return list(seen.values())
