"""Tell the errors of a database that takes no writes now (read-only, full) from the others.

Read commands write a little on the way: ``report`` marks a batch whose process died
``crashed``. Against a database that is read-only (a read-only file or folder, SQLite's
``mode=ro``, PostgreSQL's ``default_transaction_read_only``) or full, that write is left
out and what is stored is still shown.
"""

from __future__ import annotations

import sqlite3
import sys

import psycopg

from app.errors import first_line
from serving.urls import redact

# SQLite's primary result codes (the low byte of an extended one): read-only, full, the
# I/O error a full disk gives when a file must grow, a file it may not open for writing.
_SQLITE_CODES = {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR,
                 sqlite3.SQLITE_CANTOPEN}
_PG_READ_ONLY = "25006"  # read_only_sql_transaction
_PG_RESOURCES = "53"  # insufficient_resources: disk_full, out_of_memory, too_many_connections


def refuses_writes(error: BaseException) -> bool:
    """Return True when ``error`` (SQLAlchemy's or the driver's) says writes cannot land now."""
    cause = getattr(error, "orig", None) or error
    if isinstance(cause, sqlite3.Error):
        code = getattr(cause, "sqlite_errorcode", None)
        return code is not None and code & 0xFF in _SQLITE_CODES
    if isinstance(cause, psycopg.Error):
        state = cause.sqlstate or ""
        return state == _PG_READ_ONLY or state.startswith(_PG_RESOURCES)
    return False


def refusal(error: BaseException) -> str | None:
    """Return one line for a command stopped by a database that takes no writes now, with
    what the driver said; None for any other error."""
    if not refuses_writes(error):
        return None
    said = first_line(error, sys.maxsize)
    return (f"the database takes no writes now ({redact(said)}); make it writable, or free "
            "space on its disk, and run the command again")
