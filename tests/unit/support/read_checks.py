"""The read commands run on a database they may not write, and what they must show (SQLite and
PostgreSQL tests)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from app.db.engine import get_engine
from tests.unit.support.clirun import run_cli
from tests.unit.support.web_rows import Ids

STALE = datetime(2026, 11, 27, 0, 20, tzinfo=UTC)  # night 2's last heartbeat, long ago


def read_all(url: str, ids: Ids) -> dict[str, dict[str, Any]]:
    """Run every read command on ``url`` in this process: code, stdout, stderr."""
    found = {}
    for name, argv in _reads(ids).items():
        result = run_cli(*argv, env={"NIGHTDESK_DATABASE_URL": url})
        found[name] = {"code": result.code, "stdout": result.stdout, "stderr": result.stderr}
    get_engine(url).dispose()
    return found


def check_reads(found: dict[str, dict[str, Any]], writable: dict[str, dict[str, Any]],
                ids: Ids) -> None:
    """Every read succeeded, shows fill's rows, and equals the writable copy's read."""
    for name, result in found.items():
        assert result["code"] == 0, (name, result["stderr"])
        assert "Traceback" not in result["stderr"], name
    ranking = json.loads(found["ranking"]["stdout"])
    assert ranking["batch"]["id"] == ids.night1
    assert [(r["ticker"], r["rating"]) for r in ranking["rows"]] == [
        ("AAA", "Buy"), ("BBB", "Sell"), ("CCC", None)]
    assert [b["id"] for b in json.loads(found["batches"]["stdout"])] == [
        ids.night2, ids.rerun, ids.night1, ids.night0]
    assert json.loads(found["report"]["stdout"])["calls"] == 17
    assert json.loads(found["changes"]["stdout"])["against_id"] == ids.night0
    for name in ("ranking", "report", "batches", "changes"):
        assert comparable(name, found) == comparable(name, writable), name
    # The writable copy marked night 2 crashed; a database that takes no writes keeps its
    # row, and the status (computed from the stale heartbeat, app.morning.summary) still
    # reads crashed.
    assert json.loads(writable["report newest"]["stdout"])["batch"]["status"] == "crashed"
    newest = json.loads(found["report newest"]["stdout"])
    assert newest["batch"]["id"] == ids.night2 and newest["batch"]["status"] == "crashed"
    assert "the database takes no writes now" in found["report newest"]["stderr"]


def _reads(ids: Ids) -> dict[str, list[str]]:
    # The reports last: on a writable copy the first marks night 2 crashed.
    return {"ranking": ["ranking", "--format", "json"],
            "batches": ["batches", "--format", "json"],
            "changes": ["changes", "--format", "json"],
            "report": ["report", str(ids.night1), "--format", "json"],
            "report newest": ["report", "--format", "json"]}


def comparable(name: str, reads: dict[str, dict[str, Any]]) -> Any:
    """Return a read's JSON without what depends on the clock (the night's status line)."""
    found = json.loads(reads[name]["stdout"])
    return {key: found[key] for key in ("batch", "rows")} if name == "ranking" else found
