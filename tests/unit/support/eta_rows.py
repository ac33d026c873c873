"""Rows for the ETA's tests: a batch of 17-node tickers, calls of a known cost and latency,
and the servers' generation counter at a known rate (the expected figures follow from these)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from agents.graph import sequential_nodes
from agents.nodes import ANALYSTS
from app.db.models import Batch, LLMCall, ServerSample, TickerRun

T0 = datetime(2026, 12, 3, 1, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=10)
CHAIN = sequential_nodes(2, 2)  # 13 nodes one after another, after the 4 analysts
NODES = [*ANALYSTS, *CHAIN]
COST = 100
LATENCY_S = 4.0
SETTINGS = {"debate_rounds": 2, "risk_rounds": 2, "samples": 1, "model": "tiny"}


def batch(engine: Engine, tickers: dict[str, str], status: str = "running",
          model: str = "tiny") -> int:
    with Session(engine) as s:
        row = Batch(kind="nightly", as_of=T0.date(), status=status, created_at=T0,
                    started_at=T0, heartbeat_at=NOW, settings={**SETTINGS, "model": model},
                    tickers_total=len(tickers))
        s.add(row)
        s.flush()
        for ticker, status in tickers.items():
            s.add(TickerRun(batch_id=row.id, ticker=ticker, status=status, samples=1,
                            started_at=None if status == "queued" else T0))
        s.commit()
        return int(row.id)


def calls(engine: Engine, batch_id: int, ticker: str, nodes: list[str], *,
          end: datetime = NOW, tokens: int = COST, status: str = "ok") -> None:
    """Store one call per node, each ``LATENCY_S`` long, the last ending at ``end``."""
    with Session(engine) as s:
        for i, node in enumerate(reversed(nodes)):
            ended = end - timedelta(seconds=i * LATENCY_S)
            s.add(LLMCall(batch_id=batch_id, ticker=ticker, node=node, sample=0, model="m",
                          completion_tokens=tokens, status=status,
                          ready_at=ended - timedelta(seconds=LATENCY_S),
                          started_at=ended - timedelta(seconds=LATENCY_S / 2),
                          ended_at=ended, latency_s=LATENCY_S / 2))
        s.commit()


def counter(engine: Engine, batch_id: int, rates: list[float], every_s: float = 30.0,
            now: datetime = NOW) -> None:
    """Store /metrics readings over the last 2 minutes: ``rates[i]`` tok/s in the i-th 30 s."""
    total = 0.0
    with Session(engine) as s:
        start = now - timedelta(seconds=every_s * len(rates))
        for i, rate in enumerate([0.0, *rates]):
            total += rate * every_s
            s.add(ServerSample(batch_id=batch_id, sampled_at=start + timedelta(
                seconds=i * every_s), running=1, waiting=0, kv_cache_usage=0.1,
                preemptions_total=0, prompt_tokens_total=0, generation_tokens_total=total))
        s.commit()


def night(engine: Engine, tickers: int, latency_s: dict[str, float], start: datetime,
          status: str = "succeeded") -> tuple[int, datetime]:
    """Store a whole night of ``tickers`` tickers from ``start``, all at once: each one's
    analysts side by side, then its chain's nodes one after another, each call ready
    ``latency_s[node]`` before its answer and issued half-way; return its id and its end.
    Read at an earlier moment, it is that night running (a call counts once it has ended)."""
    with Session(engine) as s:
        row = Batch(kind="nightly", as_of=T0.date(), status=status, created_at=start,
                    started_at=start, heartbeat_at=start, settings=SETTINGS,
                    tickers_total=tickers)
        s.add(row)
        s.flush()
        end = start
        for i in range(tickers):
            ticker, at = f"T{i:02d}", start
            for step in [list(ANALYSTS), *([n] for n in CHAIN)]:
                ready = at
                for node in step:
                    ended = ready + timedelta(seconds=latency_s[node])
                    s.add(LLMCall(batch_id=row.id, ticker=ticker, node=node, sample=0,
                                  model="m", completion_tokens=COST, status="ok",
                                  ready_at=ready, ended_at=ended, latency_s=latency_s[node] / 2,
                                  started_at=ended - timedelta(seconds=latency_s[node] / 2)))
                    at = max(at, ended)
            s.add(TickerRun(batch_id=row.id, ticker=ticker, status="succeeded", samples=1,
                            started_at=start, finished_at=at))
            end = max(end, at)
        row.finished_at = end
        s.commit()
        return int(row.id), end
