"""A dead night ends when it was last alive on every surface, every field: before any command
marks its row (it reads crashed, its row still says running) and after, the same end
(``finished_at``), the same duration, and an error naming that same moment.

Its last sign of life is the later of its last heartbeat and its last call's end, as the
status rule weighs them (``Seen.last_alive``); docs/lab/2026-12-07-left-alone-4.md has the
faults this guards against (the end None in the API, the error naming an older heartbeat).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select

from app.config import load_settings
from app.db.models import Batch
from app.morning.nightstatus import span
from app.morning.summary import DIED, list_batches, when
from app.runs.resumable import mark_orphaned, mark_stale_crashed
from tests.unit.support.clirun import run_cli
from tests.unit.support.night_rows import ELSEWHERE, Rated, add_night, run_by
from tests.unit.support.surfaces import every_end
from tests.unit.support.webclient import AUTH

STALE_S = 120.0  # heartbeat_stale_s, the default the CLI and the pages read


def _dead_night(engine: Engine, beat_ago_s: float, call_ago_s: float, kind: str = "nightly"
                ) -> tuple[int, datetime]:
    """A batch (``kind``) run elsewhere (its pid cannot be looked up), started 20 min ago, AAA
    done and BBB running, its last heartbeat and its last call's end that long ago; return it
    and its start."""
    now = datetime.now(UTC).replace(microsecond=0)
    start = now - timedelta(minutes=20)
    night = add_night(engine, now.date(), start,
                      {"AAA": Rated(status="succeeded"), "BBB": Rated(status="running")},
                      status="running", heartbeat=now - timedelta(seconds=beat_ago_s),
                      kind=kind, settings=run_by(ELSEWHERE),
                      last_call=("BBB", now - timedelta(seconds=call_ago_s)))
    return night, start


@pytest.mark.parametrize(("beat_ago_s", "call_ago_s"), [(900, 600), (600, 900)],
                         ids=["a call after its last heartbeat", "its heartbeat last"])
def test_a_dead_night_ends_when_last_alive_on_every_surface_before_and_after_it_is_marked(
        sqlite_engine: Engine, client: TestClient, cli_env: None, beat_ago_s: float,
        call_ago_s: float) -> None:
    night, start = _dead_night(sqlite_engine, beat_ago_s, call_ago_s)
    end = start + timedelta(minutes=20, seconds=-min(beat_ago_s, call_ago_s))
    duration = round((end - start).total_seconds())
    error = f"no sign of life since {when(end)}: its process has died"
    fields = (end, duration, error)
    expected = {"batches": fields, "api": fields, "api batches": fields,
                "api ranking": fields, "night": fields, "cli batches json": fields,
                "cli batches csv": fields, "cli report": fields,
                "batch page": (f"{end:%Y-%m-%d %H:%M:%S} UTC", error),
                "digest": (span(duration), error), "cli batches table": (span(duration),),
                "metrics": (duration,)}
    # Read crashed, its row not marked: no command has written it.
    unmarked = every_end(sqlite_engine, client, night, load_settings())
    assert unmarked == expected
    # `report` (inside every_end) marked it: the row ends where every view ended it.
    with sqlite_engine.connect() as conn:
        row = conn.execute(select(Batch.status, Batch.finished_at).where(Batch.id == night)).one()
    assert row.status == "crashed" and row.finished_at.replace(tzinfo=UTC) == end
    assert every_end(sqlite_engine, client, night, load_settings()) == expected



def test_a_start_that_marks_a_dead_night_stores_what_every_view_said_of_it(
        sqlite_engine: Engine) -> None:
    # The next start marks the night under the nightly lock (``mark_orphaned``): its stored
    # reason and end are those the views gave it before, not "the nightly lock was free".
    night, start = _dead_night(sqlite_engine, beat_ago_s=900, call_ago_s=600)
    [before] = list_batches(sqlite_engine, STALE_S)
    assert mark_orphaned(sqlite_engine, STALE_S) == [night]
    [after] = list_batches(sqlite_engine, STALE_S)
    assert (after.status, after.finished_at, after.duration_s, after.error) == \
        ("crashed", before.finished_at, before.duration_s, before.error)
    assert before.finished_at == start + timedelta(minutes=10)


def test_a_dead_nights_unfinished_ticker_reads_the_same_on_the_ticker_page_marked_or_not(
        sqlite_engine: Engine, client: TestClient, cli_env: None) -> None:
    # A dead night and a dead rerun after it, each left BBB running: the ticker's page reads
    # it as `report` marks it (interrupted, its process died), before the mark as after.
    night, _ = _dead_night(sqlite_engine, beat_ago_s=900, call_ago_s=600)
    rerun, _ = _dead_night(sqlite_engine, beat_ago_s=900, call_ago_s=600, kind="rerun")

    def said() -> dict[str, object]:
        page = client.get("/api/tickers/BBB", auth=AUTH).json()
        return {"latest": (page["latest"]["status"], page["latest"]["error"]),
                "tonight": (page["tonight"]["state"], page["tonight"]["error"]),
                "rerun": [(r["status"], r["error"]) for r in page["reruns"]],
                "shown": page["shown"]["ticker_status"]}

    unmarked = said()
    assert unmarked == {"latest": ("interrupted", DIED), "tonight": ("interrupted", DIED),
                        "rerun": [("interrupted", DIED)], "shown": "interrupted"}
    assert run_cli("report", str(night)).code == 0  # marks both
    assert mark_stale_crashed(sqlite_engine, STALE_S) == []
    with sqlite_engine.connect() as conn:
        assert set(conn.execute(select(Batch.status)).scalars()) == {"crashed"}
    assert said() == unmarked
    assert rerun > night
