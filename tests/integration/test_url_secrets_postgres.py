"""A password in the PostgreSQL URL and the base URLs appears nowhere, on real PostgreSQL.

The scenario of tests/unit/test_url_secrets.py, with the canary also in the database URL
(the server trusts local connections, so any password is let in). Here the checkpoints,
the lock and the usage rows share that database, so every one of its tables is searched.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.db.engine import get_engine
from tests.integration.conftest import private_database
from tests.unit.support.canary import CANARY, database_cells, run_night_with_a_canary

pytestmark = pytest.mark.integration


def test_a_password_in_the_database_and_base_urls_appears_nowhere_on_postgres(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with private_database(f"nightdesk_canary_{os.getpid()}") as url:
        user, rest = url.split("://", 1)[1].split("@", 1)
        assert ":" not in user  # the admin URL carries no password of its own
        secret = f"postgresql+psycopg://{user}:{CANARY}@{rest}"
        try:
            run_night_with_a_canary(monkeypatch, tmp_path, secret,
                                    lambda: database_cells(secret))
        finally:
            get_engine(secret).dispose()
