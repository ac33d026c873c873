"""Fixtures shared by the unit tests of several packages (the web app's client)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.config import load_settings
from tests.unit.support.webclient import web_client


@pytest.fixture
def client(sqlite_engine: Engine) -> Iterator[TestClient]:
    """Return the web app's client on this test's database, its schedule read in UTC."""
    # UTC: the pages' due times and "missed" verdicts then read the same on any host.
    with web_client(sqlite_engine, settings=load_settings(schedule_timezone="UTC")) as c:
        yield c
