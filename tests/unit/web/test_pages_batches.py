"""`/batches` and `nightdesk batches` list the batches and name a refusal the night's status
stands on: one request, one reading of what lies beyond the rows (``Seen``: the nightly
lock, each batch's last call), so the list and the status read one moment alike."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, event

from tests.unit.support.clirun import run_cli
from tests.unit.support.eta_rows import NODES, batch, calls
from tests.unit.support.webclient import AUTH


@contextmanager
def last_call_reads() -> Iterator[list[str]]:
    """Collect the statements, on any engine, that read batches' last calls
    (``summary.last_calls``)."""
    seen: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "max(llm_calls.ended_at)" in statement:
            seen.append(statement)

    event.listen(Engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", note)


def test_the_batches_list_and_its_status_read_a_running_nights_last_call_once(
        sqlite_engine: Engine, client: TestClient) -> None:
    night = batch(sqlite_engine, {"AAA": "running", "BBB": "queued"})
    calls(sqlite_engine, night, "AAA", NODES[:4])
    with last_call_reads() as reads:
        page = client.get("/batches", auth=AUTH)
    assert page.status_code == 200 and f"#{night}" in page.text
    assert len(reads) == 1  # was 2: the list's and the night's status's own
    with last_call_reads() as reads:
        done = run_cli("batches")
    assert done.code == 0 and len(reads) == 1, done.stderr
