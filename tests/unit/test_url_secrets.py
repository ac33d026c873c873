"""A password in any URL nightdesk is given appears nowhere it prints, logs, stores or serves.

One canary password sits in both endpoints of ``NIGHTDESK_LLM_BASE_URL`` (and, on
PostgreSQL, in the database URL: tests/integration/test_url_secrets_postgres.py). A night
runs through the CLI against the fake server with JSON logs, meets refused connections and
an outage past its budget, is resumed, and is then read back every way there is: the
report (table and JSON), the ranking, every web page and API. The canary is searched in all
of it, and in every column of every table.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Literal

import pytest
import structlog

from app.cli.logs import configure_logging
from app.runs.checkpoints import checkpoint_path
from serving.urls import redact
from tests.unit.support.canary import (
    CANARY,
    Cells,
    run_night_with_a_canary,
)


def sqlite_cells(path: str) -> Cells:
    """Return every cell of every table of a SQLite file, read with sqlite3 itself."""
    cells: Cells = []
    with sqlite3.connect(path) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            cursor = conn.execute(f'SELECT * FROM "{table}"')
            columns = [d[0] for d in cursor.description]
            cells += [(table, column, value) for row in cursor
                      for column, value in zip(columns, row, strict=True)]
    return cells


@pytest.mark.slow
@pytest.mark.parametrize("names", [("a",), ("a", "b")], ids=["one-endpoint", "two-endpoints"])
def test_a_password_in_the_base_urls_appears_nowhere(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path,
                                                     names: tuple[str, ...]) -> None:
    db_file = tmp_path / "nightdesk.db"
    run_night_with_a_canary(
        monkeypatch, tmp_path, f"sqlite:///{db_file}",
        lambda: sqlite_cells(str(db_file)) + sqlite_cells(
            checkpoint_path(f"sqlite:///{db_file}")), names)


@pytest.mark.parametrize(("text", "shown"), [
    ("http://nd:pw@h:8000/v1", "http://nd:***@h:8000/v1"),
    ("http://nd:pw@a/v1,https://nd:pw2@b/v1", "http://nd:***@a/v1,https://nd:***@b/v1"),
    ("postgresql+psycopg://u:p%40ss@db:5432/n", "postgresql+psycopg://u:***@db:5432/n"),
    ("cannot reach http://u:p@ss@h/v1: refused", "cannot reach http://u:***@h/v1: refused"),
    ('{"base_url": "http://u:pw@h/v1"}', '{"base_url": "http://u:***@h/v1"}'),
    ("URL('http://:tok@h/v1')", "URL('http://:***@h/v1')"),
    ("http://user@h/v1 and http://h/v1", "http://user@h/v1 and http://h/v1"),
    ("ratio a:b@c, no URL", "ratio a:b@c, no URL"),
])
def test_redact_masks_the_password_of_every_url_and_nothing_else(text: str, shown: str) -> None:
    assert redact(text) == shown


@pytest.mark.parametrize(("configured", "shown_back"), [
    ("postgresql://nd:s3cr%40t@db:5432/nightdesk", "postgresql://nd:***@db:5432/nightdesk"),
    ("postgresql+psycopg://nd@db/nightdesk", "postgresql://nd@db/nightdesk"),
    ("sqlite:////var/lib/nightdesk/nightdesk.db", "sqlite:////var/lib/nightdesk/nightdesk.db"),
])
def test_a_database_url_is_shown_as_configured_with_the_one_mask(configured: str,
                                                                 shown_back: str) -> None:
    # The settings hold the driver's form (postgresql+psycopg://, what the engine needs);
    # the operator reads back what was set, the password masked as every URL's is.
    from app.config import load_settings
    from app.db.engine import shown

    url = load_settings(database_url=configured).store.database_url
    assert shown(url) == shown_back


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_no_log_line_shows_a_password_not_even_a_traceback(
        fmt: Literal["json", "console"], capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    configure_logging(fmt, "INFO")
    log = structlog.get_logger("canary")
    url = f"http://nd:{CANARY}@gpu.test/v1"
    try:
        raise RuntimeError(f"cannot reach {url}")
    except RuntimeError as error:
        log.exception("nightly run crashed", error=str(error), endpoints={url: [url]})
    err = capsys.readouterr().err
    assert "nightly run crashed" in err
    assert "RuntimeError: cannot reach http://nd:***@gpu.test/v1" in err  # the traceback
    assert CANARY not in err
    # The standard library's records (httpx, uvicorn, alembic) go through the same filter;
    # under pytest its capture handler stands where the stderr handler would be.
    logging.getLogger("httpx").warning("HTTP Request: POST %s/chat/completions", url)
    assert "HTTP Request: POST http://nd:***@gpu.test/v1" in caplog.text
    assert CANARY not in caplog.text
