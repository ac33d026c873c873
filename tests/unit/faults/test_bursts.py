"""429 and 503 bursts of 1 to 30 answers at the start, middle and end of a night, on SQLite:
every ticker succeeds, or the batch stops resumable and one `run --resume` finishes it;
``llm_calls`` equals the fake server's request log (the scenarios: bursts.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import Engine

from agents.data.demo import DEMO_AS_OF, write_demo
from app.batch.engine import BatchPlan
from serving.preflight import check_endpoint
from tests.fakevllm import BASE_URL, FakeServer, Reply
from tests.unit.support.bursts import (
    PAST_THE_BUDGET,
    TICKERS,
    WAITED_OUT,
    Burst,
    past_the_budget,
    waited_out,
)
from tests.unit.support.clirun import run_cli
from tests.unit.support.fault_night import (
    NODES,
    QUICK_ENV,
    assert_rows_match_the_servers,
    night_engine,
    serve_cli_from,
    ticker_states,
)


@pytest.fixture
def demo_dir(tmp_path: Path) -> Path:
    write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    return tmp_path / "data"


@pytest.mark.parametrize("burst", WAITED_OUT, ids=str)
async def test_a_burst_within_the_budget_is_waited_out_and_every_ticker_succeeds(
        sqlite_engine: Engine, demo_dir: Path, burst: Burst) -> None:
    await waited_out(sqlite_engine, demo_dir, burst)


@pytest.mark.parametrize("burst", PAST_THE_BUDGET, ids=str)
def test_a_burst_past_the_budget_stops_the_night_resumable_and_one_resume_ends_it(
        sqlite_engine: Engine, demo_dir: Path, burst: Burst,
        monkeypatch: pytest.MonkeyPatch) -> None:
    past_the_budget(sqlite_engine, demo_dir, burst, monkeypatch)


@pytest.mark.parametrize("status", [429, 503])
def test_a_burst_at_the_nights_start_is_waited_out_not_refused_by_the_preflight(
        sqlite_engine: Engine, demo_dir: Path, monkeypatch: pytest.MonkeyPatch,
        status: int) -> None:
    # The server sheds load as the night starts: its /v1/models (the preflight's check)
    # and the first chat requests answer `status`. The busy answer is no verdict on the
    # settings: the night starts, waits the burst out and every ticker succeeds.
    model = "smollm2-135m"  # the settings' default
    server = FakeServer(nodes=NODES, tickers=TICKERS, model=model)
    server.cue(Reply(status=status, headers={"Retry-After": "1"}), times=2, path="/v1/models")
    server.burst(status, 8, retry_after="1")
    monkeypatch.setattr("serving.preflight.httpx.Client", lambda **_: server.sync_client())
    serve_cli_from(monkeypatch, server, demo_dir)
    url = sqlite_engine.url.render_as_string(hide_password=False)
    result = run_cli("run", "--tickers", ",".join(TICKERS), "--as-of", str(DEMO_AS_OF),
                     env={**QUICK_ENV, "NIGHTDESK_DATABASE_URL": url})
    assert result.code == 0, result.stderr
    assert [r.path for r in server.requests if r.path.endswith("/models")] == [
        "/v1/models"]  # checked once, busy: not asked again and not refused
    assert server.burst_answers == 8
    assert ticker_states(sqlite_engine, 1) == dict.fromkeys(TICKERS, ("succeeded", None))
    assert_rows_match_the_servers(sqlite_engine, 1, [server])
    # What the preflight says of each answer (serving/preflight.py): busy passes with a
    # warning; another server error still refuses, saying so rather than blaming the URL.
    for answer, level, says in [(status, "warn", f"HTTP {status} (busy)"),
                                (502, "fail", "HTTP 502: the server, or a proxy before it")]:
        one = FakeServer(model=model)
        one.cue(Reply(status=answer), path="/v1/models")
        check = check_endpoint(BASE_URL, model, client=one.sync_client())
        assert (check.level, says in check.detail) == (level, True), check
        assert "OpenAI-compatible" not in check.detail


def test_a_burst_on_tokenize_is_no_chat_attempt_and_costs_no_ticker(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    # With the context check on (the default), each prompt is counted with /tokenize
    # before its chat request. A burst there longer than the count's own tries: the
    # prompts go out uncounted, and llm_calls holds the chat requests the server saw, no
    # row (and no attempt used up) for a /tokenize answer.
    server = FakeServer(nodes=NODES, tickers=TICKERS)
    server.cue(Reply(status=503, headers={"Retry-After": "1"}), times=60, path="/tokenize")
    outcome = asyncio.run(night_engine(sqlite_engine, demo_dir, server,
                                       check_context_length=True).run(
        BatchPlan("nightly", DEMO_AS_OF, TICKERS)))
    assert outcome.status == "succeeded", outcome.failed
    assert server.tokenize_calls > 60  # the whole burst was met, then counts again
    assert ticker_states(sqlite_engine, outcome.batch_id) == dict.fromkeys(
        TICKERS, ("succeeded", None))
    assert_rows_match_the_servers(sqlite_engine, outcome.batch_id, [server])
