"""A database a newer nightdesk migrated is refused in one line by every command, unchanged.

Its revision (here ``9999_future``) is none of this install's migrations: an operator who
rolled the package back after an upgrade, or two hosts on two versions sharing a database.
Before, Alembic's ``Can't locate revision`` ended every command in a traceback (exit 1).
"""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from app.db.engine import current_revision
from tests.unit.support.clirun import run_cli
from tests.unit.support.newer_schema import (
    COMMANDS,
    FUTURE,
    contents,
    refused_in_one_line,
    stamp_future,
)


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_every_command_refuses_a_newer_schema_in_one_line_and_writes_nothing(
        cli_env: None, sqlite_url: str, sqlite_engine: Engine, argv: tuple[str, ...]) -> None:
    stamp_future(sqlite_url)
    before = contents(sqlite_url)
    result = run_cli(*argv)
    line = refused_in_one_line(result.code, result.stderr)
    assert line.endswith("nothing was written")
    assert "Traceback" not in result.stderr
    assert contents(sqlite_url) == before  # no refusal row, no batch, no crashed mark
    assert current_revision(sqlite_engine) == FUTURE
