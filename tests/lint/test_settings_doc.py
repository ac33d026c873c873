"""docs/settings.md names every setting with its format and default, as Settings defines them."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from annotated_types import Ge, Gt, Le, Lt
from pydantic_core import PydanticUndefined

from app.config import FLAT, flat_field, load_settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
ROW = re.compile(r"^\| `NIGHTDESK_(\w+)` \| (.+?) \| (.+?) \| (.+?) \|$", re.MULTILINE)
BOUNDS = ((Ge, "≥", "ge"), (Gt, ">", "gt"), (Le, "≤", "le"), (Lt, "<", "lt"))


def rows() -> dict[str, tuple[str, str]]:
    """Return setting name -> (format, default) from the table."""
    return {name.lower(): (fmt, default) for name, fmt, default, _ in ROW.findall(DOC.read_text())}


def bounds(field: Any) -> str:
    return ", ".join(f"{sign} {getattr(rule, attr):g}" for rule in field.metadata
                     for kind, sign, attr in BOUNDS if isinstance(rule, kind))


def test_every_setting_has_a_row_and_every_row_is_a_setting() -> None:
    documented = rows()
    assert set(documented) == set(FLAT), set(documented) ^ set(FLAT)


@pytest.mark.parametrize("name", sorted(FLAT))
def test_the_row_gives_the_settings_own_format_and_default(name: str) -> None:
    fmt, default = rows()[name]
    field = flat_field(name)
    kind = field.annotation
    if typing.get_origin(kind) is typing.Literal:
        assert fmt == "one of " + ", ".join(f"`{c}`" for c in typing.get_args(kind)), fmt
    elif kind is bool:
        assert fmt == "true or false", fmt
    elif kind in (int, float):
        assert fmt == ("integer" if kind is int else "number") + (
            f", {bounds(field)}" if bounds(field) else ""), fmt
    value = field.default
    if value is None:
        assert default.startswith("unset"), default
    elif isinstance(value, bool):
        assert default == f"`{str(value).lower()}`", default
    elif isinstance(value, int | float):
        assert default == f"`{value:g}`", default
    elif isinstance(value, str) and value:
        assert default == f"`{value}`", default
    elif value is PydanticUndefined and field.default_factory is not None and name != "home":
        # node_max_tokens: the documented object is the default itself.
        made = field.default_factory()  # type: ignore[call-arg]
        assert json.loads(default.strip("`")) == made, default


def test_the_documented_json_example_is_a_valid_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    example = re.search(r"`NIGHTDESK_NODE_MAX_TOKENS='(\{.*?\})'`", DOC.read_text())
    assert example, "the format section's example is gone"
    monkeypatch.setenv("NIGHTDESK_NODE_MAX_TOKENS", example.group(1))
    settings = load_settings()
    given = json.loads(example.group(1))
    assert {k: settings.agents.node_max_tokens[k] for k in given} == given
