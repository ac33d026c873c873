"""Raise the serving layer's errors from one base, so the service can catch this whole layer.

``exit_code`` is what the service's CLI exits with; app/errors.py draws nightdesk's whole tree
and re-exports these classes.
"""

from __future__ import annotations

import re


class ServingError(Exception):
    """Base of every error the serving layer raises on purpose."""

    exit_code = 1


class ServerError(ServingError):
    """The vLLM server failed to start, stop or answer, or answered something unreadable."""


class ProfileError(ServingError):
    """A server profile is unknown or malformed: the user's choice, so exit 2 like bad input."""

    exit_code = 2


def unnumbered(line: str) -> str:
    """Return ``line`` without the ``[Errno 111] `` an OSError puts before its words (an
    operator's line says the reason, not the C library's number)."""
    return re.sub(r"^\[Errno -?\d+\] ", "", line)


def reason(error: BaseException, *, typed: bool = False) -> str:
    """Return what ``error`` says in one line, ``unnumbered`` (a socket's, a file's); its
    type's name when it says nothing, or before its words with ``typed``."""
    text = str(error).strip()
    words = unnumbered(text.splitlines()[0]) if text else ""
    kind = type(error).__name__
    return f"{kind}: {words}" if typed and words else words or kind
