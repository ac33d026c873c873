from __future__ import annotations

import pytest

from app.db.engine import get_engine, upgrade
from tests.unit.test_schema import check_schema

pytestmark = pytest.mark.integration


def test_blank_postgres_upgrades_to_the_models(pg_url: str) -> None:
    upgrade(pg_url)
    upgrade(pg_url)  # idempotent: a second upgrade is a no-op
    check_schema(get_engine(pg_url))
