"""Read the morning in headless Chromium as an operator does, after good, bad and missing nights.

Each test writes its nights into a SQLite file (``tests.unit.support.night_rows``: batch rows,
ticker runs, decisions, node texts, as a batch leaves them), serves it with a real
``nightdesk web`` process and reads the pages in Debian's chromium through Playwright:
the banner after a failed, a partial, a crashed and a missed night, the change column and
the Changes section across two nights, a running batch's page reloading itself as the night goes on,
and a ticker's page after its night failed. The schedule is set two hours before now, so
"tonight" is whatever the clock says. Screenshots go to ``NIGHTDESK_TEST_SCREENSHOTS``
(the README's are made so), else to a temporary folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.sync_api import Browser
from sqlalchemy import insert, update

from app.db.engine import get_engine, upgrade
from app.db.models import Batch, NightRefusal, TickerRun
from tests.integration.browser import PASSWORD, USER, new_page
from tests.integration.browser import served as web_served
from tests.unit.support.night_rows import SETTINGS, Rated, add_night, table

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime.now(UTC).replace(second=0, microsecond=0)
DUE = NOW - timedelta(hours=2)  # tonight's due time: the schedule fired two hours ago
YESTERDAY = DUE - timedelta(days=1)
D1, D2 = YESTERDAY.date() - timedelta(days=1), DUE.date() - timedelta(days=1)
CRON = f"{DUE.minute} {DUE.hour} * * *"


@contextmanager
def served(home: Path) -> Iterator[str]:
    """Serve ``home``'s database with a real ``nightdesk web``; yield its base URL."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NIGHTDESK_") or k.startswith("NIGHTDESK_TEST_")}
    env.update(NIGHTDESK_HOME=str(home), NIGHTDESK_DATABASE_URL=f"sqlite:///{home}/nd.db",
               NIGHTDESK_SCHEDULE_CRON=CRON, NIGHTDESK_SCHEDULE_TIMEZONE="UTC",
               NIGHTDESK_WEB_USER=USER, NIGHTDESK_WEB_PASSWORD=PASSWORD,
               NIGHTDESK_LOG_FORMAT="json", PYTHONPATH=str(ROOT))
    with web_served(env, home) as base:
        yield base


@pytest.fixture
def home(tmp_path: Path) -> Path:
    upgrade(f"sqlite:///{tmp_path}/nd.db")
    return tmp_path


def _engine(home: Path):  # type: ignore[no-untyped-def]
    return get_engine(f"sqlite:///{home}/nd.db")


GOOD = {"AAA": Rated("Buy", 0.8, texts={"news": table(guidance="bullish", demand="bullish")}),
        "BBB": Rated("Hold", 0.05), "CCC": Rated("Overweight", 0.3),
        "DDD": Rated("Sell", -0.7, texts={"market": table(trend="bearish", volume="neutral"),
                                          "trader": "PROPOSAL: SELL"})}


def test_the_banner_after_a_failed_night(home: Path, browser: Browser, shots: Path) -> None:
    engine = _engine(home)
    first = add_night(engine, D1, YESTERDAY, GOOD)
    second = add_night(engine, D2, DUE, {t: Rated(error="LLMHTTPError: 404 model not served")
                                         for t in GOOD},
                       status="failed", error="the server does not serve the model")
    with served(home) as base:
        page = new_page(browser)
        page.goto(base + "/")
        banner = page.locator("#banner")
        assert banner.is_visible()
        assert f"batch #{second} (as of {D2}), failed: the server does not serve the model" \
            in banner.inner_text()
        assert f"this ranking is of {D1} (batch #{first})" in banner.inner_text()
        assert page.locator("#night .status").first.inner_text() == "failed"
        # Every ticker failed: no ranking shows the night, so no rerun of one would be
        # applied; the banner advises the resume that runs them again in it, as code, and
        # shows no backtick.
        assert page.locator("#banner code").all_inner_texts() == [
            f"nightdesk run --resume {second} --retry-failed"]
        assert "`" not in banner.inner_text() and "nightdesk rerun" not in banner.inner_text()
        # The older ranking is still there, under the banner; its failed tickers' section
        # names the night it describes.
        assert page.locator("#ranking tbody tr").count() == len(GOOD)
        assert f"batch #{first}" in page.locator("#failed-heading").inner_text()
        page.screenshot(path=shots / "morning-failed-night.png", full_page=True)
        # "batch #N" in the banner is a link to the batch's page.
        banner.get_by_role("link", name=f"batch #{second}").click()
        page.wait_for_url(f"{base}/batches/{second}")
        page.context.close()


def test_the_banner_of_a_partial_night(home: Path, browser: Browser, shots: Path) -> None:
    engine = _engine(home)
    add_night(engine, D1, YESTERDAY, GOOD)
    tonight = add_night(engine, D2, DUE, {**GOOD, "EEE": Rated(
        error="DataError: no prices for EEE")})
    with served(home) as base:
        page = new_page(browser)
        page.goto(base + "/")
        banner = page.locator("#banner")
        assert banner.is_visible() and banner.get_attribute("data-status") == "partial"
        text = " ".join(banner.inner_text().split())
        assert text.startswith(f"A partial night. nightly batch #{tonight} (as of {D2}) "
                               f"partial: {len(GOOD)} of {len(GOOD) + 1} tickers")
        assert "1 of its tickers has no rating" in text
        assert page.locator("#banner code").all_inner_texts() == [
            f"nightdesk rerun EEE --as-of {D2}"]
        assert page.locator("#failed tbody tr td:first-child").all_inner_texts() == ["EEE"]
        page.screenshot(path=shots / "morning-partial-night.png", full_page=True)
        # EEE's rerun of the night rated it: no ticker lacks a rating, so no banner says
        # "0 of its tickers have no rating"; the night's own line still says partial.
        add_night(engine, D2, DUE + timedelta(minutes=90), {"EEE": Rated("Hold", 0.0)},
                  kind="rerun")
        page.reload()
        assert page.locator("#banner").count() == 0
        assert page.locator("#night .status").first.inner_text() == "partial"
        page.context.close()


def test_the_banner_of_a_crashed_night(home: Path, browser: Browser, shots: Path) -> None:
    engine = _engine(home)
    first = add_night(engine, D1, YESTERDAY, GOOD)
    # SIGKILLed an hour after its start: still marked running, its heartbeat an hour old.
    dead = add_night(engine, D2, DUE, {"AAA": Rated("Buy", 0.7), "BBB": Rated(status="running"),
                                       "CCC": Rated(status="queued")},
                     status="running", heartbeat=DUE + timedelta(hours=1), calls=20)
    with served(home) as base:
        page = new_page(browser)
        page.goto(base + "/")
        banner = page.locator("#banner")
        text = " ".join(banner.inner_text().split())
        assert f"batch #{dead} (as of {D2}), crashed: no sign of life since" in text
        assert f"this ranking is of {D1} (batch #{first})" in text
        assert page.locator("#banner code").all_inner_texts() == [
            f"nightdesk run --resume {dead}"]
        assert page.locator("#night").get_attribute("data-status") == "crashed"
        # No progress, no time left, no reload for a night that is dead.
        assert page.locator(".progress").count() == 0
        assert page.locator("meta[http-equiv=refresh]").count() == 0
        page.screenshot(path=shots / "morning-crashed-night.png", full_page=True)
        # The batches page says the same.
        page.goto(base + "/batches")
        assert page.locator(f"#batches tr[data-batch='{dead}'] .status").inner_text() == \
            "crashed"
        page.context.close()


def test_the_banner_after_a_missed_night(home: Path, browser: Browser, shots: Path) -> None:
    engine = _engine(home)
    first = add_night(engine, D1, YESTERDAY, GOOD)
    with served(home) as base:
        page = new_page(browser)
        page.goto(base + "/")
        text = page.locator("#banner").inner_text()
        assert "stale: no nightly batch since the night due " \
               f"{DUE.strftime('%Y-%m-%d %H:%M')} UTC" in text
        assert f"batch #{first}" in text
        assert page.locator("#night").get_attribute("data-status") == "stale"
        assert page.locator("#banner").get_attribute("data-status") == "stale"
        # The latest night succeeded, so nothing of its own is left to do; the night that
        # did not come is owed, and the banner says how to start it (the timer's command).
        assert page.locator("#banner code").all_inner_texts() == [
            "nightdesk run --continue-night"]
        assert (DUE + timedelta(days=1)).strftime("%Y-%m-%d %H:%M") in \
            page.locator("#schedule").inner_text()
        page.screenshot(path=shots / "morning-missed-night.png", full_page=True)
        page.context.close()


def test_the_banner_names_a_night_refused_at_its_start(home: Path, browser: Browser) -> None:
    engine = _engine(home)
    add_night(engine, D1, YESTERDAY, GOOD)
    refused_at = DUE + timedelta(seconds=20)
    with engine.begin() as conn:  # as app.runs.preflight.tell_refusal stores it
        conn.execute(insert(NightRefusal).values(
            refused_at=refused_at, as_of=D2, title=f"night of {D2} REFUSED at its start, no "
            "batch run", why="preflight: cannot reach http://127.0.0.1:9/v1/models",
            advice="fix that, then start the night again: nightdesk run --continue-night",
            command="nightdesk run --continue-night"))
    with served(home) as base:
        page = new_page(browser)
        page.goto(base + "/")
        text = " ".join(page.locator("#banner").inner_text().split())
        assert (f"night of {D2} REFUSED at its start, no batch run "
                f"({refused_at.strftime('%Y-%m-%d %H:%M')} UTC): preflight: cannot reach "
                "http://127.0.0.1:9/v1/models") in text, text
        assert page.locator("#banner code").all_inner_texts() == [
            "nightdesk run --continue-night"]
        page.context.close()


def test_the_change_column_and_the_changes_section(home: Path, browser: Browser,
                                                   shots: Path) -> None:
    engine = _engine(home)
    add_night(engine, D1, YESTERDAY, {
        "AAA": Rated("Hold", 0.0, texts={"news": table(guidance="bearish", demand="neutral")}),
        "BBB": Rated("Buy", 0.7, texts={"trader": "PROPOSAL: BUY", "bear_r1": "bullish",
                                        "portfolio_manager": "Rating: Buy"}),
        "CCC": Rated("Overweight", 0.25), "EEE": Rated("Sell", -0.6),
        # Outside its band (Overweight +0.15…+0.50), as is tonight's Hold at +0.92.
        "GGG": Rated("Overweight", -0.5)})
    add_night(engine, D2, DUE, {**GOOD, "BBB": Rated("Sell", -0.75, texts={
        "trader": "PROPOSAL: SELL", "bear_r1": "bearish", "portfolio_manager": "Rating: Sell"}),
        "EEE": Rated(error="DataError: no prices for EEE"), "GGG": Rated("Hold", 0.92)})
    with served(home) as base:
        page = new_page(browser)
        page.goto(base + "/")
        # Tonight's partial night is the latest: its banner says partial, not "not latest".
        assert page.locator("#banner").get_attribute("data-status") == "partial"
        row = page.locator("#ranking tr[data-ticker='AAA'] td")
        assert row.nth(6).inner_text().split() == ["Hold", "+0.00,", "rank", "3"]
        assert row.nth(7).inner_text() == "▲ upgrade"
        assert page.locator("#ranking tr[data-ticker='DDD'] td").nth(7).inner_text() == "new"
        changes = page.locator("#changes tbody tr")
        assert changes.evaluate_all("rows => rows.map(r => r.dataset.ticker)") == \
            ["BBB", "GGG", "AAA", "DDD", "EEE"]
        bbb = page.locator("#changes tr[data-ticker='BBB'] td")
        assert bbb.nth(4).inner_text() == "-1.45"
        # The why column names the bear researcher, not the trader or the portfolio manager
        # (whose stance is the rating), though both turned as far.
        assert bbb.nth(5).inner_text() == "moved most: bear_r1 bullish→bearish (-2.00)"
        # The model's ratings contradicted their scores: graded by score, with "!" and a why
        # that says the model's word was overruled.
        ggg = page.locator("#changes tr[data-ticker='GGG'] td")
        assert (ggg.nth(1).inner_text(), ggg.nth(4).inner_text()) == ("▲ upgrade", "+1.42")
        assert ggg.nth(2).inner_text().split() == ["Sell", "!", "-0.50"]
        assert ggg.nth(3).inner_text().split() == ["Buy", "!", "+0.92"]
        assert ggg.nth(5).inner_text() == (
            "! the model's own rating lay outside its score's band in 1 of 1 sample(s) the "
            "night before and 1 of 1 sample(s) tonight (the rating shown is its score's "
            "band); node outputs not stored for one of the nights")
        assert "news" in page.locator("#changes tr[data-ticker='AAA'] td").nth(5).inner_text()
        page.locator("#changes-heading").scroll_into_view_if_needed()
        page.screenshot(path=shots / "morning-changes.png", full_page=True)
        page.context.close()


def test_a_running_batch_page_refreshes_itself(home: Path, browser: Browser,
                                               shots: Path) -> None:
    engine = _engine(home)
    add_night(engine, D1, YESTERDAY, GOOD)
    running = add_night(engine, D2, DUE, {"AAA": Rated("Buy", 0.7),
                                          "BBB": Rated(status="running"),
                                          "CCC": Rated(status="queued"),
                                          "DDD": Rated(error="DataError: no prices")},
                        status="running", heartbeat=datetime.now(UTC), calls=20)
    with served(home) as base:
        page = new_page(browser)
        page.goto(f"{base}/batches/{running}")
        assert page.locator("#running tbody tr td:first-child").all_inner_texts() == \
            ["BBB", "CCC"]
        assert page.locator("#failed tbody tr td:first-child").all_inner_texts() == ["DDD"]
        assert "2 of 4 tickers done" in page.locator("#progress").inner_text()
        page.screenshot(path=shots / "batch-running.png", full_page=True)
        # The night goes on: BBB finishes. The page shows it without anyone reloading it.
        with engine.begin() as conn:
            conn.execute(update(TickerRun).where(TickerRun.batch_id == running,
                                                 TickerRun.ticker == "BBB")
                         .values(status="succeeded"))
            conn.execute(update(Batch).where(Batch.id == running)
                         .values(tickers_succeeded=2, heartbeat_at=datetime.now(UTC)))
        with page.expect_navigation(timeout=60_000):
            pass  # the page's own reload (every 30 s while the batch runs)
        assert "3 of 4 tickers done" in page.locator("#progress").inner_text()
        assert page.locator("#running tbody tr td:first-child").all_inner_texts() == ["CCC"]
        # The ranking page reloads too, and names the running night.
        page.goto(base + "/")
        assert page.locator("meta[http-equiv=refresh]").count() == 1
        assert page.locator("#night").get_attribute("data-status") == "running"
        page.context.close()


def test_the_ticker_page_after_a_failed_night(home: Path, browser: Browser,
                                              shots: Path) -> None:
    engine = _engine(home)
    first = add_night(engine, D1, YESTERDAY, GOOD)
    second = add_night(engine, D2, DUE, {**GOOD, "AAA": Rated(
        error="LLMTimeoutError: no answer within 600 s")})
    with served(home) as base:
        page = new_page(browser)
        page.goto(base + "/ticker/AAA")
        tonight = page.locator("#tonight")
        assert tonight.get_attribute("data-state") == "failed"
        assert " ".join(tonight.inner_text().split()) == (
            f"Tonight: failed in nightly batch #{second} (as of {D2}, batch partial): "
            "LLMTimeoutError: no answer within 600 s")
        assert " ".join(page.locator("#last-good").inner_text().split()) == (
            f"Last good rating: Buy score +0.80, rank 1, as of {D1} (batch #{first}).")
        page.screenshot(path=shots / "ticker-failed-night.png", full_page=True)
        page.context.close()


def test_the_night_before_passes_over_a_demo_night_and_says_which_views_were_unread(
        home: Path, browser: Browser) -> None:
    # Market nights on D1 - 1 and D2, a DEMO night on D1 between. Before: AAA had no Was and
    # no change (the DEMO night, of another universe, was the only night before tried), and
    # a why with no move read "no node's stance moved by 0.1 or more" where the night
    # before's market analyst had written no stance word.
    engine = _engine(home)
    market = {**SETTINGS, "demo_data": False}
    first = add_night(engine, D1 - timedelta(days=1), YESTERDAY - timedelta(days=1), {
        "AAA": Rated("Buy", 0.8, texts={"market": "no view at all", "trader": "PROPOSAL: BUY"}),
        "BBB": Rated("Hold", 0.05)}, settings=market)
    add_night(engine, D1, YESTERDAY, {"AAA.DEMO": Rated("Hold", 0.0)})
    add_night(engine, D2, DUE, {
        "AAA": Rated("Sell", -0.7, texts={"market": table(trend="bearish", volume="bearish"),
                                          "trader": "PROPOSAL: SELL"}),
        "BBB": Rated("Hold", 0.05)}, settings=market)
    with served(home) as base:
        page = new_page(browser)
        page.goto(base + "/")
        row = page.locator("#ranking tr[data-ticker='AAA'] td")
        assert row.nth(6).inner_text().split() == ["Buy", "+0.80,", "rank", "1"]
        assert row.nth(7).inner_text() == "▼ downgrade"
        why = page.locator("#changes tr[data-ticker='AAA'] td").nth(5).inner_text()
        assert why == "no view's stance read on both nights; read on one night only: market"
        assert " ".join(page.locator("#changes-heading").inner_text().split()) == \
            f"Changes since {D1 - timedelta(days=1)} (batch #{first})"
        page.context.close()
