"""Raise nightdesk's errors from one tree, so callers can catch by meaning.

Each layer has its own base: agents/ and serving/ must not import app/, so their errors cannot
derive from a class defined here. Rather than a fourth package holding one shared base, the
tree has three roots, re-exported here, and ``ERRORS`` names them: the CLI catches ``ERRORS``,
prints one line and exits with the error's ``exit_code`` (the table in app/cli/batch.py).

    PipelineError      (agents.errors)  the pipeline and its market data
    ├── ConfigError                     a setting is invalid (exit 2)
    ├── InputError                      bad command-line input: tickers, universe, ids (exit 2)
    │   └── NoNightYet  (app)           nothing to read yet: no finished night, no batch
    ├── DataError                       market data for one ticker is missing or malformed
    ├── CheckpointError                 a ticker's stored run cannot be continued
    └── LLMError                        one LLM call failed (the row in ``llm_calls`` says how)
        ├── ContextLengthError          prompt (+ max_tokens) exceeds the server's max-model-len
        ├── LLMHTTPError                the server answered with an HTTP error status
        ├── LLMTimeoutError             no complete answer within the per-call timeout
        ├── LLMConnectionError          the server could not be reached, or dropped the stream
        ├── LLMStreamError              the stream broke off or ended without a finish reason
        ├── LLMMalformedError           a stream chunk was not JSON, or not shaped like a chunk
        ├── LLMCancelled                the call was cut short by its own side (only recorded)
        └── DecisionError   (agents)    the final decision failed its schema after all retries
    ServingError       (serving.errors) the vLLM server and its profiles
    ├── ServerError                     the vLLM server failed to start, stop or answer
    └── ProfileError                    a server profile is unknown or malformed (exit 2)
    NightdeskError                      the service's own
    ├── AlreadyRunningError             another nightly run holds the lock, or the batch to
    │                                   resume is running (exit 4)
    ├── DatabaseError                   the database cannot be reached or used (exit 2)
    │   └── SchemaTooNew                its schema revision is unknown here: nothing is written
    ├── NotifyError                     a destination of NIGHTDESK_NOTIFY did not take a message
    ├── BatchStopped                    the batch is stopping; this ticker stays resumable
    │   ├── ServerOutage                the server stayed down past the outage budget (exit 5)
    │   ├── ServerBusy                  the server kept answering 429/503 past the outage
    │   │                               budget (exit 5)
    │   ├── StorageOutage               the database took no write for the write budget (full,
    │   │                               or away): the batch stops interrupted (exit 2)
    │   └── UsageLost                   usage rows could not be stored: the batch stops (exit 2)
    └── BatchInterrupted (app.batch.signals)  a signal stopped the batch (exit 130)

ConfigError and InputError are the pipeline's classes, used by the service too, so one
``except InputError`` catches a bad ticker and a bad ``--workload`` alike. An LLMError with
``stops_batch`` (HTTP 401/403/404: a wrong key, URL or model) stops the whole batch instead of
failing one ticker after another: every call would meet it (exit 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Re-exported (``X as X``): the tree above is this module's to name.
from agents.errors import CheckpointError as CheckpointError
from agents.errors import ConfigError as ConfigError
from agents.errors import DataError as DataError
from agents.errors import DecisionError as DecisionError
from agents.errors import InputError as InputError
from agents.errors import LLMError as LLMError
from agents.errors import PipelineError as PipelineError
from serving.errors import ProfileError as ProfileError
from serving.errors import ServerError as ServerError
from serving.errors import ServingError as ServingError
from serving.errors import unnumbered


class NightdeskError(Exception):
    """Base of the errors the service itself (app/) raises on purpose."""

    exit_code = 1


ERRORS: tuple[type[NightdeskError], type[PipelineError], type[ServingError]] = (
    NightdeskError, PipelineError, ServingError)
"""Every error nightdesk raises on purpose: the three roots of the tree above."""


def first_line(error: BaseException | None, limit: int = 200, *, typed: bool = False) -> str:
    """Return what ``error`` says in one line, at most ``limit`` characters: its first line
    (the driver's own where SQLAlchemy wraps one, ``unnumbered``), with ``typed`` prefixed by
    its type's name unless it is one of ``ERRORS``; its type's name when it says nothing."""
    error = getattr(error, "orig", None) or error
    text = str(error or "").strip()
    if not text:
        return type(error).__name__
    kind = f"{type(error).__name__}: " if typed and not isinstance(error, ERRORS) else ""
    return (kind + unnumbered(text.splitlines()[0]))[:limit]


# pydantic's words for a value that is not a number, or out of its range, in ours.
_WORDED = {"int_parsing": "expected a whole number", "int_type": "expected a whole number",
           "int_from_float": "expected a whole number", "float_parsing": "expected a number",
           "float_type": "expected a number", "greater_than_equal": "must be at least {ge}",
           "less_than_equal": "must be at most {le}", "greater_than": "must be above {gt}",
           "less_than": "must be below {lt}"}


def validation_said(problem: Mapping[str, Any]) -> str:
    """Return what one of a pydantic ValidationError's ``errors()`` says, in nightdesk's words:
    a validator's own message as raised (no "Value error, " before it), a range or number
    refused as "must be at least 1", "expected a whole number"; never the input itself."""
    context = problem.get("ctx") or {}
    raised = context.get("error")
    if isinstance(raised, Exception):
        return str(raised)
    if problem["type"] in _WORDED:
        return _WORDED[problem["type"]].format(**context)
    return str(problem["msg"]).rstrip(".")


class NoNightYet(InputError):
    """No finished night (or no batch) to read yet: the command line adds what the morning's
    status advises (the first night, a resume), as only it knows the data home (exit 2)."""


class AlreadyRunningError(NightdeskError):
    """Another run holds the lock, or owns the batch to resume; nothing was started."""

    # Distinct from a failed batch (1) and bad input (2): a timer or daemon can tell
    # "someone else is on it" from "tonight went wrong".
    exit_code = 4


class NotifyError(NightdeskError):
    """A destination did not take a message (only `notify test` says so by its exit code:
    the digest of a night logs it and the night goes on)."""


class DatabaseError(NightdeskError):
    exit_code = 2


class SchemaTooNew(DatabaseError):
    """The database's schema revision is none this install knows (a newer nightdesk
    migrated it, or another program wrote it): every command is refused before it reads or
    writes, a refused night's row included, as this code's models may not match that schema
    (exit 2); a running daemon at its next fire, the pages with a 503 within a minute."""


# The transport failures are the tracked client's (app.llm), so they live here; they derive
# from the pipeline's LLMError because that is what its ChatClient protocol raises.
class ContextLengthError(LLMError):
    error_class = "context_length"


# The answers that say "not now" rather than "no": a server or proxy shedding load.
BACK_PRESSURE = (429, 503)


class LLMHTTPError(LLMError):
    error_class = "http"

    def __init__(self, message: str, *, http_status: int | None = None,
                 retry_after_s: float | None = None, upstream_gone: bool = False) -> None:
        super().__init__(message, http_status=http_status)
        # The wait the server asked for (its Retry-After header), if it said.
        self.retry_after_s = retry_after_s
        # Waited out within the outage budget instead of using up the call's attempts; so is
        # a router's answer that the server behind it could not be reached (``upstream_gone``):
        # not the call's fault, and gone once the router's health check routes around it.
        self.back_pressure = http_status in BACK_PRESSURE or upstream_gone
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


class LLMMalformedError(LLMError):
    """The server sent a stream chunk nobody can read: its fault, retried like a cut stream."""

    error_class = "malformed"
    retryable = True


class LLMCancelled(LLMError):
    """Describe, for its row, a call cancelled in flight (a sibling sample failed, a stop)."""

    error_class = "cancelled"


class BatchStopped(NightdeskError):
    """The batch is stopping (a signal, a server outage, a configuration error).

    Raised inside a ticker's work; the ticker is not failed but left for ``run --resume``.
    One raised before the batch was asked to stop stops it, ending with ``status``.
    """

    status = "interrupted"


class ServerOutage(BatchStopped):
    """The LLM server did not answer for longer than the outage budget."""

    exit_code = 5


class ServerBusy(BatchStopped):
    """The LLM server answered 429/503 (back-pressure) for longer than the outage budget."""

    exit_code = 5


class StorageOutage(BatchStopped):
    """A write (usage rows, a checkpoint) found the database full or away for longer than
    the write budget. Nothing is lost: the rows are kept for the resume, the node is run
    again, so the batch stops interrupted."""

    exit_code = 2


class UsageLost(BatchStopped):
    """The usage writer gave up: rows it holds are not stored, so the batch stops."""

    exit_code = 2
    status = "failed"
