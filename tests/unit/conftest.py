"""Fixtures shared by the unit tests of several packages: the web app's client, and the
CLI's environment for a night on the demo data."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.config import load_settings
from tests.unit.support.fault_night import QUICK_ENV
from tests.unit.support.webclient import web_client


@pytest.fixture
def client(sqlite_engine: Engine) -> Iterator[TestClient]:
    """Return the web app's client on this test's database, its schedule read in UTC."""
    # UTC: the pages' due times and "missed" verdicts then read the same on any host.
    with web_client(sqlite_engine, settings=load_settings(schedule_timezone="UTC")) as c:
        yield c


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, sqlite_url: str, sqlite_engine: Engine,
            demo_dir: Path) -> None:
    """The CLI's settings: quick retries, this test's migrated SQLite file and demo data."""
    for key, value in {**QUICK_ENV, "NIGHTDESK_DATABASE_URL": sqlite_url,
                       "NIGHTDESK_DATA_DIR": str(demo_dir)}.items():
        monkeypatch.setenv(key, value)
