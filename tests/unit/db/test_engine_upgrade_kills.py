"""``nightdesk db upgrade`` killed after any statement of any migration runs again on SQLite.

See tests/unit/support/upgrade_kills.py for how the statements are found and the kills made;
tests/integration/test_upgrade_kills_postgres.py does the same on PostgreSQL.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from alembic import command

from app.db.engine import alembic_config, upgrade
from tests.unit.support.upgrade_kills import check_every_kill, discover, populate, snapshot

pytestmark = pytest.mark.slow  # about 120 kills, each followed by a whole upgrade


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


def test_an_upgrade_killed_after_any_statement_on_a_blank_sqlite_file_runs_again(
        tmp_path: Path) -> None:
    steps = discover(_url(tmp_path / "discover.db"))
    assert all(step.statements for step in steps), "a migration that sent nothing"
    clean = tmp_path / "clean.db"
    upgrade(_url(clean))
    expected = snapshot(_url(clean))

    def blank(name: str) -> str:
        return _url(tmp_path / f"{name}.db")

    points = sum(len(step.statements) for step in steps)
    assert check_every_kill(blank, points, expected, "blank") == points


def test_an_upgrade_killed_after_any_statement_on_a_populated_sqlite_file_runs_again(
        tmp_path: Path) -> None:
    """Each migration runs on a database filled at the revision before it, every table."""
    steps = discover(_url(tmp_path / "discover.db"))
    for step in steps[1:]:
        base = tmp_path / f"{step.revision}.db"
        command.upgrade(alembic_config(_url(base)), step.down or "base")
        assert populate(_url(base)) > 0
        clean = tmp_path / f"{step.revision}-clean.db"
        shutil.copyfile(base, clean)
        upgrade(_url(clean))
        expected = snapshot(_url(clean))
        assert any(table["rows"] for table in expected.values())

        def copy(name: str, base: Path = base) -> str:
            shutil.copyfile(base, tmp_path / f"{name}.db")
            return _url(tmp_path / f"{name}.db")

        check_every_kill(copy, len(step.statements), expected, step.revision)
