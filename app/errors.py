"""Raise nightdesk's errors from one tree, so callers can catch by meaning.

Each layer has its own base: agents/ and serving/ must not import app/, so their errors cannot
derive from a class defined here. Rather than a fourth package holding one shared base, the
tree has three roots, re-exported here, and ``ERRORS`` names them: the CLI catches ``ERRORS``,
prints one line and exits with the error's ``exit_code`` (2 for config and input, else 1).

    PipelineError      (agents.errors)  the pipeline and its market data
    ├── ConfigError                     a setting is invalid (exit 2)
    ├── InputError                      bad command-line input: tickers, universe, ids (exit 2)
    ├── DataError                       market data for one ticker is missing or malformed
    └── LLMError                        one LLM call failed (the row in ``llm_calls`` says how)
        ├── ContextLengthError          prompt (+ max_tokens) exceeds the server's max-model-len
        ├── LLMHTTPError                the server answered with an HTTP error status
        ├── LLMTimeoutError             no complete answer within the per-call timeout
        ├── LLMConnectionError          the server could not be reached
        ├── LLMStreamError              the server failed in the middle of a streamed answer
        └── DecisionError   (agents)    the final decision failed its schema after all retries
    ServingError       (serving.errors) the vLLM server and its profiles
    ├── ServerError                     the vLLM server failed to start, stop or answer
    └── ProfileError                    a server profile is unknown or malformed (exit 2)
    NightdeskError                      the service's own
    ├── AlreadyRunningError             another nightly batch holds the lock (exit 4)
    ├── DatabaseError                   the database cannot be reached or used (exit 2)
    │   └── SchemaOutdatedError         the schema is behind the code; run ``nightdesk db upgrade``
    └── BatchInterrupted (app.batch.signals)  a signal stopped the batch (exit 130)

ConfigError and InputError are the pipeline's classes, used by the service too, so one
``except InputError`` catches a bad ticker and a bad ``--workload`` alike.
"""

from __future__ import annotations

from agents.errors import (
    ConfigError,
    DataError,
    DecisionError,
    InputError,
    LLMError,
    PipelineError,
)
from serving.errors import ProfileError, ServerError, ServingError

__all__ = [
    "ERRORS",
    "ConfigError",
    "ContextLengthError",
    "DataError",
    "DatabaseError",
    "DecisionError",
    "InputError",
    "LLMConnectionError",
    "LLMError",
    "LLMHTTPError",
    "LLMStreamError",
    "LLMTimeoutError",
    "NightdeskError",
    "PipelineError",
    "ProfileError",
    "SchemaOutdatedError",
    "ServerError",
    "ServingError",
]


class NightdeskError(Exception):
    """Base of the errors the service itself (app/) raises on purpose."""

    exit_code = 1


ERRORS: tuple[type[NightdeskError], type[PipelineError], type[ServingError]] = (
    NightdeskError, PipelineError, ServingError)
"""Every error nightdesk raises on purpose: the three roots of the tree above."""


class AlreadyRunningError(NightdeskError):
    """Another nightly run holds the lock; nothing was started, nothing was written."""

    # Distinct from a failed batch (1) and bad input (2): a timer or daemon can tell
    # "someone else is on it" from "tonight went wrong".
    exit_code = 4


class DatabaseError(NightdeskError):
    exit_code = 2


class SchemaOutdatedError(DatabaseError):
    pass


# The transport failures are the tracked client's (app.llm), so they live here; they derive
# from the pipeline's LLMError because that is what its ChatClient protocol raises.
class ContextLengthError(LLMError):
    error_class = "context_length"


class LLMHTTPError(LLMError):
    error_class = "http"

    def __init__(self, message: str, *, http_status: int | None = None) -> None:
        super().__init__(message, http_status=http_status)
        # 5xx and 429 are the server's trouble and may pass; 4xx is ours and will not.
        self.retryable = http_status is None or http_status >= 500 or http_status == 429


class LLMTimeoutError(LLMError):
    error_class = "timeout"
    retryable = True


class LLMConnectionError(LLMError):
    error_class = "connection"
    retryable = True


class LLMStreamError(LLMError):
    error_class = "stream"
    retryable = True
