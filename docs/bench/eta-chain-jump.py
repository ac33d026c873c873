"""Why a replayed ETA's chain bound jumps: the slowest chain at each stored reading.

For docs/lab/2026-12-06-eta-chain-jump.md; a diagnostic, not part of the package. It replays
``app.morning.eta.reading`` at every stored reading of a fixture, records each open sample's
chain (by wrapping ``_chain_seconds`` and ``_left_of``) and prints, at each reading, the
slowest chain: its ticker and sample, the node under way, how long that step had been ready,
what ``_left_of`` priced it at (median), from how many of the node's ready-to-answer
latencies longer than its age (tonight's, the night before's) and whether the newest calls'
cap bit, the rest of the chain, and what the step and the sample really took after the
reading, and the longest any open step had been ready.
Usage: ``PYTHONPATH=$PWD .venv/bin/python docs/bench/eta-chain-jump.py NAME``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from typing import Any

from sqlalchemy import select

from app.db.engine import get_engine
from app.db.models import Base, Batch
from app.morning import eta
from tests.unit.support.eta_fixture import fixture, load

seen: list[tuple[Any, Any, Any]] = []  # (step, its chain's spread, its step under way)
priced: list[tuple[float, Any, Any]] = []


def main(name: str) -> None:
    chain_seconds, left_of = eta._chain_seconds, eta._left_of

    def spy_left(ran: float, ages: Any, took: Any, lately: Any, oldest: Any = None) -> Any:
        out = left_of(ran, ages, took, lately, oldest)
        longer = [v for values in ages for v in values if v > ran]
        recent = [v for v in lately if v > ran]
        priced.append((ran, out, (len(longer), len(recent),
                                  statistics.median([v - ran for v in recent]) if recent
                                  else None)))
        return out

    def spy_chain(step: Any, *args: Any) -> Any:
        del priced[:]
        out = chain_seconds(step, *args)
        seen.append((step, out, list(priced)))
        return out

    steps_of = eta._steps

    def spy_steps(tickers: Any, calls: Any, nodes: Any, analysts: Any, samples: int,
                  now: Any) -> Any:
        out = steps_of(tickers, calls, nodes, analysts, samples, now)
        keys = [(run.ticker, s) for run in tickers
                if not (run.status in eta.FINISHED and (run.finished_at or now) <= now)
                for s in range(samples)]
        owner.clear()
        owner.update({id(step): key for step, key in zip(out, keys, strict=True)})
        oldest[:] = [max(((now - s.since).total_seconds() for s in out if s.since is not None),
                         default=0.0)]
        return out

    owner: dict[int, tuple[str, int]] = {}
    oldest: list[float] = []
    eta._chain_seconds, eta._left_of = spy_chain, spy_left  # type: ignore[assignment]
    eta._steps = spy_steps  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as scratch:
        engine = get_engine(f"sqlite:///{scratch}/replay.db")
        Base.metadata.create_all(engine)
        batch_id, _, readings = load(engine, fixture(name))
        import json
        raw = json.loads(fixture(name).read_text())["night"]
        with engine.connect() as conn:
            start, end = conn.execute(select(Batch.started_at, Batch.finished_at)
                                      .where(Batch.id == batch_id)).one()
        night_s = (end - start).total_seconds()
        from datetime import datetime
        calls = [(c[0], c[1], c[2], c[3], datetime.fromisoformat(c[5] or c[6]),
                  datetime.fromisoformat(c[6]), datetime.fromisoformat(c[7]))
                 for c in raw["calls"]]
        print("| into | left s | ETA s | work s | chain s | slowest (ticker/sample) | node under "
              "way | ready s | priced s (ages longer, newest longer, cap) | rest s | the step "
              "took s more | the sample took s more |")
        print("|---:|---:|---:|---:|---:|---|---|---:|---|---:|---:|---:|")
        for r in readings:
            now = r["taken_at"]
            left = (end - now).total_seconds()
            if left <= 0:
                continue
            del seen[:]
            found = eta.reading(engine, batch_id, now)
            work = (None if found.rate_tok_s in (None, 0)
                    else found.tokens_left / found.rate_tok_s)
            top = max((s for s in seen if s[1] is not None), key=lambda s: s[1][1],
                      default=None)
            if top is None:
                continue
            step, spread, under = top
            key = owner.get(id(step))
            ticker = f"{key[0]}/{key[1]}" if key else "?"
            took_step = took_all = None
            if key:
                mine = [c for c in calls if (c[0], c[2]) == key and c[3] == "ok"]
                ends = [c[6] for c in mine if c[1] in step.under_way and c[6] > now]
                took_step = (max(ends) - now).total_seconds() if ends else None
                took_all = (max(c[6] for c in mine) - now).total_seconds()
            ran = (now - step.since).total_seconds() if step.since else 0.0
            p = " / ".join(f"{o[1]:.0f} ({n}, {k}, {'—' if cap is None else f'{cap:.0f}'})"
                           for _, o, (n, k, cap) in under) or "—"
            rest = spread[1] - max((o[1] for _, o, _ in under), default=0.0)
            print(f"| {1 - left / night_s:.0%} | {left:.0f} | {found.eta_s:.0f} | "
                  f"{'—' if work is None else f'{work:.0f}'} | {found.chain_s:.0f} | {ticker} | "
                  f"{','.join(step.under_way)} | {ran:.0f} | {p} | {rest:.0f} | "
                  f"{'—' if took_step is None else f'{took_step:.0f}'} | "
                  f"{'—' if took_all is None else f'{took_all:.0f}'} | {oldest[0]:.0f} |")
        engine.dispose()


if __name__ == "__main__":
    main(sys.argv[1])
