"""What changed between two nights: ratings, scores and ranks, and which nodes' views moved.

Each night is read as the ranking reads it (``app.morning.ranking.ranking``: reruns applied,
the same rating, score and flags), so the change column, the Changes section and ``nightdesk
changes`` agree with the ranking. docs/operations.md ("What changed since the night before")
states the markers and how a node's *stance* is read from its stored text. Nothing here writes.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import field
from typing import Any

from pydantic import computed_field, field_serializer
from pydantic.dataclasses import dataclass
from sqlalchemy import Engine, select

from agents.graph import kind_of
from agents.nodes import ANALYSTS, DEBATERS, RISK_ANALYSTS
from app.db.batchsettings import BatchSettings
from app.db.models import NodeText
from app.errors import InputError, NoNightYet
from app.morning.ranking import RATING_ORDER, RankRow, earlier_nights, ranked_night, ranking
from app.morning.summary import IsoDate

BULLISH = ("bullish", "buy", "overweight", "outperform")
BEARISH = ("bearish", "sell", "underweight", "underperform")
NEUTRAL = ("neutral", "hold")
_WORD = re.compile(r"\b(" + "|".join(BULLISH + BEARISH + NEUTRAL) + r")\b", re.IGNORECASE)
MOVED_NODES = 3  # nodes named per change
MIN_SHIFT = 0.1  # a smaller stance shift is not named
# The nodes whose views a "why" names: those that argue a view of their own.
VIEW_KINDS = frozenset((*ANALYSTS, *DEBATERS, *RISK_ANALYSTS))


@dataclass(frozen=True)
class NodeMove:
    """How far one node's stance moved between the two nights (−1 bearish … +1 bullish)."""

    node: str
    before: float
    after: float

    @computed_field  # type: ignore[prop-decorator]
    @property
    def shift(self) -> float:
        return self.after - self.before

    @field_serializer("shift", when_used="json")
    def _shift_json(self, shift: float) -> float:
        return round(shift, 3)


@dataclass(frozen=True)
class TickerChange:
    """One ticker tonight beside the night before."""

    ticker: str
    rank: int | None
    rating: str | None
    score: float | None
    status: str  # tonight's ticker status (succeeded, failed, … or "absent")
    contradicting: int  # tonight's samples whose rating contradicts their score
    previous_rank: int | None
    previous_rating: str | None
    previous_score: float | None
    # upgrade | downgrade | same | new | dropped; None: no night before, or the night did
    # not finish the ticker (queued, running, interrupted: its rating is not known yet)
    change: str | None
    score_move: float | None
    why: str  # one line: the nodes whose views moved most, or why it is new or dropped
    moved: list[NodeMove] = field(default_factory=list)
    previous_contradicting: int = 0  # the night before's samples outside their score band
    # The applied rerun (an operator's `nightdesk rerun`) a night's rating came from; None:
    # the night's own. ``why`` says so first.
    rerun_id: int | None = None
    previous_rerun_id: int | None = None

    @property
    def rating_changed(self) -> bool:
        return self.change in ("upgrade", "downgrade", "new", "dropped")


@dataclass(frozen=True)
class NightChanges:
    """Every ticker of two nights, compared; ``changes`` is the Changes section."""

    batch_id: int
    as_of: IsoDate
    against_id: int | None  # None: no earlier finished night to compare with
    against_as_of: IsoDate | None
    tickers: list[TickerChange]  # in tonight's ranking order, then the unranked
    demo: bool = False  # the night ran on the DEMO snapshot (the night before then did too)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def changes(self) -> list[TickerChange]:
        """Return every rating change, largest score move first (new and dropped last)."""
        return sorted((t for t in self.tickers if t.rating_changed),
                      key=lambda t: (t.score_move is None, -abs(t.score_move or 0.0),
                                     t.ticker))

    def by_ticker(self) -> dict[str, TickerChange]:
        return {t.ticker: t for t in self.tickers}


class RankedRow(RankRow):
    """One ranking row beside its previous night: the rows of ``/api/ranking`` and of
    ``nightdesk ranking --format json`` (the previous columns None without a night before).
    The first fields are ``app.morning.ranking.RankRow``'s, in its order."""

    previous_rank: int | None
    previous_rating: str | None
    previous_score: float | None
    change: str | None
    score_move: float | None


def ranked_row(row: RankRow, change: TickerChange | None) -> RankedRow:
    """Return one ranking row beside its previous night (see ``RankedRow``)."""
    added = RankedRow.model_fields.keys() - RankRow.model_fields.keys()
    return RankedRow.model_validate(
        {**row.model_dump(), **{key: getattr(change, key, None) for key in added}})


def stance(text: str) -> float | None:
    """Return the text's balance of stance words, −1 … +1; None when it has none."""
    words = [w.lower() for w in _WORD.findall(text)]
    if not words:
        return None
    bull = sum(w in BULLISH for w in words)
    bear = sum(w in BEARISH for w in words)
    return (bull - bear) / len(words)


def _label(value: float) -> str:
    return "bullish" if value > 0.2 else "bearish" if value < -0.2 else "neutral"


def node_stances(engine: Engine, batch_id: int, ticker: str) -> dict[str, float]:
    """Return each node's stance for one ticker of one batch, averaged over its samples."""
    with engine.connect() as conn:
        texts = conn.execute(select(NodeText.node, NodeText.text)
                             .where(NodeText.batch_id == batch_id,
                                    NodeText.ticker == ticker)).all()
    found: dict[str, list[float]] = defaultdict(list)
    for node, text in texts:
        value = stance(text)
        if value is not None:
            found[node].append(value)
    return {node: statistics.fmean(values) for node, values in found.items()}


def moved_nodes(before: dict[str, float], after: dict[str, float]) -> list[NodeMove]:
    """Return the analysts and debaters both nights measured, largest stance shift first."""
    moves = [NodeMove(n, before[n], after[n]) for n in before.keys() & after.keys()
             if kind_of(n) in VIEW_KINDS]
    return sorted(moves, key=lambda m: (-abs(m.shift), m.node))


def one_night_only(before: dict[str, float], after: dict[str, float]) -> list[str]:
    """Return the analysts and debaters whose stance was read on one of the nights only
    (the other night's text had no stance word): whether they moved is not known."""
    return [n for n in [*before, *after]
            if kind_of(n) in VIEW_KINDS and (n in before) != (n in after)]


def why_line(moves: list[NodeMove], measured: bool, one_night: list[str] | None = None) -> str:
    """Say in one short line which nodes' views moved most."""
    if not measured:
        return "node outputs not stored for one of the nights"
    named = [m for m in moves if abs(m.shift) >= MIN_SHIFT][:MOVED_NODES]
    if not named and one_night:  # no move seen is not "none moved" where one night is unread
        listed = ", ".join(one_night[:MOVED_NODES]) + (
            f" and {len(one_night) - MOVED_NODES} more" if len(one_night) > MOVED_NODES else "")
        return ("no view's stance read on both nights moved by 0.1 or more" if moves
                else "no view's stance read on both nights") + \
            f"; read on one night only: {listed}"
    if not moves and not one_night:  # only the trader's or the manager's read: no view
        return "no view's stance read on either night"
    if not named:
        return "no node's stance moved by 0.1 or more"
    parts = []
    for m in named:
        turn = (f" {_label(m.before)}→{_label(m.after)}"
                if _label(m.before) != _label(m.after) else "")
        parts.append(f"{m.node}{turn} ({m.shift:+.2f})")
    return "moved most: " + ", ".join(parts)


def band_note(now: RankRow, before: RankRow) -> str:
    """Say which night had samples whose own rating lay outside their score's band ("!"):
    the rating shown is the band of the score, so their word was overruled. Empty when
    neither night had one."""
    said = [f"{row.contradicting} of {row.samples} sample(s) {when}"
            for row, when in ((before, "the night before"), (now, "tonight"))
            if row.contradicting]
    if not said:
        return ""
    return ("! the model's own rating lay outside its score's band in " + " and ".join(said)
            + " (the rating shown is its score's band)")


def _rated(row: RankRow | None) -> bool:
    return row is not None and row.rating is not None and row.score is not None


# Said where a night has no night before to compare with: the CLI, the digest, the page.
NO_NIGHT_BEFORE = ("no finished night of an earlier as-of date, of the same universe, to "
                   "compare with")
# A ticker's statuses in a night that did not finish it: its rating is not known yet.
UNFINISHED = ("queued", "running", "interrupted")


def _marker(now: RankRow | None, before: RankRow | None) -> str | None:
    if now is not None and now.status in UNFINISHED:
        return None  # neither dropped nor the same: not rated yet
    if not _rated(now):
        return "dropped" if _rated(before) else None
    if not _rated(before):
        return "new"
    assert now is not None and before is not None
    up = RATING_ORDER.index(before.rating or "") - RATING_ORDER.index(now.rating or "")
    return "upgrade" if up > 0 else "downgrade" if up < 0 else "same"


def _check_comparable(batch: Any, rows: list[RankRow], against: Any,
                      against_rows: list[RankRow]) -> None:
    """Refuse two batches of different universes: no ticker in common, or DEMO beside real."""
    if batch.id == against.id:
        raise InputError(f"--against {against.id} is the batch itself: name an earlier night")
    if against.kind != "nightly":
        raise InputError(f"--against {against.id} is a {against.kind} batch, not a night: "
                         "name a nightly batch (a rerun's rating is in its night's ranking)")
    if not {r.ticker for r in rows} & {r.ticker for r in against_rows}:
        raise InputError(f"batch {against.id} is of another universe than batch {batch.id}: "
                         "no ticker in common")
    demo = BatchSettings.read(batch.settings).demo_data
    if demo != BatchSettings.read(against.settings).demo_data:
        raise InputError(f"batch {against.id} is of another universe than batch {batch.id}: "
                         "one ran on DEMO data, the other on market data")


def compare_nights(engine: Engine, batch_id: int | None = None,
                   against_id: int | None = None) -> NightChanges:
    """Compare a night (default: the one the ranking shows) with another (default: the newest
    finished nightly batch of the latest earlier as-of date).

    InputError: an unknown batch id, no finished night, or ``against_id`` of another universe.
    """
    if batch_id is None:
        batch_id = ranked_night(engine)
        if batch_id is None:
            raise NoNightYet("no finished nightly batch yet")
    batch, rows = ranking(engine, batch_id)
    demo = BatchSettings.read(batch.settings).demo_data
    if against_id is not None:
        against, against_rows = ranking(engine, against_id)
        _check_comparable(batch, rows, against, against_rows)
    else:
        # The night before of the same universe: a night of another (a DEMO night run
        # between two market nights, other tickers) is passed over, not compared with,
        # and none left is no error of the caller's.
        for earlier, earlier_demo in earlier_nights(engine, batch.id):
            if earlier_demo != demo:
                continue
            against, against_rows = ranking(engine, earlier)
            if {r.ticker for r in rows} & {r.ticker for r in against_rows}:
                against_id = earlier
                break
    if against_id is None:
        return NightChanges(batch.id, batch.as_of, None, None, [_unpaired(r) for r in rows],
                            demo)
    before = {r.ticker: r for r in against_rows}
    now = {r.ticker: r for r in rows}
    tickers = [_pair(engine, now.get(t), before.get(t), t, against, batch)
               for t in [*now, *(t for t in before if t not in now)]]
    return NightChanges(batch.id, batch.as_of, against.id, against.as_of, tickers, demo)


def _unpaired(row: RankRow) -> TickerChange:
    return TickerChange(row.ticker, row.rank, row.rating, row.score, row.status,
                        row.contradicting, None, None, None, None, None,
                        "no finished night of an earlier as-of date, of this universe")


def _pair(engine: Engine, now: RankRow | None, before: RankRow | None, ticker: str,
          earlier: Any, night: Any) -> TickerChange:
    """Return one ticker's change from batch ``earlier`` to batch ``night``."""
    before_as_of, as_of = earlier.as_of, night.as_of
    change = _marker(now, before)
    moves: list[NodeMove] = []
    if change in ("upgrade", "downgrade"):
        assert now is not None and before is not None
        after_stance = node_stances(engine, now.batch_id, ticker)
        before_stance = node_stances(engine, before.batch_id, ticker)
        moves = moved_nodes(before_stance, after_stance)
        why = "; ".join(filter(None, [band_note(now, before), why_line(
            moves, bool(after_stance) and bool(before_stance),
            one_night_only(before_stance, after_stance))]))
    elif change == "new":
        # The batch's tickers, not the date's universe: `run --limit` leaves some out.
        why = (f"not among the tickers of batch #{earlier.id} (as of {before_as_of})"
               if before is None
               else f"not rated on {before_as_of}: {before.status} ({before.summary})")
    elif change == "dropped":
        why = (f"not among the tickers of batch #{night.id} (as of {as_of})" if now is None
               else f"{now.status} on {as_of}: {now.summary}")
    elif now is not None and now.status in UNFINISHED:
        why = f"not finished in batch #{night.id} ({now.status}): no rating yet"
    else:
        why = ""
    rerun_id = now.batch_id if now is not None and now.batch_id != night.id else None
    previous_rerun_id = (before.batch_id if before is not None and before.batch_id != earlier.id
                         else None)
    why = "; ".join(filter(None, [_rerun_note(rerun_id, previous_rerun_id), why]))
    moved_score = (None if not (_rated(now) and _rated(before))
                   else round((now.score or 0.0) - (before.score or 0.0), 4))  # type: ignore[union-attr]
    return TickerChange(
        ticker=ticker, rank=now.rank if now else None, rating=now.rating if now else None,
        score=now.score if now else None, status=now.status if now else "absent",
        contradicting=now.contradicting if now else 0,
        previous_rank=before.rank if before else None,
        previous_rating=before.rating if before else None,
        previous_score=before.score if before else None,
        change=change, score_move=moved_score, why=why, moved=moves[:MOVED_NODES],
        previous_contradicting=before.contradicting if before else 0, rerun_id=rerun_id,
        previous_rerun_id=previous_rerun_id)


def _rerun_note(rerun_id: int | None, previous_rerun_id: int | None) -> str:
    """Say which of the two ratings an applied rerun gave, not the night itself."""
    said = [f"{when}rating from rerun #{batch}" for batch, when in (
        (rerun_id, ""), (previous_rerun_id, "previous ")) if batch]
    return " and ".join(said)
