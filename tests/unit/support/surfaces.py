"""A night's status as every surface gives it: the views, the pages' API, /metrics, the
CLI's `batches` and `report`, the digest, and the row as stored (``report`` marks a dead
night's row, never a live one's)."""

from __future__ import annotations

import csv
import html
import io
import json
import re
from datetime import datetime
from typing import Any

from fastapi.testclient import TestClient
from pydantic_core import to_jsonable_python
from sqlalchemy import Engine, select

from app.config import Settings
from app.db.models import Batch, TickerRun
from app.morning import nightstatus
from app.morning.advice import running_night
from app.morning.digest import build_digest
from app.morning.nightstatus import span
from app.morning.summary import list_batches
from app.morning.views import batch_view, running_batches, ticker_view
from tests.unit.support.clirun import run_cli
from tests.unit.support.webclient import AUTH


def every_surface(engine: Engine, client: TestClient, night: int, settings: Settings,
                  env: dict[str, str] | None = None) -> dict[str, str]:
    """Return the status of nightly batch ``night`` (the latest night) as each surface gives
    it, read with ``settings`` (the client's and the CLI's, ``env``'s, alike)."""
    stale_s = settings.batch.heartbeat_stale_s
    with engine.connect() as conn:
        ticker = conn.execute(select(TickerRun.ticker).where(TickerRun.batch_id == night)
                              .limit(1)).scalar_one()
    said = {
        "batches": next(b.status for b in list_batches(engine, stale_s) if b.id == night),
        "night": nightstatus.night_status(engine, settings, None).status,
        "running list": "running" if night in [b.id for b in running_batches(engine, stale_s)]
        else "absent",
        "running_night": "running" if running_night(engine, stale_s) == night else "none",
        "batch page": batch_view(engine, night, stale_s).batch.status,
        "ticker page": ticker_view(engine, ticker, stale_s).latest.batch_status,
        "api": client.get(f"/api/batches/{night}", auth=AUTH).json()["batch"]["status"],
        "api batches": next(b["status"] for b in client.get("/api/batches", auth=AUTH).json()
                            if b["id"] == night),
        "api ranking": client.get("/api/ranking", auth=AUTH).json()["night"]["status"],
        # "Status: running: 0 of 2 tickers succeeded, …"
        "digest": build_digest(engine, settings, night).message.body.split(":")[1].strip(),
    }
    metrics = client.get("/metrics", auth=AUTH).text
    said["metrics"] = next(name for name in nightstatus.STATUSES
                           if f'nightdesk_night_last_status{{status="{name}"}} 1.0' in metrics)
    listed = run_cli("batches", "--format", "json", env=env)
    assert listed.code == 0, listed
    said["cli batches"] = next(b["status"] for b in json.loads(listed.stdout) if b["id"] == night)
    report = run_cli("report", str(night), "--format", "json", env=env)
    assert report.code == 0, report
    said["cli report"] = json.loads(report.stdout)["batch"]["status"]
    with engine.connect() as conn:
        said["stored"] = str(conn.execute(select(Batch.status).where(Batch.id == night))
                             .scalar_one())
    return said


def every_end(engine: Engine, client: TestClient, night: int, settings: Settings
              ) -> dict[str, tuple[object, ...]]:
    """Return how each surface ends nightly batch ``night`` (the latest night): its end
    (``finished_at``, parsed; a page's or the CLI table's as shown), its duration (seconds,
    whole; shown as ``span`` where the surface shows it so) and its error, each surface's
    fields as it gives them."""
    stale_s = settings.batch.heartbeat_stale_s

    def fields(batch: dict[str, Any]) -> tuple[object, ...]:
        end = batch["finished_at"]
        return (None if end is None else datetime.fromisoformat(end),
                None if batch["duration_s"] is None else round(batch["duration_s"]),
                batch["error"])

    listed = next(b for b in list_batches(engine, stale_s) if b.id == night)
    said: dict[str, tuple[object, ...]] = {
        "batches": fields(listed.model_dump(mode="json")),
        "api": fields(client.get(f"/api/batches/{night}", auth=AUTH).json()["batch"]),
        "api batches": fields(next(b for b in client.get("/api/batches", auth=AUTH).json()
                                   if b["id"] == night)),
        "api ranking": fields(client.get("/api/ranking", auth=AUTH).json()["night"]["latest"]),
    }
    status = nightstatus.night_status(engine, settings, None).latest
    assert status is not None
    said["night"] = fields(to_jsonable_python(status))
    for fmt in ("json", "csv"):
        out = run_cli("batches", "--format", fmt)
        assert out.code == 0, out
        rows = (json.loads(out.stdout) if fmt == "json"
                else list(csv.DictReader(io.StringIO(out.stdout))))
        row = next(b for b in rows if int(b["id"]) == night)
        said[f"cli batches {fmt}"] = fields({key: row[key] if row[key] != "" else None
                                             for key in ("finished_at", "error")}
                                            | {"duration_s": float(row["duration_s"])})
    report = run_cli("report", str(night), "--format", "json")
    assert report.code == 0, report
    said["cli report"] = fields(json.loads(report.stdout)["batch"])
    # Shown ends: the batch page's "finished …" and its error; the digest's duration and
    # status line; the CLI table's duration; /metrics' duration gauge.
    page = html.unescape(client.get(f"/batches/{night}", auth=AUTH).text)
    found = re.search(r"finished (\S+ \S+ UTC|—)", page)
    said["batch page"] = (found.group(1) if found else None,
                          listed.error if listed.error and listed.error in page else "absent")
    body = build_digest(engine, settings, night).message.body
    said["digest"] = (re.search(r"Duration: ([^;]+);", body).group(1),  # type: ignore[union-attr]
                      body.splitlines()[0].split(" — ", 1)[-1])
    table = run_cli("batches", env={"COLUMNS": "250"}).stdout
    said["cli batches table"] = next(
        (span(listed.duration_s),) for line in table.splitlines()
        if line.strip("│ ").startswith(f"{night} ") and span(listed.duration_s) in line)
    metrics = client.get("/metrics", auth=AUTH).text
    gauge = re.search(r"^nightdesk_night_duration_seconds (\S+)$", metrics, re.M)
    said["metrics"] = (None if gauge is None else round(float(gauge.group(1))),)
    return said
