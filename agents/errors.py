"""Raise the pipeline's errors from one base, so the service can catch this whole layer.

``exit_code`` is what the service's CLI exits with; app/errors.py draws nightdesk's whole tree
and re-exports these classes, so callers import them from there or from here alike.
"""

from __future__ import annotations


def os_said(error: OSError | ValueError) -> str:
    """Return what an error reading a file says, for a line that already names the file: an
    OSError's reason alone ("Is a directory"), never "[Errno 21] …: '/path'" again."""
    return (error.strerror if isinstance(error, OSError) and error.strerror else str(error))


class PipelineError(Exception):
    """Base of every error the pipeline and its market data raise on purpose."""

    exit_code = 1


class ConfigError(PipelineError):
    """A setting is invalid: an unknown data provider, a missing optional extra."""

    exit_code = 2


class InputError(PipelineError):
    """Bad input from the user: a ticker symbol, a universe file, a count out of range."""

    exit_code = 2


class DataError(PipelineError):
    """Market data for one ticker is missing or malformed."""


class LLMError(PipelineError):
    """One LLM call failed; ``error_class`` is what ``llm_calls.error_class`` stores."""

    error_class = "error"
    retryable = False
    stops_batch = False  # every other call would fail the same way: stop, do not go on

    def __init__(self, message: str, *, http_status: int | None = None) -> None:
        super().__init__(message)
        self.http_status = http_status


class DecisionError(LLMError):
    """The final decision failed its schema after all retries; the ticker fails, never Holds."""

    error_class = "decision_invalid"


class CheckpointError(PipelineError):
    """A ticker's stored run (its checkpoint thread) cannot be continued; the ticker fails."""
