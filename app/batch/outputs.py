"""Keep every node's text of a finished ticker, so the ticker page can show what each node said."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, Table

from agents.graph import TickerResult
from app.db.models import NodeText
from app.db.retry import retried
from app.usage import insert_ignoring_duplicates

TABLE: Table = NodeText.__table__  # type: ignore[assignment]


def output_rows(batch_id: int, results: Iterable[TickerResult]) -> list[dict[str, Any]]:
    """Return one row per (sample, node), numbered in the graph's dependency order."""
    at = datetime.now(UTC)
    return [
        {"batch_id": batch_id, "ticker": result.ticker, "sample": result.sample, "node": node,
         "position": position, "text": out.text, "prompt_tokens": out.prompt_tokens,
         "completion_tokens": out.completion_tokens, "finish_reason": out.finish_reason,
         "attempts": out.attempts, "created_at": at}
        for result in results
        for position, (node, out) in enumerate(result.outputs.items())
    ]


@retried
def record_outputs(engine: Engine, batch_id: int, results: list[TickerResult]) -> None:
    """Store the node texts of a ticker's samples; a repeated store (a resume) adds nothing."""
    insert_ignoring_duplicates(engine, TABLE, output_rows(batch_id, results))
