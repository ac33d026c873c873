"""Isolate every test from the developer's environment and settings cache."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from sqlalchemy import Engine

from app.config import get_settings
from app.db.engine import get_engine, upgrade


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith("NIGHTDESK_") and not key.startswith("NIGHTDESK_TEST_"):
            monkeypatch.delenv(key)
    # Every runtime path derives from the home: the database, snapshots, server files.
    monkeypatch.setenv("NIGHTDESK_HOME", str(tmp_path))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()
    structlog.reset_defaults()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/nightdesk.db"


@pytest.fixture
def sqlite_engine(sqlite_url: str) -> Engine:
    """Return an engine on a blank SQLite file upgraded to the newest migration."""
    upgrade(sqlite_url)
    return get_engine(sqlite_url)
