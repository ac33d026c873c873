"""A PostgreSQL database a newer nightdesk migrated is refused in one line, unchanged.

tests/unit/db/test_engine_newer_schema.py's case on the server two hosts on two versions share:
every entry point exits 2 with one line naming the revision, and no row of any table moves.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.db.engine import current_revision, get_engine
from tests.integration.conftest import private_database
from tests.unit.support.clirun import run_cli
from tests.unit.support.fault_night import QUICK_ENV
from tests.unit.support.newer_schema import (
    COMMANDS,
    FUTURE,
    contents,
    refused_in_one_line,
    stamp_future,
)

pytestmark = pytest.mark.integration


def test_every_command_refuses_a_newer_schema_on_postgres_and_writes_nothing(
        tmp_path: Path, demo_dir: Path) -> None:
    with private_database(f"nightdesk_newer_{os.getpid()}", upgraded=True) as url:
        stamp_future(url)
        before = contents(url)
        env = {**QUICK_ENV, "NIGHTDESK_DATABASE_URL": url, "NIGHTDESK_DATA_DIR": str(demo_dir),
               "NIGHTDESK_HOME": str(tmp_path / "home")}
        for argv in COMMANDS:
            result = run_cli(*argv, env=env)
            line = refused_in_one_line(result.code, result.stderr)
            assert line.startswith("error: the database postgresql://"), line
            assert "Traceback" not in result.stderr
        assert contents(url) == before
        assert current_revision(get_engine(url)) == FUTURE
