"""Check that ``--arg FLAG=VALUE`` overrides a profile's server arguments, or fails in one line."""

from __future__ import annotations

import pytest

from app.cli.server import _profile
from app.config import load_settings
from app.errors import InputError


def test_arg_overrides_turn_flags_off_and_set_values() -> None:
    profile = _profile(load_settings(), "cpu-tiny",
                       ["enable-prefix-caching=false", "max-num-batched-tokens=4096"])
    assert profile.args["enable-prefix-caching"] is False
    assert profile.args["max-num-batched-tokens"] == 4096
    assert _profile(load_settings(), "cpu-tiny").args["enable-prefix-caching"] is True


def test_arg_without_value_is_an_input_error() -> None:
    with pytest.raises(InputError, match="FLAG=VALUE"):
        _profile(load_settings(), "cpu-tiny", ["enable-prefix-caching"])
