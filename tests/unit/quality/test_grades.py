"""Check that rating and score agree: the bands, the re-ask, the flag, the ranking's rule."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, select

from agents.decision import (
    SCORE_BANDS,
    SUMMARY_MAX_CHARS,
    Decision,
    bands_text,
    contradicts,
    decide,
    rating_for_score,
    response_format,
)
from agents.prompting import build_messages
from app.db.engine import alembic_config, get_engine, upgrade
from app.db.models import Decision as DecisionRow
from app.morning.ranking import ranking
from tests.unit.support.clirun import nightdesk
from tests.unit.support.quality_rows import add_batch, band_by_hand, one_each
from tests.unit.support.scripted_llm import TAG, ScriptedLLM, prompt


def reply(rating: str, score: float) -> str:
    return json.dumps({"rating": rating, "score": score, "confidence": 0.5, "summary": "S."})


def test_bands_as_the_docs_state_them() -> None:
    for step in range(-100, 101):
        score = step / 100
        assert rating_for_score(score) == band_by_hand(score), score
        # The band the score falls in never contradicts it.
        assert not contradicts(rating_for_score(score), score)
    assert contradicts("Sell", 0.97) and contradicts("Buy", -0.1)
    assert contradicts("Hold", 0.16) and contradicts("Overweight", 0.6)
    # Closed bands: a boundary score agrees with both neighbours.
    assert not contradicts("Overweight", 0.5) and not contradicts("Buy", 0.5)
    assert not contradicts("Hold", -0.15) and not contradicts("Underweight", -0.15)
    lows = sorted(lo for lo, _ in SCORE_BANDS.values())
    highs = sorted(hi for _, hi in SCORE_BANDS.values())
    assert lows[0] == -1.0 and highs[-1] == 1.0 and lows[1:] == highs[:-1]  # no gap


def test_the_prompt_and_the_schema_state_the_bands() -> None:
    text = bands_text()
    assert "Buy +0.50 to +1.00" in text and "Hold -0.15 to +0.15" in text
    context = {"ticker": "ACME", "as_of": "2026-11-27", "source": "S", "reports": []}
    messages = build_messages("portfolio_manager", context, trader_plan="T", history=[],
                              investment_plan="P", ratings=("Buy", "Hold"), bands=text,
                              summary_max_chars=SUMMARY_MAX_CHARS)
    assert text in messages[-1]["content"]
    description = response_format()["json_schema"]["schema"]["properties"]["score"]
    assert text in description["description"]


async def test_a_contradicting_decision_is_asked_again() -> None:
    llm = ScriptedLLM([reply("Sell", 0.97), reply("Buy", 0.8)])
    decision, _, attempts = await decide(llm, TAG, prompt, [], max_tokens=100, attempts=3)
    assert decision == Decision(rating="Buy", score=0.8, confidence=0.5, summary="S.")
    assert attempts == 2 and len(llm.calls) == 2
    asked = llm.calls[1]["messages"][-1]["content"]
    assert "Sell needs a score from -1.00 to -0.50" in asked and "+0.97" in asked


async def test_still_contradicting_after_every_attempt_is_kept_for_the_flag() -> None:
    llm = ScriptedLLM([reply("Sell", 0.97), "not json", reply("Buy", -0.2)])
    decision, _, attempts = await decide(llm, TAG, prompt, [], max_tokens=100, attempts=3)
    # The last valid reply, contradicting or not, is the decision; the store flags it.
    assert (decision.rating, decision.score) == ("Buy", -0.2) and attempts == 3
    llm = ScriptedLLM([reply("Sell", 0.97), "not json"])
    decision, _, _ = await decide(llm, TAG, prompt, [], max_tokens=100, attempts=2)
    assert (decision.rating, decision.score) == ("Sell", 0.97)


def test_the_store_flags_the_row(sqlite_engine: Engine) -> None:
    batch = add_batch(sqlite_engine, {"AAA": [("Sell", 0.97)], "BBB": [("Buy", 0.7)]})
    with sqlite_engine.connect() as conn:
        flags = dict(conn.execute(select(DecisionRow.ticker, DecisionRow.contradicts)
                                  .where(DecisionRow.batch_id == batch)).all())
    assert flags == {"AAA": True, "BBB": False}


def test_the_migration_judges_rows_written_before_it(sqlite_url: str) -> None:
    cfg = alembic_config(sqlite_url)
    command.upgrade(cfg, "0002")
    engine = get_engine(sqlite_url)
    rows: list[tuple[str, float]] = [("Sell", 0.97), ("Buy", 0.5), ("Hold", 0.15),
                                     ("Hold", 0.2), ("Underweight", -0.6)]
    now = datetime.now(UTC).replace(tzinfo=None)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO batches (id, kind, as_of, status, created_at, settings, tickers_total,"
            " tickers_succeeded, tickers_failed) VALUES (1, 'nightly', ?, 'succeeded', ?, '{}',"
            " 5, 5, 0)", (date(2026, 11, 27), now))
        for i, (rating, score) in enumerate(rows):
            conn.exec_driver_sql(
                "INSERT INTO decisions (batch_id, ticker, sample, rating, score, confidence,"
                " summary, created_at) VALUES (1, ?, 0, ?, ?, 0.5, 's', ?)",
                (f"T{i}", rating, score, now))
    upgrade(sqlite_url)
    with engine.connect() as conn:
        flags = [bool(f) for f in conn.execute(
            select(DecisionRow.contradicts).order_by(DecisionRow.ticker)).scalars()]
    assert flags == [True, False, False, True, True]


def test_several_samples_take_the_band_of_the_mean(sqlite_engine: Engine) -> None:
    # A majority says Buy, but the mean score (0.6 + 0.55 − 0.9) / 3 ≈ 0.083 is a Hold.
    batch = add_batch(sqlite_engine, {
        "AAA": [("Buy", 0.6), ("Buy", 0.55), ("Sell", -0.9)],
        "BBB": [("Overweight", 0.3), ("Buy", 0.9), ("Overweight", 0.45)],
    })
    _, rows = ranking(sqlite_engine, batch)
    by = {r.ticker: r for r in rows}
    assert by["AAA"].score == pytest.approx(0.25 / 3, abs=1e-4)
    assert by["AAA"].rating == "Hold" and by["AAA"].spread == pytest.approx(1.5)
    assert by["BBB"].rating == band_by_hand(1.65 / 3) == "Buy"
    assert [r.ticker for r in rows] == ["BBB", "AAA"]  # ranked by the mean
    for row in rows:
        assert row.score is not None and row.rating is not None
        assert not contradicts(row.rating, row.score)


def test_one_sample_is_graded_by_its_score_band_with_a_flag(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # One grading rule whatever the sample count: the model said Sell at +0.97, the band of
    # +0.97 is Buy, and the contradiction is flagged.
    grades: dict[str, Any] = one_each({"BBB": "Buy"})
    grades["AAA"] = [("Sell", 0.97)]
    batch = add_batch(sqlite_engine, grades)
    _, rows = ranking(sqlite_engine, batch)
    aaa = next(r for r in rows if r.ticker == "AAA")
    assert (aaa.rating, aaa.contradicting) == ("Buy", 1)
    code, out, err = nightdesk(monkeypatch, capsys, "ranking", "--batch", str(batch))
    assert code == 0, err
    assert "Buy !" in out and "! = rating outside its score band" in out


def test_one_and_several_samples_are_graded_by_one_rule(sqlite_engine: Engine) -> None:
    from app.quality.grades import consensus, load_grades
    from app.quality.monitor import batch_distribution

    # The same scores, once as one sample per ticker and once as two equal samples: the
    # grades agree everywhere (forward, track and the monitor all read consensus).
    scores = {"AAA": ("Buy", 0.05), "BBB": ("Hold", 0.4), "CCC": ("Sell", -0.2)}
    one = add_batch(sqlite_engine, {t: [rs] for t, rs in scores.items()})
    two = add_batch(sqlite_engine, {t: [rs, rs] for t, rs in scores.items()})
    for batch in (one, two):
        grades = load_grades(sqlite_engine, batch)
        assert {t: consensus(grades.tickers[t])[0] for t in scores} == {
            "AAA": "Hold", "BBB": "Overweight", "CCC": "Underweight"}
    assert batch_distribution(sqlite_engine, one) == batch_distribution(sqlite_engine, two)
