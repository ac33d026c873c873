"""Build nights row by row for the morning's tests: ratings, failures, node texts, timings.

``add_night`` writes one nightly batch as the engine leaves it (batch row, ticker runs,
decisions, node outputs); the tests and the browser test state every expected value from
the arguments they pass, never from the code under test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from agents.data.demo import DEMO_AS_OF
from agents.graph import sequential_nodes
from agents.nodes import ANALYSTS
from app.batch import store
from app.db.batchsettings import BatchSettings
from app.db.models import Batch, Decision, LLMCall, NodeText, TickerRun

SETTINGS = {"model": "tiny", "server_profile": "cpu-tiny", "debate_rounds": 2,
            "risk_rounds": 2, "samples": 1, "strategy": "adaptive", "demo_data": True}
NODES = 17  # 4 analysts, 2 debate rounds of 2, research manager, trader, 2 risk rounds of 3, PM
PIPELINE = [*ANALYSTS, *sequential_nodes(2, 2)]
# A runner on another host: its pid cannot be looked up from here, nor SQLite's lock read.
ELSEWHERE = {"host": "elsewhere", "pid": 1, "started": None}


def run_by(runner: dict[str, object]) -> dict[str, object]:
    """Return the settings of a night run by ``runner`` (a ``Runner``'s fields), beating
    every 30 s."""
    return {"runner": runner, "model": "tiny", "samples": 1, "heartbeat_interval_s": 30.0}


def table(**stances: str) -> str:
    """Return an analyst-style closing table: one row per observation and its stance."""
    return "| observation | stance |\n|---|---|\n" + "\n".join(
        f"| {name} | {value} |" for name, value in stances.items())


@dataclass
class Rated:
    """One ticker's result: a rating and score, or an error (then it failed)."""

    rating: str | None = None
    score: float | None = None
    error: str | None = None
    status: str | None = None  # default: succeeded when rated, else failed
    texts: dict[str, str] = field(default_factory=dict)  # node → text


def add_night(engine: Engine, as_of: date, created: datetime, tickers: dict[str, Rated], *,
              status: str | None = None, minutes: float = 40.0, error: str | None = None,
              heartbeat: datetime | None = None, kind: str = "nightly",
              settings: dict[str, object] | None = None, calls: int = 0,
              last_call: tuple[str, datetime] | None = None) -> int:
    """Insert one batch with its tickers; return its id. ``status`` None: from the tickers
    (one rated, or stated ``succeeded``, succeeded). ``last_call`` (ticker, end): one more
    answered call, that ticker's market analyst's, 2 s long."""
    ok = sum(1 for r in tickers.values()
             if r.rating is not None or r.status == "succeeded")
    failed = sum(1 for r in tickers.values()
                 if r.rating is None and (r.status or "failed") == "failed")
    if status is None:
        status = "succeeded" if ok == len(tickers) else "partial" if ok else "failed"
    finished = None if status == "running" else created + timedelta(minutes=minutes)
    with Session(engine) as s:
        batch = Batch(kind=kind, as_of=as_of, status=status, created_at=created,
                      started_at=created, finished_at=finished,
                      heartbeat_at=heartbeat or finished or created,
                      settings=settings or SETTINGS, tickers_total=len(tickers),
                      tickers_succeeded=ok, tickers_failed=failed, error=error)
        s.add(batch)
        s.flush()
        for ticker, r in tickers.items():
            run_status = r.status or ("succeeded" if r.rating is not None else "failed")
            s.add(TickerRun(batch_id=batch.id, ticker=ticker, status=run_status, samples=1,
                            started_at=created if run_status != "queued" else None,
                            finished_at=finished if run_status in ("succeeded", "failed")
                            else None, error=r.error))
            if r.rating is not None and r.score is not None:
                s.add(Decision(batch_id=batch.id, ticker=ticker, sample=0, rating=r.rating,
                               score=r.score, confidence=0.6,
                               summary=f"{ticker} {r.rating} on {as_of}", created_at=created))
            for position, (node, text) in enumerate(r.texts.items()):
                s.add(NodeText(batch_id=batch.id, ticker=ticker, sample=0, node=node,
                               position=position, text=text, prompt_tokens=100,
                               completion_tokens=10, finish_reason="stop", attempts=1,
                               created_at=created))
        # ``calls`` answered calls: the tickers' nodes in order, one a second for 1 s each.
        for i in range(calls):
            start = created + timedelta(seconds=i)
            s.add(LLMCall(batch_id=batch.id, ticker=list(tickers)[i // NODES],
                          node=PIPELINE[i % NODES], sample=0, model="tiny", prompt_tokens=10,
                          completion_tokens=5, status="ok", started_at=start,
                          ended_at=start + timedelta(seconds=1), latency_s=1.0))
        if last_call is not None:
            ticker, ended = last_call
            s.add(LLMCall(batch_id=batch.id, ticker=ticker, node="market_analyst",
                          model="tiny", status="ok", started_at=ended - timedelta(seconds=2),
                          ended_at=ended, latency_s=2.0))
        s.commit()
        return int(batch.id)


def at(day: date, hour: int, minute: int = 0) -> datetime:
    """Return a UTC instant on ``day``."""
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=UTC)


def add_resumed_calls(engine: Engine, batch_id: int, start: datetime) -> None:
    """Store a resumed night's calls: 100 s of work from ``start``, 2 hours stopped, 100 s
    more; two overlapping calls of 4,000 output tokens in each run (16,000 in 200 s)."""
    with Session(engine) as s:
        for run_s in (0, 7_300):
            for node, (a, b) in (("market", (0, 100)), ("news", (20, 80))):
                s.add(LLMCall(batch_id=batch_id, ticker="AAA", node=node, sample=0,
                              model="tiny", prompt_tokens=10, completion_tokens=4_000,
                              status="ok", started_at=start + timedelta(seconds=run_s + a),
                              ended_at=start + timedelta(seconds=run_s + b),
                              latency_s=b - a))
        s.commit()


def dead_night(db: Engine, done: str, left: str) -> int:
    """Write tonight's batch as its killed process left it: still "running", ``done``
    stored, ``left`` not begun; no one holds the nightly lock. Return its id."""
    dead = store.create_batch(db, kind="nightly", as_of=DEMO_AS_OF, tickers=[done, left],
                              samples=1, settings=BatchSettings(samples=1, strategy="adaptive"),
                              server_facts=None)
    store.ticker_finished(db, dead, done, [store.DecisionRow(
        done, 0, "Hold", 0.0, 0.5, "stored before the crash")], None)
    return dead
