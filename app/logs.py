"""Configure structlog: readable on a terminal, JSON lines otherwise; context in contextvars."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog


def configure_logging(fmt: Literal["auto", "console", "json"] = "auto",
                      level: str = "INFO") -> None:
    """Route structlog (and stdlib logging) to stderr in the chosen format."""
    json_lines = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_lines
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            # batch_id, ticker and node are bound with bind_contextvars by the engine and graph.
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        # Look stderr up per logger: tests (and daemons) swap the stream after configuring.
        logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
