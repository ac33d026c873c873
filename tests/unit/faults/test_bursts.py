"""429 and 503 bursts of 1 to 30 answers at the start, middle and end of a night, on SQLite:
every ticker succeeds, or the batch stops resumable and one `run --resume` finishes it;
``llm_calls`` equals the fake server's request log (the scenarios: bursts.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from agents.data.demo import DEMO_AS_OF
from app.batch.engine import BatchPlan
from app.db.models import LLMCall
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
    first_chat = next(i for i, r in enumerate(server.requests) if r.path.endswith("/completions"))
    assert [r.path for r in server.requests[:first_chat] if r.path.endswith("/models")] == [
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


def test_a_burst_past_the_budget_during_the_resume_stops_it_resumable_again(
        sqlite_engine: Engine, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The server sheds load past the outage budget in the night and again in its resume:
    # each stops interrupted (exit 5) saying the same resume, which a third run finishes.
    # Across the three runs llm_calls equals the servers' request logs, and the report's
    # counts are the rows' (nothing counted twice by a run that took the batch up).
    url = sqlite_engine.url.render_as_string(hide_password=False)
    env = {**QUICK_ENV, "NIGHTDESK_DATABASE_URL": url, "NIGHTDESK_OUTAGE_BUDGET_S": "0.3"}
    servers = []
    for argv, at in [(("run", "--tickers", ",".join(TICKERS), "--as-of", str(DEMO_AS_OF)), 12),
                     (("run", "--resume"), 3), (("run", "--resume"), None)]:
        server = FakeServer(nodes=NODES, tickers=TICKERS)
        if at is not None:
            server.burst(503, 10_000, at=at)
        servers.append(server)
        serve_cli_from(monkeypatch, server, demo_dir)
        result = run_cli(*argv, "--no-preflight", env=env)
        if at is None:
            assert result.code == 0, result.stderr
            assert "resuming batch 1 (nightly, interrupted" in result.stderr
        else:
            assert result.code == 5, result.stderr
            assert result.error_lines[-1].endswith(
                "past the outage budget (0.3 s); resume with `nightdesk run --resume 1`")
            assert "failed" not in {s for s, _ in ticker_states(sqlite_engine, 1).values()}
    assert all(server.chats for server in servers)  # each run called its own server
    assert ticker_states(sqlite_engine, 1) == dict.fromkeys(TICKERS, ("succeeded", None))
    assert_rows_match_the_servers(sqlite_engine, 1, servers)
    report = json.loads(run_cli("report", "--format", "json", env=env).stdout)
    with sqlite_engine.connect() as conn:
        rows = conn.execute(select(func.count(), func.count().filter(LLMCall.status != "ok"),
                                   func.sum(LLMCall.prompt_tokens),
                                   func.sum(LLMCall.completion_tokens))).one()
    assert (report["attempts"], report["failed_attempts"], report["prompt_tokens"],
            report["completion_tokens"]) == tuple(rows)
    assert report["attempts"] == sum(len(server.chats) for server in servers)
