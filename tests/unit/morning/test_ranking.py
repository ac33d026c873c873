"""The ranking row has one definition: ``RankRow``, which the ranking's ``RankedRow`` and the
ticker history's ``HistoryPoint`` extend, in their fields and in the JSON they are served as.

The rows are ``web_rows``': the ranking shows night 1 with the rerun applied (AAA and BBB
ranked, CCC failed), and AAA's history has night 0 and night 1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.morning.changes import RankedRow
from app.morning.ranking import RankRow
from app.morning.views import HistoryPoint
from app.web.reruns import RerunQueue
from tests.unit.support.clirun import run_cli
from tests.unit.support.web_rows import fill
from tests.unit.support.webclient import AUTH, web_client

PREVIOUS = ["previous_rank", "previous_rating", "previous_score", "change", "score_move"]
NIGHT = ["as_of", "nightly_batch_id"]


@pytest.fixture
def client(sqlite_engine: Engine) -> Iterator[TestClient]:
    fill(sqlite_engine)
    with web_client(sqlite_engine, reruns=RerunQueue(command=lambda job: ["false"])) as c:
        yield c


def test_ranked_row_and_history_point_have_the_ranking_rows_fields_in_its_order() -> None:
    row = RankRow.model_fields
    assert list(RankedRow.model_fields) == [*row, *PREVIOUS]
    assert list(HistoryPoint.model_fields) == [*NIGHT, *row]
    for model in (RankedRow, HistoryPoint):
        for name, field in row.items():
            assert model.model_fields[name].annotation == field.annotation, (model, name)
            assert model.model_fields[name].is_required(), (model, name)


def test_the_served_rows_have_those_fields_in_that_order(client: TestClient) -> None:
    row = list(RankRow.model_fields)
    ranking = client.get("/api/ranking", auth=AUTH).json()
    assert [r["ticker"] for r in ranking["rows"]] == ["AAA", "BBB"]
    assert all(list(r) == [*row, *PREVIOUS] for r in ranking["rows"])

    ticker = client.get("/api/tickers/AAA", auth=AUTH).json()
    assert [p["as_of"] for p in ticker["history"]] == ["2026-11-25", "2026-11-26"]
    assert all(list(p) == [*NIGHT, *row] for p in [*ticker["history"], ticker["last_good"]])

    cli = run_cli("ranking", "--format", "json")
    assert cli.code == 0, cli.stderr
    rows = json.loads(cli.stdout)["rows"]
    assert [r["ticker"] for r in rows] == ["AAA", "BBB", "CCC"]
    assert all(list(r) == [*row, *PREVIOUS] for r in rows)
