"""Render the HTML pages: ranking, ticker (with Rerun), batches, one batch, arms compared."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel

from app.morning import nightstatus, views
from app.morning.accounting import COMPARE_COLUMNS
from app.morning.summary import Seen
from app.web import charts
from app.web.auth import CSRF_FIELD
from app.web.plots import batch_plots, compare_plots
from app.web.reruns import RerunJob
from app.web.state import State, WebState, require_user
from app.web.symbols import batch_id_or_404, batch_ids, symbol_or_404
from app.web.templating import make_templates

router = APIRouter(dependencies=[Depends(require_user)], default_response_class=HTMLResponse)
templates = make_templates()


class RerunState(BaseModel):
    """The ticker page's Rerun box: this process's job and the rerun the database says runs."""

    job: RerunJob | None
    running_batch: views.RerunRow | None
    active: bool


def _page(request: Request, name: str, context: dict[str, Any]) -> Response:
    """Render a template; a model in the context is given to it as its JSON, so a page shows
    what ``/api/…`` serves (dates and times as ISO 8601 text)."""
    plain = {key: value.model_dump(mode="json") if isinstance(value, BaseModel) else value
             for key, value in context.items()}
    return templates.TemplateResponse(request, name, plain)


@router.get("/")
def ranking_page(request: Request, state: State) -> Response:
    """Show the latest finished night's ranking, with reruns applied, and any batch running."""
    view = views.ranking_view(state.engine, state.settings)
    chart = charts.rating_bars(view.distribution) if view.batch else None
    return _page(request, "ranking.html", {"view": view, "chart": chart})


def rerun_target(state: WebState, ticker: str, view: views.TickerView) -> tuple[date, int]:
    """Return the as-of date and sample count a rerun of ``ticker`` should use.

    The night on the ranking page, when the ticker is in it, so the rerun replaces the
    ticker there; otherwise the night of the ticker's latest run.
    """
    ranked = views.ranking_view(state.engine, state.settings)
    batch = ranked.batch
    tickers = {r.ticker for r in ranked.rows} | {f.ticker for f in ranked.failed}
    if batch is not None and ticker in tickers:
        return batch.as_of, int(batch.samples or 1)
    shown = view.shown
    return shown.as_of, int(shown.samples or 1)


@router.get("/ticker/{symbol}")
def ticker_page(request: Request, state: State, symbol: str,
                notice: Annotated[str | None, Query()] = None) -> Response:
    """Show the latest run's nodes in graph order, the history plot and the Rerun button."""
    ticker = symbol_or_404(symbol)
    view = views.ticker_view(state.engine, ticker, state.stale_after_s)
    history = view.history
    plot = charts.history([(p.as_of, p.score, p.rating or "")
                           for p in history if p.score is not None]) \
        if any(p.score is not None for p in history) else None
    # What this process started, and what the database says is running.
    running = view.rerun_running
    rerun = RerunState(job=state.reruns.job(ticker), running_batch=running,
                       active=state.reruns.active(ticker) is not None or running is not None)
    token = state.guard.csrf_token(request)
    response = _page(request, "ticker.html", {
        "view": view, "history_svg": plot, "rerun": rerun, "notice": notice,
        "csrf_field": CSRF_FIELD, "csrf_token": token,
    })
    state.guard.remember(response, token)
    return response


@router.post("/ticker/{symbol}/rerun")
async def rerun(request: Request, state: State, symbol: str,
                token: Annotated[str | None, Form(alias=CSRF_FIELD)] = None) -> Response:
    """Queue a rerun of one ticker, unless one is queued or running already."""
    state.guard.check_csrf(request, token)
    ticker = symbol_or_404(symbol)
    view = await run_in_threadpool(views.ticker_view, state.engine, ticker,
                                   state.stale_after_s)
    back = f"/ticker/{ticker}"
    if view.rerun_running is not None:
        return RedirectResponse(f"{back}?notice=already", status_code=303)
    as_of, samples = await run_in_threadpool(rerun_target, state, ticker, view)
    # No await between the check above and here would let a second request in: submit
    # itself refuses a ticker whose rerun is queued or running in this process.
    _, created = state.reruns.submit(ticker, as_of, samples)
    return RedirectResponse(f"{back}?notice={'queued' if created else 'already'}",
                            status_code=303)


@router.get("/batches")
def batches_page(request: Request, state: State) -> Response:
    """List the batches, newest first, with a form to compare arms; with none, what the
    morning's status advises (the first night); with some, the refusal it names, if one
    stands (a refused night has no row to list)."""
    seen = Seen(state.engine)  # one read of the lock and of each batch's last call
    found = views.batches_view(state.engine, state.stale_after_s, seen=seen)
    night = nightstatus.night_status(state.engine, state.settings, None, seen=seen)
    refused = None if night.refused is None else nightstatus.refusal_line(night.refused)
    return _page(request, "batches.html", {
        "batches": [b.model_dump(mode="json") for b in found], "night": night,
        "refused": refused if found else None})


@router.get("/batches/compare")
def compare_page(request: Request, state: State,
                 ids: Annotated[list[str], Query()]) -> Response:
    """Show arms side by side, as ``nightdesk report --compare`` does, with their plots."""
    view = views.compare_view(state.engine, batch_ids(ids))
    # The CLI's columns, less batch and label, which head the table's columns here.
    return _page(request, "compare.html", {"view": view, "plots": compare_plots(view),
                                           "columns": COMPARE_COLUMNS[2:]})


@router.get("/batches/{batch_id}")
def batch_page(request: Request, state: State, batch_id: str) -> Response:
    """Show one batch's report: throughput, the server's gauges over time, latency, failures."""
    view = views.batch_view(state.engine, batch_id_or_404(batch_id), state.stale_after_s)
    return _page(request, "batch.html", {"view": view, "plots": batch_plots(view)})
