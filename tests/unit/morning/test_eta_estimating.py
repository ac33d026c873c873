"""A first night before its first answered call has no ETA, and every face says so alike.

With no earlier finished night of its model to price the calls by, the ETA has no basis
until a call is answered. Before, the CLI's progress showed "ETA —", the ranking page, the
batch page and `nightdesk ranking` nothing at all, `/api` null: the operator could not tell
"not known yet" from "not shown". Now each says "estimating… (why)", `/api` carries the same
words, `/metrics` gives no number; and a known ETA is never shown as 0 while a call is left.
"""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import timedelta

import time_machine
from fastapi.testclient import TestClient
from rich.console import Console
from sqlalchemy import Engine

from app.morning import nightstatus
from app.morning.eta import reading
from app.recorder.progress import BatchProgress, eta_text
from tests.unit.support.clirun import run_cli
from tests.unit.support.eta_rows import NODES, NOW, batch, calls
from tests.unit.support.servers import read_servers
from tests.unit.support.webclient import AUTH

# Spelled out, not imported: the words the operator reads are what is tested.
SAYS = ("estimating… (no call answered yet, and no earlier finished night of this model to "
        "price the calls by)")


async def test_before_its_first_answer_a_first_night_is_estimating_on_every_face(
        sqlite_engine: Engine, client: TestClient) -> None:
    night = batch(sqlite_engine, {"AAA": "running", "BBB": "queued"})
    with time_machine.travel(NOW + timedelta(seconds=5), tick=False):
        prog = nightstatus.progress(sqlite_engine, night)
        assert (prog.eta_s, prog.eta_low_s, prog.estimating) == (None, None, SAYS)
        for page in ("/", f"/batches/{night}"):
            assert f"time left {SAYS}" in client.get(page, auth=AUTH).text, page
        api = client.get("/api/ranking", auth=AUTH).json()
        assert api["night"]["progress"]["estimating"] == SAYS
        assert [(r["eta_s"], r["estimating"]) for r in api["running"]] == [(None, SAYS)]
        assert "nightdesk_night_eta_seconds" not in client.get("/metrics", auth=AUTH).text
        said = run_cli("ranking", "--require-fresh", env={"COLUMNS": "300"}).stderr
        assert f"0 calls, time left {SAYS}" in said, said
        # The CLI's own progress line: before its first reading, then after it.
        shown = BatchProgress(night, 2, read_servers(), console=Console(file=io.StringIO()),
                              engine=sqlite_engine)
        assert eta_text(shown.state()) == "estimating… (first reading under way)"
        await shown.take_reading(sqlite_engine)
        assert eta_text(shown.state()) == SAYS


def test_a_known_eta_is_never_shown_as_0_while_a_call_is_left(sqlite_engine: Engine) -> None:
    night = batch(sqlite_engine, {"AAA": "running"})
    calls(sqlite_engine, night, "AAA", NODES[:-1])  # the portfolio manager's call is left
    found = replace(reading(sqlite_engine, night, NOW), eta_s=0.3)
    assert found.calls_done < found.calls_expected and found.whole(found.eta_s) == 1
    done = replace(found, calls_done=found.calls_expected, chain_left=0)
    assert done.whole(0.3) == 0  # nothing left: 0 is the truth
