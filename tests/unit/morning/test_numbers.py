"""One formatter of figures for the pages and the CLI's tables (app/morning/numbers.py)."""

from __future__ import annotations

import pytest

from app.morning.numbers import number
from app.web.templating import make_templates


@pytest.mark.parametrize(("value", "spec", "shown"), [
    (None, ".1f", "—"), (3.14159, ".2f", "3.14"), (0.256, ".0%", "26%"),
    # An int is a number too: formatted by the spec, as the pages always did (the CLI's
    # tables showed 40 for 40 under .1f and 1 for a share of 1 under .0%).
    (40, ".1f", "40.0"), (1, ".0%", "100%"), (7, "d", "7"),
    # A label or name in a column of figures is shown as it is.
    ("fixed-15:tail=on", "s", "fixed-15:tail=on"), ("arm a", ".1f", "arm a"),
    (True, ".1f", "True"),
])
def test_a_figure_is_shown_by_its_spec(value: object, spec: str, shown: str) -> None:
    assert number(value, spec) == shown


def test_missing_can_say_something_else() -> None:
    assert number(None, "+.3f", "undefined") == "undefined"
    assert number(0.0, "+.3f", "undefined") == "+0.000"


def test_the_pages_fmt_filter_is_the_cli_formatter() -> None:
    env = make_templates().env
    assert env.filters["fmt"] is number
    page = env.from_string('{{ a | fmt }}|{{ b | fmt(".0%") }}|{{ c | fmt("s") }}|{{ d | fmt }}')
    assert page.render(a=2.25, b=1, c="adaptive", d=None) == "2.2|100%|adaptive|—"
