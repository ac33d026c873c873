"""Pin the exact columns of every table and check the migration chain matches the models."""

from __future__ import annotations

from sqlalchemy import Engine

from tests.unit.support.schema_checks import (
    check_crashed_rows_end_when_last_alive,
    check_legacy_rows_keep_working,
    check_reordered_catch_up,
    check_schema,
)


def test_blank_sqlite_upgrades_to_the_models(sqlite_engine: Engine) -> None:
    check_schema(sqlite_engine)


def test_a_database_stamped_before_the_reordering_gets_the_revisions_it_skipped(
        sqlite_url: str) -> None:
    check_reordered_catch_up(sqlite_url)


def test_rows_stored_before_call_ids_keep_working(sqlite_url: str) -> None:
    check_legacy_rows_keep_working(sqlite_url)


def test_crashed_rows_marked_before_last_alive_end_when_last_alive(sqlite_url: str) -> None:
    check_crashed_rows_end_when_last_alive(sqlite_url)
