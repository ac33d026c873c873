"""Why the ETA turns on late and reads low on gated nights: each reading's terms against hindsight.

For docs/lab/2026-12-06-eta-late-low.md; a diagnostic, not part of the package. For every
stored reading of a fixture (tests/unit/support/fixtures/eta_night_*.json) from 10% of the
night on it prints, beside the true time left:

- ``eta``, ``work``, ``chain``: the estimate and its two bounds as app/morning/eta.py gives them
  (``work`` after the gated rule), and ``plain``: the work bound with the rule off;
- ``gated``: what the rule's bound (work left at the rate of the chain's answers over the last
  60 s) would say at that moment whether or not its trigger holds, and ``on``: whether it does;
- ``open``/``held``/``need``: the trigger's inputs (steps open, held, how many it needs);
  ``waited``: how many open steps had been ready longer than their node's median latency
  (1x rather than 3x);
- the chain's truth in hindsight: the sample that finished last, its time left split into
  what its calls ran (issue to answer: what the chain bound prices), what they waited at the
  gate (ready to issue) and the gaps between one answer and the next step being ready; and
  ``chain_said``: the chain bound's own figure for that sample;
- ``busy``: the seconds left in which some call of the night was ready (the work bound prices
  this), and the work bound's per-call cost against the mean true share (ready to answer,
  the whole night's shares) of the calls left, all nodes pooled.

Usage, from a checkout: ``PYTHONPATH=$PWD .venv/bin/python docs/bench/eta-late-low.py NAME
[NAME ...]`` (NAME as in ``eta_night_NAME.json``); ``--json OUT`` also writes every row;
``--no-prior`` replays each night without the night before
(docs/lab/2026-12-06-eta-first-night.md).
``chain_answers`` is how many of the chain's calls (the nodes after the analysts) had
answered by the reading.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from datetime import datetime
from typing import Any

from sqlalchemy import select

from app.db.engine import get_engine
from app.db.models import Base, Batch, LLMCall
from app.morning import eta
from tests.unit.support.eta_fixture import fixture, load


def _calls(engine: Any, batch_id: int) -> list[eta.Call]:
    with engine.connect() as conn:
        return [eta.Call(*c) for c in conn.execute(
            select(*eta.CALL).where(LLMCall.batch_id == batch_id).order_by(LLMCall.ended_at))]


def _busy(calls: list[eta.Call], now: datetime, end: datetime) -> float:
    """Seconds in (now, end] in which at least one call was ready or running."""
    spans = sorted((max(eta._ready(c), now), c.ended_at) for c in calls if c.ended_at > now)
    total, reach = 0.0, now
    for a, b in spans:
        if b > reach:
            total += (b - max(a, reach)).total_seconds()
            reach = b
    return total + max(0.0, (end - reach).total_seconds())


def _last_chain(calls: list[eta.Call], now: datetime) -> dict[str, float]:
    """The sample that answered last: its time from ``now`` split into run, gate and gaps."""
    last = max((c for c in calls if c.status == "ok"), key=lambda c: c.ended_at)
    own = sorted((c for c in calls if (c.ticker, c.sample) == (last.ticker, last.sample)
                  and c.ended_at > now), key=lambda c: c.ended_at)
    run = gate = gap = 0.0
    reach = now
    for c in own:
        ready, started = max(eta._ready(c), reach), max(c.started_at, reach)
        if c.ended_at <= reach:
            continue
        gap += max(0.0, (ready - reach).total_seconds())
        gate += max(0.0, (started - ready).total_seconds())
        run += (c.ended_at - started).total_seconds()
        reach = c.ended_at
    return {"ticker": last.ticker, "run": run, "gate": gate, "gap": gap,
            "steps_left": len({c.node for c in own if c.status == "ok"})}


def night(name: str, before: bool = True) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        engine = get_engine(f"sqlite:///{scratch}/replay.db")
        Base.metadata.create_all(engine)
        batch_id, _, readings = load(engine, fixture(name), before)
        with engine.connect() as conn:
            start, end, settings = conn.execute(
                select(Batch.started_at, Batch.finished_at, Batch.settings)
                .where(Batch.id == batch_id)).one()
        night_s = (end - start).total_seconds()
        every = _calls(engine, batch_id)
        whole = eta.Shares([(eta._ready(c), c.ended_at, 1) for c in every])
        analysts, chain_nodes = eta.pipeline_nodes(settings or {})
        nodes = [*analysts, *chain_nodes]
        original = eta._gated_work
        for recorded in readings:
            now = recorded["taken_at"]
            left = (end - now).total_seconds()
            if left <= 0 or (now - start).total_seconds() < 0.10 * night_s:
                continue
            seen: dict[str, Any] = {}

            def spy(steps: Any, calls: Any, chain: Any, cost: Any, took: Any, at: Any,
                    seen: dict[str, Any] = seen) -> float | None:
                # The rule's own answer, and its bound with the trigger forced on.
                seen["on"] = original(steps, calls, chain, cost, took, at)
                open_steps = [s for s in steps if s.since is not None]
                med = [max((statistics.median(took[n]) for n in s.under_way if n in took),
                           default=float("inf")) for s in open_steps]
                ages = [(at - s.since).total_seconds() for s in open_steps]
                seen["open"] = len(open_steps)
                seen["held"] = sum(a > eta.HELD_AGE * m for a, m in zip(ages, med, strict=True))
                seen["waited"] = sum(a > m for a, m in zip(ages, med, strict=True))
                seen["need"] = max(eta.NEWEST_MIN, eta.HELD_SHARE * len(open_steps))
                seen["cost"] = dict(cost)
                seen["steps"] = steps
                held_age, held_share, least = eta.HELD_AGE, eta.HELD_SHARE, eta.NEWEST_MIN
                try:
                    eta.HELD_AGE, eta.HELD_SHARE, eta.NEWEST_MIN = -1.0, 0.0, 0
                    seen["gated"] = original(steps, calls, chain, cost, took, at)
                finally:
                    eta.HELD_AGE, eta.HELD_SHARE, eta.NEWEST_MIN = held_age, held_share, least
                return seen["on"]

            eta._gated_work = spy  # type: ignore[assignment]
            try:
                found = eta.reading(engine, batch_id, now)
            finally:
                eta._gated_work = original
            eta._gated_work = lambda *a, **k: None  # type: ignore[assignment]
            try:
                plain = eta.reading(engine, batch_id, now)
            finally:
                eta._gated_work = original
            work_s = found.tokens_left / found.rate_tok_s if found.rate_tok_s else None
            plain_s = plain.tokens_left / plain.rate_tok_s if plain.rate_tok_s else None
            truth = _last_chain(every, now)
            # The work bound's cost of the calls left against their true shares.
            left_calls = [c for c in every if c.ended_at > now and c.node in nodes]
            true_share = [whole.of(eta._ready(c), c.ended_at) for c in left_calls]
            cost = seen.get("cost", {})
            priced = [cost[c.node] for c in left_calls if c.node in cost]
            rows.append({
                "night": name, "into": 1 - left / night_s, "left": left,
                "eta": found.eta_s, "work": work_s, "plain": plain_s, "chain": found.chain_s,
                "gated": seen.get("gated"), "on": seen.get("on") is not None,
                "open": seen.get("open"), "held": seen.get("held"),
                "waited": seen.get("waited"), "need": seen.get("need"),
                "chain_answers": sum(c.status == "ok" and c.node in chain_nodes
                                     and c.ended_at <= now for c in every),
                "busy": _busy(every, now, end), **{f"last_{k}": v for k, v in truth.items()},
                "cost_mean": statistics.fmean(priced) if priced else None,
                "true_share_mean": statistics.fmean(true_share) if true_share else None,
            })
        engine.dispose()
    return rows


def _f(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "on" if v else ""
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 2 else f"{v:.0f}"
    return str(v)


def main(argv: list[str]) -> None:
    out = None
    if "--json" in argv:
        i = argv.index("--json")
        out, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    before = "--no-prior" not in argv
    argv = [a for a in argv if a != "--no-prior"]
    every = []
    cols = ["into", "left", "eta", "work", "plain", "gated", "on", "chain", "open", "held",
            "need", "waited", "chain_answers", "busy", "last_run", "last_gate", "last_gap",
            "cost_mean", "true_share_mean"]
    for name in argv:
        rows = night(name, before)
        every += rows
        print(f"\n{name}\n| " + " | ".join(cols) + " |\n|" + "---:|" * len(cols))
        for r in rows:
            print("| " + " | ".join(_f(r[c]) if c != "into" else f"{r[c]:.0%}"
                                    for c in cols) + " |")
    if out:
        with open(out, "w") as fh:
            json.dump(every, fh, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1:])
