"""Raise the serving layer's errors from one base, so the service can catch this whole layer.

``exit_code`` is what the service's CLI exits with; app/errors.py draws nightdesk's whole tree
and re-exports these classes.
"""

from __future__ import annotations


class ServingError(Exception):
    """Base of every error the serving layer raises on purpose."""

    exit_code = 1


class ServerError(ServingError):
    """The vLLM server failed to start, stop or answer, or answered something unreadable."""


class ProfileError(ServingError):
    """A server profile is unknown or malformed: the user's choice, so exit 2 like bad input."""

    exit_code = 2
