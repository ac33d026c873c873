"""Measure the jump monitor by simulation: its false-alarm rate at 6, 20 and 100 tickers, its power.

Nights are drawn from one unchanged distribution and judged, as the monitor judges them,
against the pooled grades of five trailing nights of the same size. The rate must stay at or
below the stated one at every size, within three of the simulation's standard errors;
docs/quality.md reports the figures measured here (the test checks that they agree).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from app.config import load_settings
from app.quality.monitor import findings, split_p_values
from tests.unit.support.quality_rows import SCALE

DOCS = Path(__file__).resolve().parents[3] / "docs" / "quality.md"
TRAILING = 5
NIGHTS = 600  # per universe size: about 2 seconds each on one core
POWER_NIGHTS = 200
UNCHANGED = np.array([0.10, 0.20, 0.40, 0.20, 0.10])  # Buy … Sell
# The same distribution with a quarter of the grades moved from Hold to Buy: TVD 0.25.
SHIFTED = np.array([0.35, 0.20, 0.15, 0.20, 0.10])


def counts(draw: np.ndarray) -> dict[str, int]:
    return {r: int(c) for r, c in zip(SCALE, draw, strict=True)}


def p_values(tickers: int, night_law: np.ndarray, nights: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(nights):
        night = counts(rng.multinomial(tickers, night_law))
        reference = counts(rng.multinomial(tickers * TRAILING, UNCHANGED))
        values.append(split_p_values(night, reference)[0])
    return np.array(values)


def documented(label: str) -> float:
    """Return the percentage docs/quality.md states after ``label``."""
    pattern = r"\s+".join(re.escape(word) for word in label.split())
    found = re.search(pattern + r"\D*?([0-9.]+)%", DOCS.read_text())
    assert found, f"docs/quality.md does not state {label!r}"
    return float(found.group(1)) / 100


@pytest.mark.parametrize("tickers", [6, 20, 100])
def test_false_alarm_rate_holds_at_every_universe_size(tickers: int) -> None:
    rate = load_settings().quality.false_alarm_rate
    p = p_values(tickers, UNCHANGED, NIGHTS, seed=tickers)
    for level in (rate, 0.05):
        measured = float(np.mean(p <= level))
        error = math.sqrt(level * (1 - level) / NIGHTS)
        assert measured <= level + 3 * error, (tickers, level, measured)
    measured = float(np.mean(p <= rate))
    stated = documented(f"false alarms at {tickers} tickers:")
    assert abs(measured - stated) <= 0.0005, (tickers, measured, stated)


def test_power_against_a_tvd_025_shift_at_100_tickers() -> None:
    settings = load_settings(monitor_max_grade_share=1.0)
    assert 0.5 * np.abs(SHIFTED - UNCHANGED).sum() == pytest.approx(0.25)
    p = p_values(100, SHIFTED, POWER_NIGHTS, seed=1)
    power = float(np.mean(p <= settings.quality.false_alarm_rate))
    assert power >= 0.9
    assert abs(power - documented("power at 100 tickers:")) <= 0.0005
    small = float(np.mean(p_values(20, SHIFTED, POWER_NIGHTS, seed=1)
                          <= settings.quality.false_alarm_rate))
    assert abs(small - documented("power at 20 tickers:")) <= 0.0005
    # The decision findings() takes is the same p-value against the same rate.
    rng = np.random.default_rng(2)
    night, trailing = rng.multinomial(100, SHIFTED), rng.multinomial(100, UNCHANGED, size=5)
    found = findings(counts(night), [counts(t) for t in trailing], settings)
    assert [f.kind for f in found] == ["distribution_jump"]
