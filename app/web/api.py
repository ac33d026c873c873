"""Serve the pages' data as JSON: ``/api/ranking``, ``/api/batches[/{id}]``, ``/api/tickers/…``.

Each route's payload is a model of ``app.morning.views``; FastAPI writes it as its JSON.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from app.morning import views
from app.morning.summary import BatchSummary
from app.web.reruns import RerunJob
from app.web.state import State, require_user
from app.web.symbols import batch_id_or_404, batch_ids, symbol_or_404

router = APIRouter(prefix="/api", dependencies=[Depends(require_user)])


class TickerPayload(views.TickerView):
    """``/api/tickers/{symbol}``: the ticker page's data and this process's rerun of it."""

    rerun_job: RerunJob | None


@router.get("/ranking")
def ranking(state: State) -> views.RankingView:
    """Return the morning ranking, its batch, failed tickers, distribution and progress."""
    return views.ranking_view(state.engine, state.settings)


@router.get("/batches")
def batches(state: State) -> list[BatchSummary]:
    return views.batches_view(state.engine, state.stale_after_s)


@router.get("/batches/compare")
def compare(state: State, ids: Annotated[list[str], Query()]) -> views.CompareView:
    return views.compare_view(state.engine, batch_ids(ids))


@router.get("/batches/{batch_id}")
def batch(state: State, batch_id: str) -> views.BatchView:
    return views.batch_view(state.engine, batch_id_or_404(batch_id), state.stale_after_s)


@router.get("/tickers/{symbol}")
def ticker(state: State, symbol: str) -> TickerPayload:
    ticker = symbol_or_404(symbol)
    found = views.ticker_view(state.engine, ticker, state.stale_after_s)
    return TickerPayload(**dict(found), rerun_job=state.reruns.job(ticker))
