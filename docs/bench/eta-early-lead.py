"""Every stored reading of every recorded night replayed, early ones too, and two replays compared.

For docs/lab/2026-12-07-eta-early-lead.md; a diagnostic, not part of the package. ``dump OUT``
replays ``app.morning.eta.reading`` at every stored reading (from the night's start, not only
from a tenth of it) of the fixtures tests/unit/morning/test_eta_replay.py replays, with the
night before (its ``NIGHTS``) and without (those and ``FIRST_ONLY``), and writes each reading's
figures to OUT (JSON). ``compare BEFORE AFTER`` prints, night by night: readings from a tenth
of the night on within 25% of the true time left, and whose interval held it; the worst
reading before a tenth (its error, whether its range held the time left); before and after;
and every reading whose figures differ at all (the bit-identical check). Usage, from a
checkout: ``PYTHONPATH=$PWD .venv/bin/python docs/bench/eta-early-lead.py dump OUT.json`` and
``... compare BEFORE.json AFTER.json``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select

from agents.nodes import ANALYSTS
from app.db.engine import get_engine
from app.db.models import Base, Batch, LLMCall
from app.morning import eta
from tests.unit.morning.test_eta_replay import FIRST_ONLY, FROM, NIGHTS, WITHIN
from tests.unit.support.eta_fixture import fixture, load

FIELDS = ("eta_s", "eta_low_s", "eta_high_s", "level", "estimating", "chain_s", "rate_tok_s",
          "calls_done", "calls_expected")


def _chain_share(engine: Engine, batch_id: int, at: datetime) -> float:
    """Return the share of the night's chain calls (the nodes after the analysts) answered
    by ``at``."""
    with engine.connect() as conn:
        settings, tickers = conn.execute(select(Batch.settings, Batch.tickers_total)
                                         .where(Batch.id == batch_id)).one()
        done = conn.execute(select(func.count()).select_from(LLMCall).where(
            LLMCall.batch_id == batch_id, LLMCall.status == "ok", LLMCall.ended_at <= at,
            LLMCall.node.not_in(ANALYSTS))).scalar_one()
    chain = eta.pipeline_nodes(settings or {})[1]
    return done / (len(chain) * int(tickers) * int((settings or {}).get("samples") or 1))


def replay(name: str, before: bool) -> list[dict[str, Any]]:
    """Return every stored reading of ``name`` replayed (with or without its night before)."""
    with tempfile.TemporaryDirectory() as scratch:
        engine = get_engine(f"sqlite:///{scratch}/replay.db")
        Base.metadata.create_all(engine)
        batch_id, _, readings = load(engine, fixture(name), before)
        with engine.connect() as conn:
            start, end = conn.execute(select(Batch.started_at, Batch.finished_at)
                                      .where(Batch.id == batch_id)).one()
        night_s = (end - start).total_seconds()
        out = []
        for recorded in readings:
            at = recorded["taken_at"]
            if at >= end:
                continue
            r = eta.reading(engine, batch_id, at)
            left = (end - at).total_seconds()
            out.append({"night": name, "prior": before, "into": 1 - left / night_s,
                        "left": left, "chain_share": _chain_share(engine, batch_id, at),
                        "early": getattr(r, "early", None),
                        **{f: getattr(r, f) for f in FIELDS}})
        engine.dispose()
    return out


def dump(out: str) -> None:
    rows = []
    for before, names in ((True, NIGHTS), (False, NIGHTS + FIRST_ONLY)):
        for name in names:
            rows += replay(name, before)
            print(f"{'prior' if before else 'first'} {name}", flush=True)
    Path(out).write_text(json.dumps(rows, indent=0) + "\n")


def _score(rows: list[dict[str, Any]]) -> tuple[int, int, int, str]:
    """Return (readings from a tenth on, within 25% of them, interval held) and the worst
    reading before a tenth, as ``-48% at 6% (held)``."""
    late = [r for r in rows if r["into"] >= FROM]
    near = sum(1 for r in late if r["eta_s"] and abs(r["eta_s"] - r["left"]) <= WITHIN * r["left"])
    held = sum(1 for r in late if r["eta_s"] and r["eta_low_s"] <= r["left"] <= r["eta_high_s"])
    early = [r for r in rows if r["into"] < FROM]
    said = [r for r in early if r["eta_s"]]
    worst = "none said" if early else "no reading"
    if said:
        w = max(said, key=lambda r: abs(r["eta_s"] - r["left"]) / r["left"])
        cover = "held" if w["eta_low_s"] <= w["left"] <= w["eta_high_s"] else "missed"
        allheld = sum(1 for r in said if r["eta_low_s"] <= r["left"] <= r["eta_high_s"])
        worst = (f"{(w['eta_s'] - w['left']) / w['left']:+.0%} at {w['into']:.0%} ({cover}); "
                 f"{allheld}/{len(early)} held")
    return len(late), near, held, worst


def compare(before_path: str, after_path: str) -> None:
    before = json.loads(Path(before_path).read_text())
    after = json.loads(Path(after_path).read_text())
    keys = sorted({(r["prior"], r["night"]) for r in before}, key=lambda k: (not k[0], k[1]))
    print("| night | prior | from 10%: within 25% (before → after) | interval held | "
          "worst before 10%: before | after |")
    print("|---|---|---:|---:|---|---|")
    totals = [0, 0, 0, 0, 0]
    for prior, name in keys:
        a = [r for r in before if r["night"] == name and r["prior"] == prior]
        b = [r for r in after if r["night"] == name and r["prior"] == prior]
        n, near_a, held_a, worst_a = _score(a)
        _, near_b, held_b, worst_b = _score(b)
        totals = [totals[0] + n, totals[1] + near_a, totals[2] + near_b, totals[3] + held_a,
                  totals[4] + held_b]
        print(f"| {name} | {'yes' if prior else 'no'} | {near_a} → {near_b} of {n} | "
              f"{held_a} → {held_b} | {worst_a} | {worst_b} |")
    print(f"| all | | {totals[1]} → {totals[2]} of {totals[0]} | {totals[3]} → {totals[4]} | | |")
    moved = [(x, y) for x, y in zip(before, after, strict=True)
             if any(x[f] != y[f] for f in FIELDS)]
    print(f"\n{len(moved)} of {len(before)} readings differ:")
    for x, y in moved:
        print(f"  {'prior' if x['prior'] else 'first'} {x['night']} {x['into']:.0%} "
              f"left {x['left']:.0f}: " + ", ".join(
                  f"{f} {x[f]!r:.8} → {y[f]!r:.8}" for f in FIELDS if x[f] != y[f]))


if __name__ == "__main__":
    if sys.argv[1] == "dump":
        dump(sys.argv[2])
    else:
        compare(sys.argv[2], sys.argv[3])
