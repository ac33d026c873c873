"""Check that docs/quality.md quotes what its committed outputs and the formulas say.

The measurement on the tiny model states figures: each quoted one must be read from the
outputs in docs/bench/quality-cpu-tiny/, and each bound or interval must be what scipy gives.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[3]
OUTPUTS = ROOT / "docs" / "bench" / "quality-cpu-tiny"


def docs() -> str:
    return " ".join((ROOT / "docs" / "quality.md").read_text().split())


def signed(value: float, spec: str = "+.2f") -> str:
    """A number as the docs write it: a true minus sign."""
    return format(value, spec).replace("-", "−")


def output(name: str) -> Any:
    return json.loads((OUTPUTS / name).read_text())


def test_every_output_the_measurement_names_is_committed() -> None:
    named = set(re.findall(r"`((?:timing|repro|samples-\*|forward-\*)\.[\w*]+)`", docs()))
    assert named, "the measurement names no output"
    for pattern in named:
        assert list(OUTPUTS.glob(pattern)), pattern


def test_the_quoted_forward_figures_are_the_outputs() -> None:
    text = docs()
    two_5, two_20 = output("forward-2-5d.json"), output("forward-2-20d.json")
    one_5, one_20 = output("forward-1-5d.json"), output("forward-1-20d.json")
    assert (f"rank IC over 5 sessions is {signed(two_5['rank_ic'])} "
            f"(t {signed(two_5['t_stat'], '.2f')}, n {two_5['n']}, "
            f"p {two_5['p_value']:.2f})") in text
    assert (f"over 20 sessions {signed(two_20['rank_ic'])} "
            f"(t {signed(two_20['t_stat'], '.2f')})") in text
    assert (f"batch 1's {signed(one_5['rank_ic'])} (t {signed(one_5['t_stat'], '.2f')}, "
            f"p {one_5['p_value']:.2f}) and {signed(one_20['rank_ic'])} "
            f"(t {signed(one_20['t_stat'], '.2f')})") in text
    worst = max(abs(o["t_stat"]) for o in (one_5, one_20, two_5, two_20))
    assert worst < stats.t.ppf(0.975, 4)  # "none comes near it"


def test_the_quoted_runs_are_the_outputs() -> None:
    text = docs()
    seconds = re.findall(r"batch \d: (\d+) s", (OUTPUTS / "timing.txt").read_text())
    assert f"({seconds[0]} s and {seconds[1]} s" in text
    one, two = output("samples-1.json"), output("samples-2.json")
    assert (f"Buy {one['sample_distribution']['Buy']} and Sell "
            f"{one['sample_distribution']['Sell']} in batch 1, Buy "
            f"{two['sample_distribution']['Buy']} in batch 2") in text
    for batch in (one["batch"], two["batch"]):
        assert f"{batch['contradicting']} of the {batch['decisions']} stored samples" in text
        assert len(batch["without_decision"]) == 2  # "6 of 8 tickers got a decision"
    assert (f"mean Spearman is {signed(one['mean']['spearman'])} in batch 1 and "
            f"{signed(two['mean']['spearman'])} in batch 2") in text
    halves = [s["split_half"][1] for s in (one, two)]
    assert (f"halves give {signed(halves[0]['spearman'])} and "
            f"{signed(halves[1]['spearman'])}") in text
    repro = output("repro.json")
    k4 = repro["by_k"][2]
    assert k4["k"] == 4 and f"| 4 | 1 | {k4['agreement']:.0%} | {k4['qwk']:.2f} |" in text


@pytest.mark.parametrize("df", [4, 19, 118])
def test_the_t_bounds_are_scipys(df: int) -> None:
    bound = f"{stats.t.ppf(0.975, df):.2f}"
    assert f"{bound} at {df}" in docs() or f"|t| > {bound}" in docs()


def test_the_fisher_intervals_are_the_formulas() -> None:
    for n in (5, 30):
        half = math.tanh(1.96 / math.sqrt(n - 3))
        assert re.search(rf"±{half:.2f} at {n}\b", docs()), n


def test_the_old_systems_spearman_is_not_called_a_kappa() -> None:
    text = docs()
    assert "Spearman correlation of 0.12 says r₁ ≈ 0.12" in text
    assert not re.search(r"(QWK|kappa)\W{0,3}≈?\s*0\.12", text)
