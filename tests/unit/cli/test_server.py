"""Check that ``--arg FLAG=VALUE`` overrides a profile's server arguments, or fails in one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.cli.server import _profile
from app.config import load_settings
from app.errors import InputError
from tests.unit.support.clirun import run_cli


def test_arg_overrides_turn_flags_off_and_set_values() -> None:
    profile = _profile(load_settings(), "cpu-tiny",
                       ["enable-prefix-caching=false", "max-num-batched-tokens=4096"])
    assert profile.args["enable-prefix-caching"] is False
    assert profile.args["max-num-batched-tokens"] == 4096
    assert _profile(load_settings(), "cpu-tiny").args["enable-prefix-caching"] is True


def test_arg_without_value_is_an_input_error() -> None:
    with pytest.raises(InputError, match="FLAG=VALUE"):
        _profile(load_settings(), "cpu-tiny", ["enable-prefix-caching"])


def test_the_readmes_way_to_move_make_runs_port_moves_the_server() -> None:
    root = Path(__file__).resolve().parents[3]
    found = re.search(r"`NIGHTDESK_LLM_BASE_URL=(http://127\.0\.0\.1:(\d+)/v1) make run`",
                      (root / "README.md").read_text())
    assert found, "README no longer says how to move make run's port"
    url, port = found.groups()
    # What `make run` runs: the CPU settings file, the environment on top.
    result = run_cli("server", "command", "--profile", "cpu-tiny",
                     env={"NIGHTDESK_CONFIG": str(root / "deploy" / "cpu-tiny.toml"),
                          "NIGHTDESK_LLM_BASE_URL": url})
    assert result.code == 0, result.stderr
    assert f"--port {port} " in result.stdout and port != "8000"
