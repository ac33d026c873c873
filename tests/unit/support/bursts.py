"""The burst scenarios of the fault suite, run on SQLite (test_bursts.py) and PostgreSQL
(tests/integration/test_faults_postgres.py).

A burst is ``count`` HTTP 429 or 503 answers in a row among a two-ticker night's chat
requests: at its start, in its middle (request 17 of 34), or from the portfolio manager's
first request (the last node), with or without ``Retry-After``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine
from typer.testing import CliRunner

from agents.data.demo import DEMO_AS_OF, demo_tickers
from app.batch.engine import BatchPlan
from app.cli import app as cli
from tests.fakevllm import FakeServer
from tests.unit.support.fault_night import (
    NODES,
    QUICK_ENV,
    assert_rows_match_the_servers,
    night_engine,
    serve_cli_from,
    ticker_states,
)

TICKERS = demo_tickers(2)
WHERE = {"start": {"at": 0}, "middle": {"at": 17}, "manager": {"node": "portfolio_manager"}}


@dataclass(frozen=True)
class Burst:
    status: int
    count: int
    where: str
    retry_after: str | None = None

    def __str__(self) -> str:
        after = "" if self.retry_after is None else f"-retry-after-{self.retry_after}"
        return f"{self.status}x{self.count}-{self.where}{after}"

    def on(self, server: FakeServer) -> FakeServer:
        server.burst(self.status, self.count, retry_after=self.retry_after,
                     **WHERE[self.where])  # type: ignore[arg-type]
        return server


# Within the outage budget: every ticker succeeds in the night itself.
WAITED_OUT = [
    Burst(503, 1, "start"), Burst(429, 1, "middle", "1"),
    Burst(503, 16, "start"),  # the issue's: 16 x 503 at the start of the night
    Burst(429, 16, "start", "1"),  # the issue's: 429 + Retry-After: 1
    Burst(429, 30, "middle"), Burst(503, 30, "middle", "1"),
    Burst(503, 8, "manager", "0"), Burst(429, 30, "manager", "1"),
]
# Past a budget of 0.2 s: the night stops resumable, one `run --resume` finishes it.
PAST_THE_BUDGET = [Burst(503, 30, "start", "1"), Burst(429, 30, "manager")]


async def waited_out(db: Engine, demo_dir: Path, burst: Burst) -> None:
    server = burst.on(FakeServer(nodes=NODES, tickers=TICKERS))
    outcome = await night_engine(db, demo_dir, server).run(
        BatchPlan("nightly", DEMO_AS_OF, TICKERS))
    assert outcome.status == "succeeded", outcome.failed
    assert server.burst_answers == burst.count  # the whole burst was met
    assert ticker_states(db, outcome.batch_id) == dict.fromkeys(TICKERS, ("succeeded", None))
    assert_rows_match_the_servers(db, outcome.batch_id, [server])


def past_the_budget(db: Engine, demo_dir: Path, burst: Burst,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Run it (outside any event loop: the resume is the command line's own)."""
    server = burst.on(FakeServer(nodes=NODES, tickers=TICKERS))
    outcome = asyncio.run(night_engine(db, demo_dir, server, outage_budget_s=0.2).run(
        BatchPlan("nightly", DEMO_AS_OF, TICKERS)))
    assert outcome.status == "interrupted" and not outcome.failed
    assert outcome.halt is not None and outcome.halt.exit_code == 5
    assert f"HTTP {burst.status} (busy)" in outcome.halt.message
    assert f"`nightdesk run --resume {outcome.batch_id}`" in outcome.halt.message
    states = ticker_states(db, outcome.batch_id)
    assert "failed" not in {status for status, _ in states.values()}
    assert ("interrupted", None) in states.values()
    # The server is itself again: one resume, from the command line, finishes the night.
    healthy = FakeServer(nodes=NODES, tickers=TICKERS)
    serve_cli_from(monkeypatch, healthy, demo_dir)
    url = db.url.render_as_string(hide_password=False)
    result = CliRunner().invoke(cli, ["run", "--resume", str(outcome.batch_id),
                                      "--no-preflight"],
                                env={**QUICK_ENV, "NIGHTDESK_DATABASE_URL": url})
    assert result.exit_code == 0, result.output
    assert f"resuming batch {outcome.batch_id} (nightly, interrupted" in result.stderr
    assert ticker_states(db, outcome.batch_id) == dict.fromkeys(TICKERS, ("succeeded", None))
    assert_rows_match_the_servers(db, outcome.batch_id, [server, healthy])
