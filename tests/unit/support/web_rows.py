"""Fill a database with two constructed nights, a rerun, and a night still running.

Night 1 (2026-11-26, batch ``night1``) finished: AAA Buy +0.80, BBB Hold (two samples,
+0.10 and −0.10), CCC failed. Rerun ``rerun`` of the same date then rated BBB Sell −0.60.
Night 2 (2026-11-27, batch ``night2``) is still running: AAA already decided Sell −0.90,
BBB queued. Only night 1, with the rerun, may show on the ranking.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from agents.graph import node_names
from app.config import load_settings
from app.db.models import Batch, Decision, LLMCall, NodeText, ServerSample, TickerRun

D1 = date(2026, 11, 26)
D2 = date(2026, 11, 27)
T0 = datetime(2026, 11, 27, 0, 10, tzinfo=UTC)
SETTINGS = {"model": "tiny", "server_profile": "cpu-tiny", "debate_rounds": 2,
            "risk_rounds": 2, "samples": 2, "strategy": "adaptive", "demo_data": True}
# (seconds after T0, running, waiting, kv usage, generation tokens counter)
SAMPLES = [(0, 1, 0, 0.10, 1000), (2, 4, 1, 0.35, 1100), (4, 6, 3, 0.80, 1400),
           (6, 3, 0, 0.50, 1500)]


@dataclass
class Ids:
    night1: int
    rerun: int
    night2: int
    night0: int


def _batch(session: Session, kind: str, as_of: date, status: str, start: datetime,
           finished: datetime | None, total: int, ok: int, failed: int) -> Batch:
    batch = Batch(kind=kind, as_of=as_of, status=status, created_at=start, started_at=start,
                  finished_at=finished, heartbeat_at=finished or start, settings=SETTINGS,
                  tickers_total=total, tickers_succeeded=ok, tickers_failed=failed)
    session.add(batch)
    session.flush()
    return batch


def _decision(session: Session, batch: Batch, ticker: str, sample: int, rating: str,
              score: float, summary: str) -> None:
    session.add(Decision(batch_id=batch.id, ticker=ticker, sample=sample, rating=rating,
                         score=score, confidence=0.6, summary=summary, created_at=T0))


def _run(session: Session, batch: Batch, ticker: str, status: str,
         error: str | None = None) -> None:
    session.add(TickerRun(batch_id=batch.id, ticker=ticker, status=status, samples=2,
                          started_at=T0, finished_at=T0 if status != "running" else None,
                          error=error))


def fill(engine: Engine, *, night2_heartbeat: datetime | None = None) -> Ids:
    """Insert the rows described in the module docstring and return the batch ids."""
    names = node_names(load_settings().pipeline())
    with Session(engine) as s:
        # An older night, so the history has two points for AAA.
        night0 = _batch(s, "nightly", D1 - timedelta(days=1), "succeeded",
                        T0 - timedelta(days=2), T0 - timedelta(days=2, minutes=-30), 1, 1, 0)
        _run(s, night0, "AAA", "succeeded")
        _decision(s, night0, "AAA", 0, "Hold", 0.05, "AAA flat")

        night1 = _batch(s, "nightly", D1, "succeeded", T0 - timedelta(days=1),
                        T0 - timedelta(days=1, minutes=-40), 3, 2, 1)
        _run(s, night1, "AAA", "succeeded")
        _run(s, night1, "BBB", "succeeded")
        _run(s, night1, "CCC", "failed", "LLMTimeoutError: no answer within 300 s")
        _decision(s, night1, "AAA", 0, "Buy", 0.80, "AAA strong demand")
        _decision(s, night1, "AAA", 1, "Buy", 0.80, "AAA strong demand again")
        _decision(s, night1, "BBB", 0, "Hold", 0.10, "BBB mixed")
        _decision(s, night1, "BBB", 1, "Hold", -0.10, "BBB mixed too")
        for position, node in enumerate(names):
            s.add(NodeText(batch_id=night1.id, ticker="AAA", sample=0, node=node,
                           position=position, text=f"{node} says AAA <b>looks</b> fine",
                           prompt_tokens=100 + position, completion_tokens=10 + position,
                           finish_reason="stop", attempts=1, created_at=T0))
            start = T0 - timedelta(days=1) + timedelta(seconds=position)
            s.add(LLMCall(batch_id=night1.id, ticker="AAA", node=node, sample=0, attempt=1,
                          model="tiny", prompt_tokens=100 + position,
                          completion_tokens=10 + position, status="ok", started_at=start,
                          first_token_at=start + timedelta(seconds=0.2),
                          ended_at=start + timedelta(seconds=1.5), latency_s=1.5))
        for at, running, waiting, kv, gen in SAMPLES:
            s.add(ServerSample(batch_id=night1.id,
                               sampled_at=T0 - timedelta(days=1) + timedelta(seconds=at),
                               running=running, waiting=waiting, kv_cache_usage=kv,
                               preemptions_total=0, prompt_tokens_total=0,
                               generation_tokens_total=gen))

        rerun = _batch(s, "rerun", D1, "succeeded", T0 - timedelta(hours=5),
                       T0 - timedelta(hours=4), 1, 1, 0)
        _run(s, rerun, "BBB", "succeeded")
        _decision(s, rerun, "BBB", 0, "Sell", -0.60, "BBB guidance cut")

        night2 = _batch(s, "nightly", D2, "running", T0, None, 2, 1, 0)
        night2.heartbeat_at = night2_heartbeat or datetime.now(UTC)
        night2.finished_at = None
        _run(s, night2, "AAA", "succeeded")
        _run(s, night2, "BBB", "running")
        _decision(s, night2, "AAA", 0, "Sell", -0.90, "AAA tonight: collapse")
        s.commit()
        return Ids(night1.id, rerun.id, night2.id, night0.id)
