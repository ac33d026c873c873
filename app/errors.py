"""Raise nightdesk's errors from one tree, so callers can catch by meaning.

    NightdeskError                 base; ``exit_code`` is what the CLI exits with
    ├── ConfigError                a setting is invalid (exit 2)
    ├── InputError                 bad command-line input: tickers, universe, ids (exit 2)
    ├── DatabaseError              the database cannot be reached or used (exit 2)
    │   └── SchemaOutdatedError    the schema is behind the code; run ``nightdesk db upgrade``
    ├── DataError                  market data for one ticker is missing or malformed
    ├── LLMError                   one LLM call failed (the row in ``llm_calls`` says how)
    │   ├── ContextLengthError     prompt (+ max_tokens) exceeds the server's max-model-len
    │   ├── LLMHTTPError           the server answered with an HTTP error status
    │   ├── LLMTimeoutError        no complete answer within the per-call timeout
    │   ├── LLMConnectionError     the server could not be reached
    │   ├── LLMStreamError         the server failed in the middle of a streamed answer
    │   ├── LLMCancelled           the call was cut short by its own side (only recorded)
    │   └── DecisionError          the final decision failed its schema after all retries
    ├── ServerError                the vLLM server failed to start, stop or answer
    └── BatchStopped               the batch is stopping; this ticker stays resumable
        └── ServerOutage           the server stayed down past the outage budget (exit 5)

An LLMError with ``stops_batch`` (HTTP 401/403/404: a wrong key, URL or model) stops the
whole batch instead of failing one ticker after another: every call would meet it.
"""

from __future__ import annotations


class NightdeskError(Exception):
    """Base of every error nightdesk raises on purpose."""

    exit_code = 1


class ConfigError(NightdeskError):
    exit_code = 2


class InputError(NightdeskError):
    exit_code = 2


class DatabaseError(NightdeskError):
    exit_code = 2


class SchemaOutdatedError(DatabaseError):
    pass


class DataError(NightdeskError):
    pass


class LLMError(NightdeskError):
    """One LLM call failed; ``error_class`` is what ``llm_calls.error_class`` stores."""

    error_class = "error"
    retryable = False
    stops_batch = False  # every other call would fail the same way: stop, do not go on

    def __init__(self, message: str, *, http_status: int | None = None) -> None:
        super().__init__(message)
        self.http_status = http_status


class ContextLengthError(LLMError):
    error_class = "context_length"


class LLMHTTPError(LLMError):
    error_class = "http"

    def __init__(self, message: str, *, http_status: int | None = None) -> None:
        super().__init__(message, http_status=http_status)
        # 5xx and 429 are the server's trouble and may pass; 4xx is ours and will not.
        self.retryable = http_status is None or http_status >= 500 or http_status == 429
        # A wrong key (401/403) or a wrong URL or model name (404) is the configuration's.
        self.stops_batch = http_status in (401, 403, 404)
        if self.stops_batch:
            self.exit_code = 2


class LLMTimeoutError(LLMError):
    error_class = "timeout"
    retryable = True


class LLMConnectionError(LLMError):
    error_class = "connection"
    retryable = True


class LLMStreamError(LLMError):
    error_class = "stream"
    retryable = True


class LLMCancelled(LLMError):
    """Describe, for its row, a call cancelled in flight (a sibling sample failed, a stop)."""

    error_class = "cancelled"


class DecisionError(LLMError):
    error_class = "decision_invalid"


class ServerError(NightdeskError):
    pass


class BatchStopped(NightdeskError):
    """The batch is stopping (a signal, a server outage, a configuration error).

    Raised inside a ticker's work; the ticker is not failed but left for ``run --resume``.
    """


class ServerOutage(BatchStopped):
    """The LLM server did not answer for longer than the outage budget."""

    exit_code = 5
