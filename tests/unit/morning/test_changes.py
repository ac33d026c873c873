"""What changed since the night before: markers, the Changes order, the nodes that moved, the CLI.

Night 1 (D1): AAA Hold +0.00, BBB Buy +0.70, CCC Overweight +0.30, EEE Sell −0.70, FFF failed.
Night 2 (D2): AAA Buy +0.60 (upgrade, +0.60; its market and news analysts turned bullish),
BBB Sell −0.80 (downgrade, −1.50; its bear researcher turned bearish, and its trader and
portfolio manager turned to SELL, which a "why" does not name), CCC Overweight +0.35 (same),
DDD Hold +0.05 (new: not in night 1), EEE failed (dropped), FFF Hold 0.00 (new: failed before).
"""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import date
from pathlib import Path

import pytest
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from agents.data.demo import demo_tickers, write_demo
from app.config import load_settings
from app.morning.changes import NodeMove, compare_nights, stance, why_line
from app.morning.digest import build_digest
from tests.unit.support.clirun import run_cli
from tests.unit.support.night_rows import SETTINGS, Rated, add_night, at, table
from tests.unit.support.webclient import AUTH, web_client

D1, D2 = date(2026, 11, 26), date(2026, 11, 27)
BEAR = table(trend="bearish", momentum="bearish", volume="neutral")
BULL = table(trend="bullish", momentum="bullish", volume="bullish")
FLAT = table(trend="neutral", momentum="bullish", volume="bearish")


def two_nights(engine: Engine) -> tuple[int, int]:
    first = add_night(engine, D1, at(D2, 0, 10), {
        "AAA": Rated("Hold", 0.0, texts={"market": BEAR, "news": BEAR, "fundamentals": FLAT,
                                         "trader": "PROPOSAL: HOLD"}),
        "BBB": Rated("Buy", 0.7, texts={"market": FLAT, "bear_r1": "still bullish",
                                        "trader": "PROPOSAL: BUY",
                                        "portfolio_manager": "Rating: Buy"}),
        "CCC": Rated("Overweight", 0.3),
        "EEE": Rated("Sell", -0.7),
        "FFF": Rated(error="LLMTimeoutError: no answer"),
    })
    second = add_night(engine, D2, at(date(2026, 11, 28), 0, 10), {
        "AAA": Rated("Buy", 0.6, texts={"market": BULL, "news": BULL, "fundamentals": FLAT,
                                        "trader": "PROPOSAL: HOLD"}),
        "BBB": Rated("Sell", -0.8, texts={"market": FLAT, "bear_r1": "bearish now",
                                          "trader": "PROPOSAL: SELL",
                                          "portfolio_manager": "Rating: Sell"}),
        "CCC": Rated("Overweight", 0.35),
        "DDD": Rated("Hold", 0.05),
        "EEE": Rated(error="DataError: no prices"),
        "FFF": Rated("Hold", 0.0),
    })
    return first, second


def test_stance_is_the_balance_of_stance_words() -> None:
    assert stance(BULL) == 1.0 and stance(BEAR) == pytest.approx(-2 / 3)
    assert stance("PROPOSAL: SELL") == -1.0 and stance("no view at all") is None
    assert stance("a buyback and a sell-off") == -1.0  # "buyback" is no stance word


def test_markers_previous_columns_and_the_changes_order(sqlite_engine: Engine) -> None:
    first, second = two_nights(sqlite_engine)
    found = compare_nights(sqlite_engine)  # the ranked night against the one before
    assert (found.batch_id, found.against_id) == (second, first)
    by = found.by_ticker()
    assert {t: c.change for t, c in by.items()} == {
        "AAA": "upgrade", "BBB": "downgrade", "CCC": "same", "DDD": "new",
        "EEE": "dropped", "FFF": "new"}
    # Night 1's ranks: BBB 1, CCC 2, AAA 3, EEE 4.
    assert (by["AAA"].previous_rating, by["AAA"].previous_score, by["AAA"].previous_rank) == \
        ("Hold", 0.0, 3)
    assert by["BBB"].score_move == pytest.approx(-1.5)
    assert by["CCC"].score_move == pytest.approx(0.05)
    assert [c.ticker for c in found.changes] == ["BBB", "AAA", "DDD", "EEE", "FFF"]
    assert by["DDD"].why == f"not among the tickers of batch #{first} (as of {D1})"
    assert by["EEE"].why == f"failed on {D2}: DataError: no prices"
    assert by["FFF"].why.startswith(f"not rated on {D1}: failed")


def test_a_ticker_the_night_left_out_is_not_said_to_be_out_of_its_universe(
        sqlite_engine: Engine, tmp_path: Path) -> None:
    # `run --limit 2` (or --tickers) leaves a ticker of the date's universe out of the
    # batch: "not in the universe of D" was untrue of it.
    a, b, c = demo_tickers(3)
    universe = write_demo(tmp_path, D2, 3) / "universe.txt"
    assert c in universe.read_text().split()
    add_night(sqlite_engine, D1, at(D2, 0, 10), {t: Rated("Hold", 0.0) for t in (a, b, c)})
    second = add_night(sqlite_engine, D2, at(date(2026, 11, 28), 0, 10),
                       {t: Rated("Hold", 0.0) for t in (a, b)})
    dropped = compare_nights(sqlite_engine).by_ticker()[c]
    assert dropped.change == "dropped"
    assert dropped.why == f"not among the tickers of batch #{second} (as of {D2})"


def test_the_night_before_is_the_latest_earlier_date_not_a_later_backfill(
        sqlite_engine: Engine) -> None:
    # D1 and D2 ran in turn; D1 was then analyzed again (a backfill, `run --as-of D1`),
    # finishing after D2's night. The night of D3 was compared with that backfill, two
    # dates back, in `changes`, the ranking's Was column and the digest.
    d3 = date(2026, 11, 28)
    add_night(sqlite_engine, D1, at(D2, 0, 10), {"AAA": Rated("Hold", 0.0)})
    before = add_night(sqlite_engine, D2, at(d3, 0, 10), {"AAA": Rated("Buy", 0.7)})
    add_night(sqlite_engine, D1, at(d3, 9, 0), {"AAA": Rated("Sell", -0.7)})
    night = add_night(sqlite_engine, d3, at(date(2026, 11, 29), 0, 10),
                      {"AAA": Rated("Buy", 0.6)})
    found = compare_nights(sqlite_engine, night)
    assert (found.against_id, found.against_as_of) == (before, D2)
    assert found.by_ticker()["AAA"].change == "same"


def test_the_nodes_that_moved_most_are_named(sqlite_engine: Engine) -> None:
    two_nights(sqlite_engine)
    by = compare_nights(sqlite_engine).by_ticker()
    aaa = by["AAA"]
    # market and news went from −2/3 to +1; fundamentals and trader did not move.
    assert [m.node for m in aaa.moved[:2]] == ["market", "news"]
    assert aaa.moved[0].shift == pytest.approx(5 / 3)
    assert aaa.why == "moved most: market bearish→bullish (+1.67), news bearish→bullish (+1.67)"
    # The portfolio manager (the rating itself) and the trader moved as far: not named.
    assert by["BBB"].why == "moved most: bear_r1 bullish→bearish (-2.00)"
    assert [m.node for m in by["BBB"].moved] == ["bear_r1", "market"]
    assert by["CCC"].moved == []


def band_nights(engine: Engine) -> tuple[int, int]:
    """GGG: the model said Overweight at −0.50, then Hold at +0.92: both outside their score
    bands (Overweight +0.15…+0.50, Hold −0.15…+0.15); graded by score, Sell then Buy."""
    first = add_night(engine, D1, at(D2, 0, 10), {
        "GGG": Rated("Overweight", -0.5, texts={"news": BEAR}),
        "HHH": Rated("Buy", 0.9)})
    second = add_night(engine, D2, at(date(2026, 11, 28), 0, 10), {
        "GGG": Rated("Hold", 0.92, texts={"news": BULL}),
        "HHH": Rated("Hold", 0.0)})
    return first, second


def test_a_change_against_its_score_shows_the_band_marker(sqlite_engine: Engine) -> None:
    band_nights(sqlite_engine)
    by = compare_nights(sqlite_engine).by_ticker()
    ggg = by["GGG"]
    # One grading rule: the rating moves with the score (Sell at −0.50 → Buy at +0.92).
    assert (ggg.change, ggg.score_move) == ("upgrade", pytest.approx(1.42))
    assert (ggg.previous_contradicting, ggg.contradicting) == (1, 1)
    assert ggg.why == ("! the model's own rating lay outside its score's band in 1 of 1 "
                       "sample(s) the night before and 1 of 1 sample(s) tonight (the rating "
                       "shown is its score's band); moved most: news bearish→bullish (+1.67)")
    assert not by["HHH"].why.startswith("!")  # Buy +0.90 → Hold 0.00: both in their bands
    shown = run_cli("changes", env={"COLUMNS": "250"}).stdout
    assert "Sell ! -0.50" in shown and "Buy ! +0.92" in shown
    assert "! the model's own rating lay outside its score's band" in shown


def test_a_rating_change_without_stored_outputs_says_so(sqlite_engine: Engine) -> None:
    add_night(sqlite_engine, D1, at(D2, 0, 10), {"AAA": Rated("Hold", 0.0)})
    add_night(sqlite_engine, D2, at(date(2026, 11, 28), 0, 10), {"AAA": Rated("Buy", 0.6)})
    assert compare_nights(sqlite_engine).by_ticker()["AAA"].why == \
        "node outputs not stored for one of the nights"


def test_the_first_night_has_nothing_to_compare(sqlite_engine: Engine) -> None:
    add_night(sqlite_engine, D1, at(D2, 0, 10), {"AAA": Rated("Hold", 0.0)})
    found = compare_nights(sqlite_engine)
    assert found.against_id is None and found.changes == []
    assert found.tickers[0].change is None


def test_cli_changes_in_each_format(sqlite_engine: Engine) -> None:
    first, second = two_nights(sqlite_engine)
    table_out = run_cli("changes", env={"COLUMNS": "250"})
    assert table_out.code == 0, table_out.stderr
    assert f"batch {second} (as of {D2}) against batch {first}" in table_out.stdout
    assert "1 upgrade, 1 downgrade, 2 new, 1 dropped, 1 same" in table_out.stdout
    as_json = json.loads(run_cli("changes", "--format", "json").stdout)
    assert [c["ticker"] for c in as_json["changes"]] == ["BBB", "AAA", "DDD", "EEE", "FFF"]
    assert as_json["changes"][1]["moved"][0]["node"] == "market"
    rows = list(csv.DictReader(io.StringIO(run_cli("changes", "--format", "csv").stdout)))
    assert [(r["ticker"], r["change"]) for r in rows][:2] == [("BBB", "downgrade"),
                                                              ("AAA", "upgrade")]
    # --batch and --against name the nights explicitly: the other way round, all reversed.
    back = json.loads(run_cli("changes", "--batch", str(first), "--against", str(second),
                              "--format", "json").stdout)
    assert {c["ticker"]: c["change"] for c in back["changes"]}["AAA"] == "downgrade"


def test_ranking_carries_the_previous_night_and_the_marker(sqlite_engine: Engine) -> None:
    two_nights(sqlite_engine)
    ranked = json.loads(run_cli("ranking", "--format", "json").stdout)
    rows = {r["ticker"]: r for r in ranked["rows"]}
    assert (rows["AAA"]["previous_rating"], rows["AAA"]["previous_rank"],
            rows["AAA"]["change"]) == ("Hold", 3, "upgrade")
    assert rows["DDD"]["change"] == "new" and rows["DDD"]["previous_rating"] is None
    shown = run_cli("ranking", env={"COLUMNS": "250"}).stdout
    assert "Hold +0.00, rank 3" in shown and "upgrade" in shown


def test_a_previous_rank_reads_as_a_rank_on_every_surface(sqlite_engine: Engine,
                                                          client: TestClient) -> None:
    # "#3" beside a rating read as batch #3: everywhere else "#" names a batch.
    two_nights(sqlite_engine)
    said = {"ranking": run_cli("ranking", env={"COLUMNS": "250"}).stdout,
            "changes": run_cli("changes", env={"COLUMNS": "250"}).stdout}
    page = BeautifulSoup(client.get("/", auth=AUTH).text, "html.parser")
    said["page"] = " ".join(cell.get_text(" ", strip=True) for cell in page.select("td.was"))
    for surface, text in said.items():  # AAA's Hold +0.00 was ranked third
        assert "Hold +0.00, rank 3" in text and not re.search(r"\d #\d", text), (surface, text)


@pytest.mark.parametrize("args", [
    ("--batch", "999"), ("--against", "999"), ("--batch", "abc"),
])
def test_unknown_batches_are_one_line_and_exit_2(sqlite_engine: Engine,
                                                 args: tuple[str, ...]) -> None:
    two_nights(sqlite_engine)
    result = run_cli("changes", *args)
    assert result.code == 2 and len(result.error_lines) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_against_a_batch_of_another_universe_is_refused(sqlite_engine: Engine) -> None:
    _, second = two_nights(sqlite_engine)
    other = add_night(sqlite_engine, D1, at(D2, 1, 0), {"ZZZ": Rated("Buy", 0.9)})
    real = add_night(sqlite_engine, D1, at(D2, 2, 0), {"AAA": Rated("Buy", 0.9)},
                     settings={**SETTINGS, "demo_data": False})
    for against, words in ((other, "no ticker in common"), (real, "DEMO data"),
                           (second, "the batch itself")):
        result = run_cli("changes", "--batch", str(second), "--against", str(against))
        assert result.code == 2 and len(result.error_lines) == 1, result.stderr
        assert words in result.stderr


def test_the_default_night_before_of_another_universe_is_no_error(sqlite_engine: Engine) -> None:
    # The night before ran on market data, tonight on DEMO data: nothing to compare, but the
    # ranking and the changes still answer (only an explicit --against is refused).
    add_night(sqlite_engine, D1, at(D2, 0, 10), {"AAA": Rated("Hold", 0.0)},
              settings={**SETTINGS, "demo_data": False})
    night = add_night(sqlite_engine, D2, at(date(2026, 11, 28), 0, 10),
                      {"AAA": Rated("Buy", 0.6)})
    found = compare_nights(sqlite_engine)
    assert found.against_id is None and found.changes == []
    assert run_cli("ranking").code == 0
    result = run_cli("changes")
    said = ("no finished night of an earlier as-of date, of the same universe, to compare "
            "with")
    assert result.code == 0 and said in " ".join(result.stdout.split())
    # The digest in the same words (before: "no finished night of an earlier as-of date",
    # untrue beside the market night of D1).
    body = build_digest(sqlite_engine, load_settings(), night).message.body
    assert f"Changes: {said}" in body, body


def test_a_night_of_another_universe_between_is_passed_over_for_the_night_before(
        sqlite_engine: Engine) -> None:
    # Market nights on D0 and D2, a DEMO night (and a night of other tickers) on D1 between:
    # before, the market night read "no finished night of an earlier as-of date, of the same
    # universe, to compare with" (the digest: "no finished night of an earlier as-of date")
    # and showed no Was, while D0 is one and AAA fell from Buy to Sell since.
    market = {**SETTINGS, "demo_data": False}
    d0, d1 = date(2026, 11, 25), D1
    first = add_night(sqlite_engine, d0, at(D1, 0, 10), {
        "AAA": Rated("Buy", 0.7), "BBB": Rated("Hold", 0.0)}, settings=market)
    add_night(sqlite_engine, d1, at(D2, 0, 10), {"AAA.DEMO": Rated("Hold", 0.0)})
    add_night(sqlite_engine, d1, at(D2, 1, 10), {"ZZZ": Rated("Hold", 0.0)}, settings=market)
    last = add_night(sqlite_engine, D2, at(date(2026, 11, 28), 0, 10), {
        "AAA": Rated("Sell", -0.8), "BBB": Rated("Hold", 0.0)}, settings=market)
    found = compare_nights(sqlite_engine)
    assert (found.batch_id, found.against_id) == (last, first)
    assert found.by_ticker()["AAA"].change == "downgrade"
    said = " ".join(run_cli("changes").stdout.split())
    assert f"changes: batch {last} (as of {D2}) against batch {first} (as of {d0})" in said
    body = build_digest(sqlite_engine, load_settings(), last).message.body
    assert f"Rating changes since {d0} (batch #{first}): 1" in body, body
    assert "AAA: Buy → Sell" in body


def test_a_second_night_of_one_date_is_not_said_to_have_no_earlier_night(
        sqlite_engine: Engine) -> None:
    # Two nights of one date (`nightdesk run` again): the first is an earlier finished night
    # of the same universe; before, `changes` and the page said there was none.
    add_night(sqlite_engine, D2, at(date(2026, 11, 28), 0, 10), {"AAA": Rated("Hold", 0.0)})
    add_night(sqlite_engine, D2, at(date(2026, 11, 28), 2, 10), {"AAA": Rated("Buy", 0.6)})
    said = " ".join(run_cli("changes").stdout.split())
    assert said.endswith(f"(as of {D2}): no finished night of an earlier as-of date, of the "
                         "same universe, to compare with"), said


def test_a_rerun_is_no_night_to_compare_or_compare_with(sqlite_engine: Engine) -> None:
    # A rerun holds one ticker of its night: compared with a night, the night's other
    # tickers read "not in the universe" or "new", which they are not.
    first, second = two_nights(sqlite_engine)
    rerun = add_night(sqlite_engine, D2, at(date(2026, 11, 28), 3, 0),
                      {"EEE": Rated("Hold", 0.0)}, kind="rerun")
    for args in (("--against", str(rerun)), ("--batch", str(rerun)),
                 ("--batch", str(rerun), "--against", str(first))):
        result = run_cli("changes", *args)
        assert result.code == 2, (args, result.stderr)
        [line] = result.error_lines
        assert f"{rerun} is a rerun batch, not a night: name a nightly batch" in line, line
    assert run_cli("changes", "--batch", str(second), "--against", str(first)).code == 0


def test_a_ticker_the_night_did_not_finish_is_not_said_dropped(sqlite_engine: Engine) -> None:
    # Before: `changes --batch` of an interrupted night said "CCC dropped (queued on …)" for
    # tickers it never reached: their rating is not known, not gone.
    add_night(sqlite_engine, D1, at(D2, 0, 10), {
        "AAA": Rated("Hold", 0.0), "BBB": Rated("Buy", 0.7), "CCC": Rated("Sell", -0.7)})
    cut = add_night(sqlite_engine, D2, at(date(2026, 11, 28), 0, 10), {
        "AAA": Rated("Buy", 0.6), "BBB": Rated(status="interrupted"),
        "CCC": Rated(status="queued")}, status="interrupted")
    found = compare_nights(sqlite_engine, cut).by_ticker()
    assert [(t, found[t].change) for t in ("AAA", "BBB", "CCC")] == \
        [("AAA", "upgrade"), ("BBB", None), ("CCC", None)]
    assert found["CCC"].why == f"not finished in batch #{cut} (queued): no rating yet"
    said = " ".join(run_cli("changes", "--batch", str(cut)).stdout.split())
    assert "dropped" not in said.replace("0 dropped", "")
    assert said.endswith("1 upgrade, 0 downgrades, 0 new, 0 dropped, 0 same, 2 not finished "
                         "(no rating yet)"), said


def test_the_why_line_docs_quote_is_what_the_code_says() -> None:
    # docs/operations.md quoted a move that kept its label as "bear_r1 +0.50"; the line
    # has always said "bear_r1 (+0.50)".
    docs = (Path(__file__).resolve().parents[3] / "docs" / "operations.md").read_text()
    said = why_line([NodeMove(node="news", before=-0.75, after=0.75),
                     NodeMove(node="bear_r1", before=-0.75, after=-0.25)], measured=True)
    assert said == "moved most: news bearish→bullish (+1.50), bear_r1 (+0.50)"
    assert f"`{said}`" in " ".join(docs.split())


def test_a_view_read_on_one_night_only_is_not_said_not_to_have_moved(
        sqlite_engine: Engine) -> None:
    # The night before's analysts wrote no stance word (only its trader did): before, the
    # upgrade's why said "no node's stance moved by 0.1 or more", while tonight's market and
    # news analysts read bullish and nothing said how they read the night before.
    add_night(sqlite_engine, D1, at(D2, 0, 10), {"AAA": Rated("Hold", 0.0, texts={
        "market": "no view at all", "news": "no view at all", "trader": "PROPOSAL: HOLD"})})
    night = add_night(sqlite_engine, D2, at(date(2026, 11, 28), 0, 10), {
        "AAA": Rated("Buy", 0.6, texts={"market": BULL, "news": BULL,
                                        "trader": "PROPOSAL: BUY"})})
    why = compare_nights(sqlite_engine).by_ticker()["AAA"].why
    assert why == "no view's stance read on both nights; read on one night only: market, news"
    said = " ".join(run_cli("changes").stdout.split())
    assert "read on one night only: market, news" in said, said
    body = build_digest(sqlite_engine, load_settings(), night).message.body
    assert f"AAA: Hold → Buy (+0.00 → +0.60, +0.60) upgrade; {why}" in body, body


def test_no_view_read_on_either_night_is_not_said_not_to_have_moved(
        sqlite_engine: Engine) -> None:
    # A downgrade whose analysts and debaters wrote no stance word on either night (the fake's
    # "the evidence is mixed", which the tiny model writes too) while the trader did: the why
    # said "no node's stance moved by 0.1 or more", a "none" of views never read.
    add_night(sqlite_engine, D1, at(D2, 0, 10), {"AAA": Rated("Buy", 0.6, texts={
        "market": "the evidence is mixed", "trader": "PROPOSAL: BUY"})})
    night = add_night(sqlite_engine, D2, at(date(2026, 11, 28), 0, 10), {
        "AAA": Rated("Underweight", -0.3, texts={"market": "the evidence is mixed",
                                                  "trader": "PROPOSAL: SELL"})})
    why = compare_nights(sqlite_engine).by_ticker()["AAA"].why
    assert why == "no view's stance read on either night"
    body = build_digest(sqlite_engine, load_settings(), night).message.body
    assert f"downgrade; {why}" in body, body


def test_a_move_from_an_applied_rerun_says_so_on_every_surface(sqlite_engine: Engine) -> None:
    # Night 1 failed BBB and an operator's rerun rated it Hold; night 2 rated AAA Hold, a
    # rerun then Sell. Both moves are the reruns' ratings, not the nights': each says whose.
    add_night(sqlite_engine, D1, at(D2, 0, 10), {"AAA": Rated("Buy", 0.6),
                                                 "BBB": Rated(error="DataError: x")})
    before = add_night(sqlite_engine, D1, at(D2, 3, 0), {"BBB": Rated("Hold", 0.0)},
                       kind="rerun")
    add_night(sqlite_engine, D2, at(date(2026, 11, 28), 0, 10),
              {"AAA": Rated("Hold", 0.1), "BBB": Rated("Buy", 0.7)})
    now = add_night(sqlite_engine, D2, at(date(2026, 11, 28), 3, 0),
                    {"AAA": Rated("Sell", -0.6)}, kind="rerun")
    said = {"AAA": f"rating from rerun #{now}", "BBB": f"previous rating from rerun #{before}"}
    as_json = {c["ticker"]: c for c in json.loads(
        run_cli("changes", "--format", "json").stdout)["changes"]}
    rows = {r["ticker"]: r for r in csv.DictReader(io.StringIO(
        run_cli("changes", "--format", "csv").stdout))}
    shown = run_cli("changes", env={"COLUMNS": "250"}).stdout
    with web_client(sqlite_engine) as client:
        page = client.get("/", auth=AUTH).text
    for ticker, words in said.items():
        assert as_json[ticker]["why"].startswith(words) and rows[ticker]["why"].startswith(words)
        assert words in shown and words in page
    assert (as_json["AAA"]["rerun_id"], as_json["AAA"]["previous_rerun_id"]) == (now, None)
    assert (rows["BBB"]["rerun_id"], rows["BBB"]["previous_rerun_id"]) == ("", str(before))
