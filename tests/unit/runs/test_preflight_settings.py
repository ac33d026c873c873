"""Refuse a batch whose settings cannot work before anything is written: one line, exit 2."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, inspect, select

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from app.db.engine import get_engine
from app.db.models import Batch, NightRefusal
from serving.preflight import check_endpoint
from tests.fakevllm import FakeServer, Reply
from tests.unit.support.clirun import run_cli
from tests.unit.support.llm_calls import one_call
from tests.webhook import closed_port


def test_check_endpoint_names_what_is_wrong() -> None:
    server = FakeServer(model="qwen-dense-27b")
    url = "http://gpu.test:8000/v1"
    ok = check_endpoint(url, "qwen-dense-27b", client=server.sync_client())
    assert ok.level == "ok"
    wrong_model = check_endpoint(url, "smollm2-135m", client=server.sync_client())
    assert wrong_model.level == "fail" and "does not serve 'smollm2-135m'" in wrong_model.detail
    assert "qwen-dense-27b" in wrong_model.detail
    keyed = FakeServer(model="qwen-dense-27b", api_key="right")
    bad_key = check_endpoint(url, "qwen-dense-27b", "wrong", client=keyed.sync_client())
    assert bad_key.level == "fail" and "HTTP 401" in bad_key.detail
    assert keyed.requests[-1].headers["authorization"] == "Bearer wrong"  # the key was sent


@pytest.fixture
def night(tmp_path: Path) -> list[str]:
    """Return ``run`` of one ticker of a snapshot in place (the home's data folder)."""
    write_demo(tmp_path / "data", DEMO_AS_OF, 1)
    return ["run", "--tickers", demo_tickers(1)[0], "--as-of", str(DEMO_AS_OF)]


@pytest.mark.parametrize(("setting", "value", "says"), [
    ("NIGHTDESK_LLM_BASE_URL", "ftp://127.0.0.1:8000/v1", "NIGHTDESK_LLM_BASE_URL"),
    ("NIGHTDESK_LLM_BASE_URL", "127.0.0.1:8000", "NIGHTDESK_LLM_BASE_URL"),
    ("NIGHTDESK_LLM_BASE_URL", "http://127.0.0.1:{port}/v1", "cannot reach"),
])
def test_run_refuses_bad_settings_in_one_line_without_a_batch_row(
        sqlite_url: str, night: list[str], setting: str, value: str, says: str) -> None:
    result = run_cli(*night, env={setting: value.format(port=closed_port())})
    assert result.code == 2, result.stderr
    assert len(result.error_lines) == 1 and says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    engine = get_engine(sqlite_url)
    if "batches" in inspect(engine).get_table_names():  # settings fail before the database
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(Batch)).scalar() == 0


def test_run_refuses_a_model_the_server_does_not_serve(
        sqlite_url: str, night: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    server = FakeServer(model="qwen-dense-27b")
    monkeypatch.setattr("serving.preflight.httpx.Client", lambda **_: server.sync_client())
    result = run_cli(*night)
    assert result.code == 2 and len(result.error_lines) == 1, result.stderr
    assert "does not serve 'smollm2-135m'" in result.stderr
    # Checked under the nightly lock (a second start says "already running" first), so the
    # schema is there, but no batch row was written.
    with get_engine(sqlite_url).connect() as conn:
        assert conn.execute(select(func.count()).select_from(Batch)).scalar() == 0


def test_replay_refuses_a_server_that_does_not_answer_before_its_row(
        sqlite_url: str, sqlite_engine: Engine) -> None:
    # The recorded prompts ran once; the server they go to now is asked before the replay's
    # batch row exists (without it the replay would wait out the outage budget).
    _, (row,) = asyncio.run(one_call(sqlite_engine, FakeServer()))  # a batch to replay
    result = run_cli("replay", "--batch", str(row.batch_id),
                     "--base-url", f"http://127.0.0.1:{closed_port()}/v1")
    assert result.code == 2, result.stderr
    assert len(result.error_lines) == 1 and "cannot reach" in result.stderr, result.stderr
    with get_engine(sqlite_url).connect() as conn:
        assert conn.execute(select(func.count()).select_from(Batch)).scalar() == 1  # its own


def test_a_model_not_served_is_refused_naming_the_model_asked_and_every_one_served(
        sqlite_url: str, night: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # The wording on its own: the model asked, each model the server serves (or nothing),
    # the setting to change; one line wherever it is told, the URL's password masked.
    url = "http://nightdesk:s3cret@gpu.test:8000/v1"
    for served, says in ((["qwen-dense-27b", "qwen-moe"], "qwen-dense-27b, qwen-moe"),
                         ([], "nothing")):
        server = FakeServer()
        listed = {"object": "list", "data": [{"id": m, "object": "model"} for m in served]}
        server.cue(Reply(page=json.dumps(listed), page_type="application/json"),
                   path="/v1/models")
        client = server.sync_client()
        monkeypatch.setattr("serving.preflight.httpx.Client", lambda **_: client)  # noqa: B023
        result = run_cli(*night, env={"NIGHTDESK_LLM_BASE_URL": url})
        line = ("preflight: the server at http://nightdesk:***@gpu.test:8000/v1 does not serve "
                f"'smollm2-135m' (it serves: {says}); set NIGHTDESK_LLM_MODEL")
        assert (result.code, result.error_lines) == (
            2, [f"error: {line} (--no-preflight skips this check)"]), result.stderr
        with get_engine(sqlite_url).connect() as conn:
            stored = conn.execute(select(NightRefusal.why)
                                  .order_by(NightRefusal.id.desc())).scalars().first()
        assert stored == line  # the banner's, `ranking`'s and the digest's reason
