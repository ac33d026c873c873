"""One "latest night" everywhere: the latest as-of date's, not the batch run last.

Tonight's night (2026-11-27) succeeded; in the morning an older date (2026-11-25) is analyzed
again (`nightdesk run --as-of`) and finishes last. Every place that picks "the latest night"
must pick tonight's, as the ranking does (``app.db.models.nights_newest_first``). And the
``ranking`` command says of that night what the page says (a rerun applied).
"""

from __future__ import annotations

import json
from datetime import date, timedelta

from bs4 import BeautifulSoup
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.config import load_settings
from app.morning.digest import build_digest
from app.morning.ranking import ranked_night
from app.morning.views import history_view, ticker_view
from app.quality.grades import newest_batch, newest_nightly
from app.quality.track import track_nights
from app.runs.nightly import nightly_of
from app.runs.resumable import pick
from tests.unit.support.clirun import run_cli
from tests.unit.support.night_rows import Rated, add_night, at
from tests.unit.support.webclient import PASSWORD, USER

D1, D2, OLD = date(2026, 11, 26), date(2026, 11, 27), date(2026, 11, 25)
DUE1, DUE2 = at(date(2026, 11, 27), 0, 10), at(date(2026, 11, 28), 0, 10)


def nights(engine: Engine) -> tuple[int, int, int]:
    """Return (the night before, tonight's night, the backfill run last)."""
    before = add_night(engine, D1, DUE1, {"AAA": Rated("Hold", 0.0)})
    tonight = add_night(engine, D2, DUE2, {"AAA": Rated("Buy", 0.8)})
    backfill = add_night(engine, OLD, DUE2 + timedelta(hours=2), {"AAA": Rated("Sell", -0.8)})
    return before, tonight, backfill


def test_the_ticker_page_headlines_tonights_night_not_a_backfill(sqlite_engine: Engine) -> None:
    _, tonight, _ = nights(sqlite_engine)
    assert ranked_night(sqlite_engine) == tonight
    view = ticker_view(sqlite_engine, "AAA", stale_after_s=120.0)
    # Before: the backfill (run last) was "tonight", its Sell the headline and the nodes shown.
    assert (view.tonight.batch_id, view.tonight.as_of, view.tonight.tonight) == \
        (tonight, D2, True)
    assert view.shown.id == tonight and view.latest.batch_id == tonight


def test_the_ticker_history_is_in_as_of_order(sqlite_engine: Engine) -> None:
    before, tonight, backfill = nights(sqlite_engine)
    points = history_view(sqlite_engine, "AAA")
    # Before: by batch id, the backfill of 2026-11-25 plotted after tonight's night.
    assert [(p.as_of, p.nightly_batch_id) for p in points] == \
        [(OLD, backfill), (D1, before), (D2, tonight)]


def test_quality_s_default_batch_is_the_rankings(sqlite_engine: Engine) -> None:
    _, tonight, _ = nights(sqlite_engine)
    # Before: the backfill, the batch run last.
    assert newest_batch(sqlite_engine) == tonight


def test_of_one_date_the_night_last_finished_is_the_newest(sqlite_engine: Engine) -> None:
    # Two nights of one date (`run --force`), the first resumed and finished after the second:
    # the ranking takes the first; so must quality's defaults and its track.
    add_night(sqlite_engine, D1, DUE1, {"AAA": Rated("Hold", 0.0)})
    resumed = add_night(sqlite_engine, D2, DUE2, {"AAA": Rated("Buy", 0.8)}, minutes=300)
    forced = add_night(sqlite_engine, D2, DUE2 + timedelta(hours=1), {"AAA": Rated("Hold", 0.1)})
    assert ranked_night(sqlite_engine) == resumed
    assert newest_batch(sqlite_engine) == resumed
    assert track_nights(sqlite_engine)[-1] == resumed
    assert newest_nightly(sqlite_engine, 2) == sorted([resumed, forced])


def test_the_ranking_command_names_a_rerun_applied_as_the_page_does(
        sqlite_engine: Engine, client: TestClient) -> None:
    # Before: the page tagged ALPH's row "rerun" and said "Reruns applied: #N"; `ranking`
    # showed the rerun's rating with nothing to tell it from the night's own.
    night = add_night(sqlite_engine, D2, DUE2, {"AAA": Rated(error="boom"),
                                                "BBB": Rated("Hold", 0.0)})
    rerun = add_night(sqlite_engine, D2, DUE2 + timedelta(hours=3), {"AAA": Rated("Buy", 0.8)},
                      kind="rerun")
    result = run_cli("ranking", env={"COLUMNS": "200"})
    assert result.code == 0 and f"ranking of batch {night}" in result.stdout
    said = f"reruns applied: AAA from rerun #{rerun}"
    assert said in result.stdout.splitlines()
    # The page's "Failed or missing" list is empty: AAA failed in the night, and its
    # rating is the rerun's. It said "every ticker of batch #N has a rating", full stop.
    page = BeautifulSoup(client.get("/", auth=(USER, PASSWORD)).text, "html.parser")
    none = page.select_one("#none-failed")
    assert none is not None and " ".join(none.get_text().split()) == (
        f"None: every ticker of batch #{night} has a rating; {said}.")


def test_report_without_an_id_reports_tonights_night(sqlite_engine: Engine) -> None:
    # Before: the batch run last, the backfill, or a rerun run after it.
    _, tonight, _ = nights(sqlite_engine)
    add_night(sqlite_engine, D2, DUE2 + timedelta(hours=3), {"AAA": Rated("Buy", 0.8)},
              kind="rerun")
    result = run_cli("report", "--format", "json")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["batch"]["id"] == tonight


def test_report_with_no_night_reports_the_newest_batch(sqlite_engine: Engine) -> None:
    rerun = add_night(sqlite_engine, D2, DUE2, {"AAA": Rated("Buy", 0.8)}, kind="rerun")
    result = run_cli("report", "--format", "json")
    assert result.code == 0 and json.loads(result.stdout)["batch"]["id"] == rerun


def test_resume_without_an_id_takes_tonights_night(sqlite_engine: Engine) -> None:
    # Both cut short; the older date's backfill was started last. Before: the backfill.
    tonight = add_night(sqlite_engine, D2, DUE2, {"AAA": Rated(status="queued")},
                        status="interrupted")
    add_night(sqlite_engine, OLD, DUE2 + timedelta(hours=2), {"AAA": Rated(status="queued")},
              status="interrupted")
    assert pick(sqlite_engine, None) == (tonight, "nightly")


def test_a_reruns_digest_names_the_night_the_ranking_applies_it_to(
        sqlite_engine: Engine) -> None:
    # Two nights of one date, the first resumed and finished last: the ranking's night.
    # Before: the digest said "Applied to the ranking of" the second (the higher id).
    resumed = add_night(sqlite_engine, D2, DUE2, {"AAA": Rated("Buy", 0.8)}, minutes=300)
    add_night(sqlite_engine, D2, DUE2 + timedelta(hours=1), {"AAA": Rated("Hold", 0.1)})
    rerun = add_night(sqlite_engine, D2, DUE2 + timedelta(hours=6), {"AAA": Rated("Sell", -0.8)},
                      kind="rerun")
    assert ranked_night(sqlite_engine) == resumed == nightly_of(sqlite_engine, D2)
    said = build_digest(sqlite_engine, load_settings(), rerun).message.body
    assert f"Applied to the ranking of nightly batch #{resumed}" in said, said
