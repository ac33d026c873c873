from __future__ import annotations

import os

import pytest

from app.db.engine import get_engine, upgrade
from tests.integration.conftest import private_database
from tests.unit.support.schema_checks import (
    check_crashed_rows_end_when_last_alive,
    check_legacy_rows_keep_working,
    check_reordered_catch_up,
    check_schema,
)

pytestmark = pytest.mark.integration


def test_blank_postgres_upgrades_to_the_models(pg_url: str) -> None:
    upgrade(pg_url)
    upgrade(pg_url)  # idempotent: a second upgrade is a no-op
    check_schema(get_engine(pg_url))


def test_a_postgres_database_stamped_before_the_reordering_catches_up() -> None:
    with private_database(f"nightdesk_reorder_{os.getpid()}") as url:
        check_reordered_catch_up(url)


def test_postgres_rows_stored_before_call_ids_keep_working() -> None:
    with private_database(f"nightdesk_call_ids_{os.getpid()}") as url:
        check_legacy_rows_keep_working(url)


def test_postgres_crashed_rows_marked_before_last_alive_end_when_last_alive() -> None:
    with private_database(f"nightdesk_crashed_ends_{os.getpid()}") as url:
        check_crashed_rows_end_when_last_alive(url)
