"""The Track record page: every night's rank IC per horizon, its running mean and verdict."""

from __future__ import annotations

from datetime import date
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from app.config import get_settings
from app.errors import InputError
from app.quality.track import (
    DEFAULT_HORIZONS,
    parse_horizons,
    providers,
    running_mean,
    track_nights,
    track_report,
)
from app.web import charts
from app.web.pages import templates
from app.web.state import State, require_user
from app.web.symbols import or_answer

router = APIRouter(dependencies=[Depends(require_user)], default_response_class=HTMLResponse)
DEFAULT_NIGHTS = 250  # about a year of sessions: every figure is recomputed per request


@router.get("/track")
def track_page(request: Request, state: State,
               nights: Annotated[int, Query(ge=1, le=5000)] = DEFAULT_NIGHTS,
               horizon: str = DEFAULT_HORIZONS) -> Response:
    """Show the track record of the last ``nights`` nights at each horizon."""
    days = or_answer(400, lambda: parse_horizons(horizon))
    settings = get_settings()
    try:
        ids = track_nights(state.engine, nights=nights)
    except InputError:
        ids = []
    # 400 when the configured benchmark has no prices at all.
    report = or_answer(400, lambda: track_report(
        state.engine, ids, days, providers(settings),
        benchmark=settings.quality.benchmark)) if ids else None
    plots = {}
    for record in report.horizons if report else []:
        points = running_mean(record)
        plots[record.horizon_days] = charts.ic_track(
            [date.fromisoformat(p.as_of) for p in points], [p.ic for p in points],
            [p.mean for p in points], [p.low for p in points], [p.high for p in points],
            chart_id=f"track-{record.horizon_days}d") if points else None
    return templates.TemplateResponse(request, "track.html", {
        "report": report, "plots": plots, "nights": nights, "horizon": horizon})
