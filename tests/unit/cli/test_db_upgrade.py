"""``nightdesk db upgrade`` says what it did: created the schema, upgraded it from a revision,
or found it current."""

from __future__ import annotations

from pathlib import Path

from alembic import command

from app.db.engine import alembic_config, head_revision, scripts
from tests.unit.support.clirun import run_cli


def test_db_upgrade_says_whether_it_created_upgraded_or_found_the_schema(
        tmp_path: Path) -> None:
    head = head_revision()
    blank = f"sqlite:///{tmp_path / 'blank.db'}"
    first = run_cli("db", "upgrade", env={"NIGHTDESK_DATABASE_URL": blank})
    assert (first.code, first.stdout.strip()) == (0, f"database schema created at revision "
                                                     f"{head}"), first.stderr
    again = run_cli("db", "upgrade", env={"NIGHTDESK_DATABASE_URL": blank})
    assert again.stdout.strip() == f"database schema already current at revision {head}"

    older = f"sqlite:///{tmp_path / 'older.db'}"
    before = scripts().get_revision(head).down_revision
    assert isinstance(before, str)
    command.upgrade(alembic_config(older), before)
    done = run_cli("db", "upgrade", env={"NIGHTDESK_DATABASE_URL": older})
    assert (done.code, done.stdout.strip()) == (
        0, f"database schema upgraded from revision {before} to {head}"), done.stderr
