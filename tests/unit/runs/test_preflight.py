"""Refuse at the start what would fail the night: exit 2, one line, no batch row, no call.

Each start path (``run``, ``run --as-of``, ``run --continue-night``, ``run --resume``,
``rerun``, the scheduler daemon's fire) goes through the one preflight
(app/runs/preflight.py). The server is a fake at the HTTP edge: its ``/v1/models`` for
the endpoint check, its ``/tokenize`` (one token per 4 bytes) for the context check.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
import structlog
from sqlalchemy import Engine, func, insert, select, update

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from agents.data.yfinance_provider import YFinanceProvider
from app.batch import store
from app.config import load_settings
from app.db.batchsettings import BatchSettings
from app.db.models import Batch, LLMCall, TickerRun
from tests.fakevllm import FakeServer
from tests.fakevllm.router import FakeRouter
from tests.unit.support.clirun import CliResult, run_cli
from tests.webhook import closed_port

AS_OF = str(DEMO_AS_OF)
NO_SNAPSHOT = "2020-01-02"
MODEL = "smollm2-135m"  # the settings' default, which the fake serves
# The fake counts the portfolio manager's smallest prompt at about 9,100 tokens with every
# earlier output at its default max_tokens: over 8,192 with its own 768.
SMALL_CONTEXT = 8192
# Bound at import: the tests put their own clients in httpx.Client's place.
BLOCKING = httpx.Client


@pytest.fixture
def tickers(tmp_path: Path) -> list[str]:
    """Write a two-ticker demo snapshot into the home's data folder; return its tickers."""
    write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    return demo_tickers(2)


def counts(engine: Engine) -> tuple[int, int]:
    """Return the rows in batches and in llm_calls."""
    with engine.connect() as conn:
        return (conn.execute(select(func.count()).select_from(Batch)).scalar_one(),
                conn.execute(select(func.count()).select_from(LLMCall)).scalar_one())


def assert_refused(result: CliResult, *says: str) -> None:
    assert result.code == 2, result.stderr
    assert len(result.error_lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for text in says:
        assert text in result.stderr, result.stderr


def serve(monkeypatch: pytest.MonkeyPatch, max_model_len: int) -> FakeServer:
    """Answer /v1/models and /tokenize from a fake with ``max_model_len``; return it."""
    server = FakeServer(model=MODEL, max_model_len=max_model_len)
    monkeypatch.setattr("serving.preflight.httpx.Client", lambda **_: server.sync_client())
    monkeypatch.setattr("app.runs.preflight.http_client", server.client)
    return server


def universe_with(tmp_path: Path, *symbols: str) -> str:
    path = tmp_path / "universe.txt"
    path.write_text("".join(f"{s}\n" for s in symbols))
    return str(path)


# --- the market data --------------------------------------------------------------------


@pytest.mark.parametrize("start", [
    ["run", "--tickers", "{good},NOPE", "--as-of", AS_OF],
    ["run", "--as-of", AS_OF],  # the universe file names it
    ["run", "--continue-night", "--as-of", AS_OF],
    ["rerun", "NOPE", "--as-of", AS_OF],
], ids=["run-tickers", "run-universe", "continue-night", "rerun"])
def test_a_ticker_not_in_the_snapshot_is_refused_before_any_row(
        sqlite_engine: Engine, tmp_path: Path, tickers: list[str], start: list[str]) -> None:
    argv = [word.format(good=tickers[0]) for word in start]
    result = run_cli(*argv, "--no-preflight",
                     env={"NIGHTDESK_UNIVERSE_FILE": universe_with(tmp_path, tickers[1], "NOPE")})
    assert_refused(result, f"not in the snapshot of {AS_OF}", "NOPE")
    assert counts(sqlite_engine) == (0, 0)


@pytest.mark.parametrize("start", [
    ["run", "--as-of", NO_SNAPSHOT],  # the universe would come from the snapshot
    ["run", "--as-of", NO_SNAPSHOT, "--tickers", "AAPL"],
    ["run", "--continue-night", "--as-of", NO_SNAPSHOT],
    ["rerun", "AAPL", "--as-of", NO_SNAPSHOT],
], ids=["run", "run-tickers", "continue-night", "rerun"])
def test_an_as_of_date_without_a_snapshot_is_refused_as_such(
        sqlite_engine: Engine, tickers: list[str], start: list[str]) -> None:
    result = run_cli(*start, "--no-preflight")
    assert_refused(result, f"no snapshot for {NO_SNAPSHOT}")
    assert "no universe" not in result.stderr
    assert counts(sqlite_engine) == (0, 0)


def test_a_resumed_batch_whose_tickers_left_the_snapshot_is_refused(
        sqlite_engine: Engine, tmp_path: Path, tickers: list[str]) -> None:
    crashed = crashed_night(sqlite_engine, tickers)
    (tmp_path / "data" / AS_OF / tickers[1]).rename(tmp_path / "gone")
    result = run_cli("run", "--resume", str(crashed), "--no-preflight")
    assert_refused(result, tickers[1], "not in the snapshot")
    assert "resuming batch" not in result.stderr  # refused before it was announced
    assert counts(sqlite_engine) == (1, 0)
    assert ticker_states(sqlite_engine) == {tickers[0]: "succeeded", tickers[1]: "interrupted"}


# --- the server's context ---------------------------------------------------------------


@pytest.mark.parametrize("start", [
    ["run", "--tickers", "{a},{b}", "--as-of", AS_OF],
    ["run", "--as-of", AS_OF],
    ["run", "--continue-night", "--as-of", AS_OF],
    ["rerun", "{a}", "--as-of", AS_OF],
], ids=["run-tickers", "run", "continue-night", "rerun"])
def test_a_server_context_too_small_for_the_night_is_refused_naming_the_node(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch, tickers: list[str],
        start: list[str]) -> None:
    server = serve(monkeypatch, SMALL_CONTEXT)
    argv = [word.format(a=tickers[0], b=tickers[1]) for word in start]
    result = run_cli(*argv)
    assert_refused(result, "portfolio_manager's prompt at its smallest", "max_tokens 768",
                   f"max_model_len {SMALL_CONTEXT}", "NIGHTDESK_NODE_MAX_TOKENS")
    assert counts(sqlite_engine) == (0, 0)
    assert server.chats == []
    # Cheap: one count teaches the limit, and the largest prompt is counted first.
    assert server.tokenize_calls <= 2


@pytest.mark.parametrize("workers", [True, False], ids=["its-workers", "named-servers"])
def test_behind_a_router_the_night_must_fit_its_shortest_server(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch, tickers: list[str],
        workers: bool) -> None:
    from app.runs.preflight import PreflightRefused, check_context

    # vllm-router sends /tokenize where the body hashes: here always to the long server
    # ("first"), so the count alone told 34,816 and a night of the short one's tickers
    # failed at their calls (docs/lab/2026-12-07-fleet-outside-2.md).
    long, short = (FakeServer(model=MODEL, max_model_len=length)
                   for length in (34_816, SMALL_CONTEXT))
    router = FakeRouter({"http://long.test": long, "http://short.test": short},
                        policy="first", workers=workers)
    monkeypatch.setattr("app.runs.preflight.http_client", router.client)
    settings = load_settings(llm_model=MODEL, llm_base_url=router.base_url,
                             llm_router_servers="" if workers else
                             "http://long.test,http://short.test")
    with pytest.raises(PreflightRefused) as refused:
        check_context(settings, sqlite_engine, DEMO_AS_OF, tickers)
    assert "portfolio_manager's prompt at its smallest" in str(refused.value)
    assert (f"max_model_len {SMALL_CONTEXT} of http://short.test, the shortest server "
            "behind the router") in str(refused.value)
    assert short.tokenize_calls == 0  # counted by the long one; the limit the short one's


def test_a_resume_onto_a_server_too_small_is_refused_and_the_batch_stays_resumable(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch, tickers: list[str]) -> None:
    crashed = crashed_night(sqlite_engine, tickers)
    server = serve(monkeypatch, SMALL_CONTEXT)
    result = run_cli("run", "--resume", str(crashed))
    assert_refused(result, f"max_model_len {SMALL_CONTEXT}")
    assert counts(sqlite_engine) == (1, 0) and server.chats == []
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.status)).scalar_one() == "crashed"
    assert ticker_states(sqlite_engine) == {tickers[0]: "succeeded", tickers[1]: "interrupted"}


def test_a_resume_refused_for_its_context_advises_what_works_for_it(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch, tickers: list[str]) -> None:
    # Recorded as every batch records them: the budgets it ran with (the defaults).
    crashed = crashed_night(sqlite_engine, tickers,
                            node_max_tokens=load_settings().agents.node_max_tokens)
    serve(monkeypatch, SMALL_CONTEXT)
    said = run_cli("run", "--resume", str(crashed)).error_lines
    # A resumed batch keeps its own output budgets: lowering NIGHTDESK_NODE_MAX_TOKENS
    # cannot help it, so the line does not advise that for it.
    lower = '{"analyst": 256, "researcher": 256, "research_manager": 256, "trader": 256, ' \
        '"risk": 256, "portfolio_manager": 256}'
    # (Were it let through, no server answers the night: it would stop within a second.)
    again = run_cli("run", "--resume", str(crashed), env={"NIGHTDESK_NODE_MAX_TOKENS": lower,
                                                         "NIGHTDESK_OUTAGE_BUDGET_S": "1"})
    assert_refused(again, f"max_model_len {SMALL_CONTEXT}")
    assert said == again.error_lines
    [line] = said
    assert "serve a longer --max-model-len" in line and "or lower NIGHTDESK_NODE_MAX" not in line
    assert (f"batch {crashed} keeps the NIGHTDESK_NODE_MAX_TOKENS it ran with; analyze "
            f"{AS_OF} anew with lower ones: `nightdesk run --as-of {AS_OF}`") in line, line
    # That way out fits: the date anew with the lower budgets passes the same check.
    from app.runs.preflight import check_context

    check_context(load_settings(llm_model=MODEL, node_max_tokens=json.loads(lower)),
                  sqlite_engine, DEMO_AS_OF, tickers)


def test_a_resumed_batch_is_checked_in_its_own_shape(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch, tickers: list[str]) -> None:
    from tests.unit.support.engines import fake_llm

    # Recorded with small output budgets, the batch fits the small server, although the
    # settings' defaults of today (1,536 tokens an analyst) would not: it resumes.
    crashed = crashed_night(sqlite_engine, tickers, node_max_tokens=dict.fromkeys(
        ("analyst", "researcher", "research_manager", "trader", "risk", "portfolio_manager"),
        256))
    serve(monkeypatch, SMALL_CONTEXT)
    night = fake_llm(monkeypatch, None, tickers)
    result = run_cli("run", "--resume", str(crashed))
    assert result.code == 0, result.stderr
    assert {c.ticker for c in night.chats} == {tickers[1]}


def test_the_previous_nights_outputs_bound_the_estimate(
        sqlite_engine: Engine, tickers: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from app.runs.preflight import check_context

    serve(monkeypatch, SMALL_CONTEXT)
    settings = load_settings(llm_model=MODEL)
    with pytest.raises(Exception, match=f"max_model_len {SMALL_CONTEXT}"):
        check_context(settings, sqlite_engine, DEMO_AS_OF, tickers)
    # Last night every node of this model wrote at most 400 tokens: tonight's prompts are
    # estimated with that, and fit.
    previous_night(sqlite_engine, tickers[0], completion_tokens=400)
    check_context(settings, sqlite_engine, DEMO_AS_OF, tickers)
    # Another model's night says nothing about this one's.
    with pytest.raises(Exception, match="max_model_len"):
        check_context(load_settings(llm_model="other-model"), sqlite_engine, DEMO_AS_OF,
                      tickers)


def test_a_server_with_room_or_none_to_ask_is_not_refused(
        sqlite_engine: Engine, tickers: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from app.runs.preflight import check_context

    server = serve(monkeypatch, 34_816)
    check_context(load_settings(llm_model=MODEL), sqlite_engine, DEMO_AS_OF, tickers)
    assert server.tokenize_calls == 1  # the rest fit by their bytes alone
    # A server that does not answer is the outage watch's at night (the endpoint check
    # refuses it on the command line): the context check does not.
    monkeypatch.setattr("app.runs.preflight.http_client",
                        lambda: httpx.AsyncClient(timeout=2))
    check_context(load_settings(llm_model=MODEL,
                                llm_base_url=f"http://127.0.0.1:{closed_port()}/v1"),
                  sqlite_engine, DEMO_AS_OF, tickers)
    # No /tokenize (another server): nothing to count with, nothing refused.
    no_count = FakeServer(model=MODEL, max_model_len=1024, tokenize=False)
    monkeypatch.setattr("app.runs.preflight.http_client", no_count.client)
    check_context(load_settings(llm_model=MODEL), sqlite_engine, DEMO_AS_OF, tickers)


def test_no_preflight_skips_the_server_but_not_the_data(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch, tickers: list[str]) -> None:
    server = serve(monkeypatch, SMALL_CONTEXT)
    result = run_cli("run", "--tickers", "NOPE", "--as-of", AS_OF, "--no-preflight")
    assert_refused(result, "NOPE")
    assert server.requests == []  # the server was not asked


# --- the scheduler daemon's fire --------------------------------------------------------


@pytest.mark.parametrize("fault", ["ticker", "context"])
def test_the_daemons_fire_is_refused_before_any_row(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        tickers: list[str], fault: str) -> None:
    from app.runs.nightly import run_nightly
    from tests.unit.support.daemon_clock import NIGHT, daemon_for, running, tick

    overrides: dict[str, Any] = {"data_dir": tmp_path / "data", "llm_model": MODEL}
    if fault == "ticker":
        overrides.update(check_context_length=False,
                         universe_file=universe_with(tmp_path, tickers[0], "NOPE"))
        says = "NOPE"
    else:
        serve(monkeypatch, SMALL_CONTEXT)
        says = f"max_model_len {SMALL_CONTEXT}"
    with structlog.testing.capture_logs() as logs, \
            running(daemon_for(sqlite_engine, run_nightly, **overrides),
                    NIGHT - timedelta(minutes=5)) as daemon:
        tick(daemon, NIGHT)
    failed = [e for e in logs if e["event"] == "nightly run failed"]
    assert len(failed) == 1 and says in failed[0]["error"], logs
    assert failed[0]["log_level"] == "error"
    # The daemon has no --no-preflight: its refusal must not advise one.
    assert "--no-preflight" not in failed[0]["error"]
    assert counts(sqlite_engine) == (0, 0)


@pytest.mark.parametrize("start", [
    ["run", "--tickers", "{a},{b}", "--as-of", AS_OF],
    ["rerun", "{a}", "--as-of", AS_OF],
], ids=["run", "rerun"])
def test_a_command_refused_by_the_server_check_names_its_own_skip_and_it_works(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch, tickers: list[str],
        start: list[str]) -> None:
    serve(monkeypatch, SMALL_CONTEXT)
    argv = [word.format(a=tickers[0], b=tickers[1]) for word in start]
    assert_refused(run_cli(*argv), "(--no-preflight skips this check)")
    # The advice is taken: the same command with the flag gets past the server's check
    # (to the data's, which a ticker the snapshot lacks still fails).
    argv = [word.format(a="NOPE", b=tickers[1]) for word in start]
    assert_refused(run_cli(*argv, "--no-preflight"), "NOPE", "not in the snapshot")


# --- live data --------------------------------------------------------------------------


def test_yfinance_names_the_tickers_it_has_no_prices_for() -> None:
    class Handle:
        def __init__(self, symbol: str) -> None:
            self.symbol = symbol

        def history(self, **_: Any) -> pd.DataFrame:
            if self.symbol == "FLAKY":
                raise OSError("connection reset")  # proves nothing: not called missing
            if self.symbol == "NOPE":
                return pd.DataFrame()
            return pd.DataFrame({"Open": [1.0], "High": [1.0], "Low": [1.0], "Close": [1.0],
                                 "Volume": [10]}, index=pd.DatetimeIndex(["2026-11-26"]))

    provider = YFinanceProvider(ticker_factory=Handle, sleep=lambda _: None)
    assert provider.missing(["AAPL", "NOPE", "FLAKY"], DEMO_AS_OF) == ["NOPE"]


# --- helpers ----------------------------------------------------------------------------


def crashed_night(engine: Engine, tickers: list[str], **shape: Any) -> int:
    """Write a nightly batch killed with ``tickers[0]`` done; return its id."""
    batch = store.create_batch(engine, kind="nightly", as_of=DEMO_AS_OF, tickers=tickers,
                               samples=1, settings=BatchSettings.read(
                                   {"samples": 1, "strategy": "adaptive", **shape}),
                               server_facts=None)
    store.ticker_finished(engine, batch, tickers[0], [store.DecisionRow(
        tickers[0], 0, "Hold", 0.0, 0.5, "stored before the crash")], None)
    with engine.begin() as conn:
        conn.execute(update(Batch).where(Batch.id == batch).values(status="crashed"))
        conn.execute(update(TickerRun)
                     .where(TickerRun.batch_id == batch, TickerRun.ticker != tickers[0])
                     .values(status="interrupted"))
    return batch


def ticker_states(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return {t: s for t, s in conn.execute(select(TickerRun.ticker, TickerRun.status))}


def previous_night(engine: Engine, ticker: str, completion_tokens: int) -> None:
    """Record a finished nightly batch of MODEL whose every node wrote ``completion_tokens``."""
    from agents.graph import node_names

    batch = store.create_batch(engine, kind="nightly", as_of=DEMO_AS_OF - timedelta(days=1),
                               tickers=[ticker], samples=1, settings=BatchSettings(),
                               server_facts=None)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        for node in node_names(load_settings().pipeline()):
            conn.execute(insert(LLMCall).values(
                batch_id=batch, ticker=ticker, node=node, sample=0, attempt=1, model=MODEL,
                prompt_tokens=1000, completion_tokens=completion_tokens, status="ok",
                started_at=now, ended_at=now, latency_s=1.0))
    store.finish_batch(engine, batch, "succeeded")


def test_a_resumed_batch_whose_stored_strategy_no_longer_parses_is_refused(
        sqlite_engine: Engine, tickers: list[str]) -> None:
    # Stored by a version with the knob budget=off (removed: adaptive always has the budget).
    crashed = crashed_night(sqlite_engine, tickers, strategy="adaptive:budget=off")
    result = run_cli("run", "--resume", str(crashed), "--no-preflight")
    assert_refused(result, f"batch {crashed} cannot resume", "bad knob 'budget=off'")
    assert "resuming batch" not in result.stderr  # refused before it was announced
    assert counts(sqlite_engine) == (1, 0)
    assert ticker_states(sqlite_engine) == {tickers[0]: "succeeded", tickers[1]: "interrupted"}


# --- the load the night reads -----------------------------------------------------------


def gateway(hidden: set[str]) -> Any:
    """A blocking client of a gateway (gw.test) serving MODEL that answers 404 on ``hidden``
    paths, and of two servers behind it (s1.test answering /metrics, s2.test not at all)."""
    def handle(request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        if host == "s2.test" or (host == "gw.test" and path in hidden):
            return httpx.Response(404, json={"detail": "Not Found"})
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": MODEL, "max_model_len": 34_816}]})
        if path == "/metrics":
            return httpx.Response(200, text=FakeServer(model=MODEL).load.metrics_text())
        return httpx.Response(404, json={"detail": "Not Found"})
    return lambda **_: BLOCKING(transport=httpx.MockTransport(handle))


def test_a_gateway_hiding_metrics_is_refused_at_the_start_naming_the_setting() -> None:
    # Run, it was a night stalled: every reading failed, the endpoint read as down and the
    # night waited out its outage budget (docs/lab/2026-12-07-fleet-outside-2.md).
    from app.runs.preflight import PreflightRefused, check_endpoints

    def check(hidden: set[str], servers: str = "") -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("serving.preflight.httpx.Client", gateway(hidden))
            check_endpoints(load_settings(llm_model=MODEL, llm_base_url="http://gw.test/v1",
                                          llm_router_servers=servers))

    with pytest.raises(PreflightRefused) as refused:
        check({"/metrics", "/workers"})
    assert str(refused.value).startswith("preflight: http://gw.test/metrics answered HTTP 404")
    assert "name its vLLM servers in NIGHTDESK_LLM_ROUTER_SERVERS" in str(refused.value)
    check({"/workers"})  # its own /metrics answers: read as one server's, as before
    check({"/metrics", "/workers"}, "http://s1.test,http://s2.test")  # one named answers
    with pytest.raises(PreflightRefused, match="no server in NIGHTDESK_LLM_ROUTER_SERVERS"):
        check({"/metrics", "/workers"}, "http://s2.test")
