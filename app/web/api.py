"""Serve the pages' data as JSON: ``/api/ranking``, ``/api/batches[/{id}]``, ``/api/tickers/…``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query

from app.errors import InputError
from app.web import views
from app.web.state import State, require_user
from app.web.symbols import batch_id_or_404, batch_ids, symbol_or_404

router = APIRouter(prefix="/api", dependencies=[Depends(require_user)])


@router.get("/ranking")
def ranking(state: State) -> dict[str, Any]:
    """Return the morning ranking, its batch, failed tickers, distribution and progress."""
    return views.ranking_view(state.engine, state.settings)


@router.get("/batches")
def batches(state: State) -> list[dict[str, Any]]:
    return views.batches_view(state.engine)


@router.get("/batches/compare")
def compare(state: State, ids: Annotated[list[str], Query()]) -> dict[str, Any]:
    try:
        return views.compare_view(state.engine, batch_ids(ids))
    except InputError as error:
        raise HTTPException(404, str(error)) from None


@router.get("/batches/{batch_id}")
def batch(state: State, batch_id: str) -> dict[str, Any]:
    try:
        return views.batch_view(state.engine, batch_id_or_404(batch_id))
    except InputError as error:
        raise HTTPException(404, str(error)) from None


@router.get("/tickers/{symbol}")
def ticker(state: State, symbol: str) -> dict[str, Any]:
    ticker = symbol_or_404(symbol)
    found = views.ticker_view(state.engine, ticker, state.stale_after_s)
    if found is None:
        raise HTTPException(404, f"{ticker} has never been run")
    job = state.reruns.job(ticker)
    return {**found, "rerun_job": job.to_json() if job else None}
