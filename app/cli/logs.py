"""Configure the process's output: structlog (readable on a terminal, JSON lines otherwise;
context in contextvars) and the rich consoles the commands print with (``console``).

Every log line, structlog's and the standard library's, passes through
``serving.urls.redact``: no URL's password reaches a log, whichever value or message quoted it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import sys
from typing import IO, Any, Literal, TextIO, cast

import structlog
from rich.console import Console
from structlog.typing import EventDict

from serving.urls import redact


def _scrubbed(value: Any) -> Any:
    """Return ``value`` with every string in it (keys too) redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {_scrubbed(key): _scrubbed(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_scrubbed(item) for item in value)
    return value


def redact_event(_logger: Any, _method: str, event: EventDict) -> EventDict:
    """structlog processor: no password of a URL in any value of the event.

    A traceback (``log.exception``) is formatted here, into ``exception``, so that it is
    redacted too: an exception's message may quote a URL.
    """
    event = structlog.processors.format_exc_info(_logger, _method, event)
    return {redact(key): _scrubbed(value) for key, value in event.items()}


class _RedactFilter(logging.Filter):
    """Redact a standard-library record's message (httpx, uvicorn and alembic log there)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        safe = redact(message)
        if safe != message:
            record.msg, record.args = safe, None
        return True


# Off a terminal (a pipe, a file, the journal) a console is this wide: no line, table or word
# is ever broken, where rich would otherwise fold everything at 80 columns.
UNWRAPPED_WIDTH = 100_000


# Whether a reader of stdout or stderr went away in this process (``reader_gone``), and
# which of them met a full disk (``FULL``).
_GONE: list[IO[str]] = []
_FULL: list[IO[str]] = []
# A file that cannot grow: its disk full, a quota met, a size limit (RLIMIT_FSIZE).
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def full(error: BaseException) -> bool:
    """Return whether ``error`` is a write refused for want of room (``FULL``)."""
    return isinstance(error, OSError) and error.errno in FULL


def hung_up(error: BaseException) -> bool:
    """Return whether ``error`` is a closed pipe's, or a terminal's that hung up (its window
    closed, the ssh session under it dropped: every write fails with EIO from then on)."""
    return isinstance(error, BrokenPipeError) or (
        isinstance(error, OSError) and error.errno == errno.EIO)


def lose(stream: IO[str], error: OSError) -> None:
    """Let ``stream`` go (``reader_gone``) when ``error`` says its reader went away or its
    disk is full; raise ``error`` otherwise."""
    if not (hung_up(error) or full(error)):
        raise error
    reader_gone(stream, filled=full(error))


def reader_gone(stream: IO[str], *, filled: bool = False) -> None:
    """Point ``stream``, whose reader closed the pipe (or whose file's disk is full:
    ``filled``), at the null device: what is still written to it is dropped, not raised,
    and the interpreter's last flush says nothing. ``app.cli.main`` then ends a command
    that succeeded with 141 (``lost_a_reader``), or 74 (``lost_to_a_full_disk``)."""
    (_FULL if filled else _GONE).append(stream)
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)


def lost_a_reader(*, forget: bool = False) -> bool:
    """Return whether a reader went away since the last ``forget``."""
    lost = bool(_GONE)
    if forget:
        _GONE.clear()
        _FULL.clear()
    return lost


def lost_to_a_full_disk() -> bool:
    """Return whether stdout or stderr met a full disk since ``lost_a_reader``'s forget."""
    return bool(_FULL)


class _SideChannel(io.TextIOBase):
    """stderr for log lines, looked up at each write (tests and the daemon swap it): its
    reader gone (`nightdesk run 2>&1 | head -3`) stops the lines, never the work
    that logs them. A night's record is its database; its log lines are a view of it."""

    def write(self, text: str) -> int:
        try:
            return sys.stderr.write(text)
        except OSError as error:  # its reader gone or its disk full: the lines stop
            lose(sys.stderr, error)
        return len(text)

    def flush(self) -> None:
        try:
            sys.stderr.flush()
        except OSError as error:
            lose(sys.stderr, error)


SIDE_CHANNEL = _SideChannel()


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """stdout's reader gone: raise it for ``app.cli.main`` to end the command (exit 141);
        rich's own would exit 1 (a failed batch's code) and leave the console quiet for the
        rest of the process (the daemon's, a test's). stderr's: go on without it, as the log
        lines do (``_SideChannel``)."""
        if self.stderr:
            reader_gone(sys.stderr)
            return
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    def _check_buffer(self) -> None:
        """stderr's disk full or terminal hung up: go on without it, as the log lines do;
        stdout's is raised for ``app.cli.main`` (exit 74 with one line, or 141)."""
        try:
            super()._check_buffer()
        except OSError as error:
            if not self.stderr:
                raise
            lose(sys.stderr, error)


def console(*, stderr: bool = False) -> Console:
    """Return a rich Console for a command's lines and tables: the terminal's width on a
    terminal, no wrapping anywhere else; no highlighting (the text is the command's own)."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else UNWRAPPED_WIDTH
    return _Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)


def configure_logging(fmt: Literal["auto", "console", "json"] = "auto",
                      level: str = "INFO") -> None:
    """Route structlog (and stdlib logging) to stderr in the chosen format.

    ``level`` is a name Settings has checked (DEBUG, INFO, WARNING, ERROR, CRITICAL).
    """
    json_lines = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_lines
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[structlog.typing.Processor] = [
        # batch_id, ticker and node are bound with bind_contextvars by the engine and graph.
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_event,
    ]
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        # stderr looked up per line: tests (and daemons) swap the stream after configuring.
        logger_factory=lambda *_: structlog.PrintLogger(cast(TextIO, SIDE_CHANNEL)),
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    had = list(root.handlers)
    logging.basicConfig(level=logging.WARNING, stream=SIDE_CHANNEL)
    # A library's record is a line like nightdesk's own (JSON in the journal), with the
    # logger's name: no "WARNING:apscheduler…:" prefix. Handlers set up by others (pytest's)
    # keep their format.
    library = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer])
    for handler in root.handlers:
        if handler not in had:
            handler.setFormatter(library)
        if not any(isinstance(f, _RedactFilter) for f in handler.filters):
            handler.addFilter(_RedactFilter())
