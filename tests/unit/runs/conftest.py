"""Fixtures of the command-line nights here: a quick environment on the demo data."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.unit.support.fault_night import QUICK_ENV


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, sqlite_url: str, sqlite_engine: Engine,
            demo_dir: Path) -> None:
    """The CLI's settings: quick retries, this test's migrated SQLite file and demo data."""
    for key, value in {**QUICK_ENV, "NIGHTDESK_DATABASE_URL": sqlite_url,
                       "NIGHTDESK_DATA_DIR": str(demo_dir)}.items():
        monkeypatch.setenv(key, value)
