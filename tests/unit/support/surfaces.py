"""A night's status as every surface gives it: the views, the pages' API, /metrics, the
CLI's `batches` and `report`, the digest, and the row as stored (``report`` marks a dead
night's row, never a live one's)."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient
from sqlalchemy import Engine, select

from app.config import Settings
from app.db.models import Batch, TickerRun
from app.morning import nightstatus
from app.morning.advice import running_night
from app.morning.digest import build_digest
from app.morning.summary import list_batches
from app.web.views import batch_view, running_batches, ticker_view
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
