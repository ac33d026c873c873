"""Tell a ticker's own failure from the infrastructure's, for its row and for a resume.

A ticker fails on its own account when running it again would meet the same end: the model's
answer or decision (a schema unmet after its re-asks), its market data, a prompt too long for
the server, a request the server refuses as malformed (HTTP 4xx). It fails to the
infrastructure when the end came from around it: the server busy, erroring (5xx), gone,
slow or cutting its answers, the database or its disk away, a prompt file of the install
unreadable (a deploy under way). Those tickers are not verdicts:
``run --resume`` takes them up again (docs/reliability.md, "Failure classes").
"""

from __future__ import annotations

import errno
import sqlite3

import psycopg
from jinja2 import TemplateNotFound
from sqlalchemy.exc import DBAPIError

from app.db.models import INFRASTRUCTURE, OWN, FailureClass
from app.db.retry import transient
from app.errors import LLMError, first_line

# What a database says when its disk is full (SQLite, PostgreSQL's disk_full, the OS).
_DISK_FULL_WORDS = ("disk is full", "disk full", "no space left")


def failure_class(error: BaseException) -> FailureClass:
    """Return whose a ticker's failure is: ``infrastructure`` when it may pass with time,
    ``own`` otherwise (an error nobody foresaw included: a resume would meet it again)."""
    if isinstance(error, LLMError):
        # The transport's faults may pass (429, 5xx, connection, timeout, a cut or
        # malformed stream); the request's and the answer's will not (app/errors.py).
        return INFRASTRUCTURE if error.retryable else OWN
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
        return INFRASTRUCTURE
    if transient(error):
        return INFRASTRUCTURE
    # The prompts are the install's, not the ticker's: a file away for a moment (a deploy,
    # the disk) passes; a broken install meets it again on the resume, and says so.
    if isinstance(error, TemplateNotFound):
        return INFRASTRUCTURE
    if isinstance(error, DBAPIError | psycopg.Error | sqlite3.Error) and any(
            word in first_line(error).lower() for word in _DISK_FULL_WORDS):
        return INFRASTRUCTURE
    return OWN
