"""Check the inputs and edge values the quality reports meet: ids, zero prices, IC ±1, pins."""

from __future__ import annotations

import json
import math
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest
from fastapi import HTTPException
from packaging.requirements import Requirement
from packaging.version import Version
from scipy import stats
from sqlalchemy import Engine

from agents.data.freeze import write_manifest, write_ticker
from agents.data.snapshot import Manifest
from app.errors import InputError
from app.morning.batchids import MAX_BATCH_ID, parse_batch_id, parse_batch_ids
from app.quality.statistics import ic_test
from app.web.symbols import batch_ids
from tests.unit.support.clirun import nightdesk
from tests.unit.support.prices import path_to, prices
from tests.unit.support.quality_rows import AS_OF, add_batch, one_each

ROOT = Path(__file__).resolve().parents[3]
# Batch ids no database key can hold or int() cannot read, and digits that are not ASCII.
BAD_IDS = [str(2**64), str(MAX_BATCH_ID + 1), "9" * 40, "²", "١٢", "-1", "1.0", "1e3", ""]


def commands_taking(bad: str) -> list[tuple[str, ...]]:
    return [
        ("quality", "samples", "--batch", bad),
        ("quality", "forward", "--batch", bad),
        ("quality", "repro", "--batches", f"1,{bad}"),
        ("ranking", "--batch", bad),
        ("report", bad),
        ("report", "--compare", f"1,{bad}"),
        ("run", "--resume", bad),
        ("replay", "--batch", bad),
    ]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_bad_batch_id_is_one_line_and_exit_2_everywhere(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], bad: str) -> None:
    add_batch(sqlite_engine, one_each({"AAA": "Buy", "BBB": "Hold", "CCC": "Sell"}))
    for args in commands_taking(bad):
        code, out, err = nightdesk(monkeypatch, capsys, *args)
        assert code == 2 and out == "", (args, code, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (args, err)
        # Read as a batch id (never as 12 from '١٢', nor handed to the database).
        assert "no batch with id" not in err, (args, err)


def test_the_parser_takes_ascii_ids_up_to_the_largest_key() -> None:
    assert parse_batch_id(" 12 ") == 12
    assert parse_batch_id(str(MAX_BATCH_ID)) == MAX_BATCH_ID
    assert parse_batch_ids("3, 4,5") == [3, 4, 5]
    for bad in BAD_IDS:
        with pytest.raises(InputError, match="--batch"):
            parse_batch_id(bad)


def test_the_web_compare_ids_use_the_same_parser() -> None:
    assert batch_ids(["3,4"]) == [3, 4]
    for bad in (str(2**64), "²", "١٢"):
        with pytest.raises(HTTPException) as caught:
            batch_ids([f"1,{bad}"])
        assert caught.value.status_code == 400


def test_ic_t_at_a_perfect_order_is_undefined_but_its_p_is_not() -> None:
    for n in (5, 30):
        ranks = [float(i) for i in range(n)]
        for returns in (ranks, ranks[::-1]):
            t, p = ic_test(ranks, returns)
            # t is infinite; p is the chance of a perfect order either way (2 of n! orders,
            # one time in three with 3 tickers), counted as (1 + hits)/(1 + draws) past 7.
            assert t is None
            assert p == pytest.approx(2 / math.factorial(n) if n <= 7 else 1 / 10000)
    for ic_n in (2, 1):
        assert ic_test([0.1, 0.2][:ic_n], [0.3, 0.1][:ic_n]) == (None, None)


@pytest.fixture
def edge_snapshot(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    write_ticker(data, AS_OF, "AAA", prices(AS_OF, path_to(110.0)), {}, [], [])
    write_ticker(data, AS_OF, "BBB", prices(AS_OF, path_to(100.0)), {}, [], [])
    write_ticker(data, AS_OF, "CCC", prices(AS_OF, path_to(90.0)), {}, [], [])
    zero = prices(AS_OF, path_to(5.0))
    zero.loc[zero.index <= str(AS_OF), "close"] = 0.0  # a zero close on the as-of date
    write_ticker(data, AS_OF, "ZERO", zero, {}, [], [])
    write_ticker(data, AS_OF, "BMKZ", zero, {}, [], [])
    write_manifest(data, AS_OF, Manifest("test", "x", False, ["AAA", "BBB", "CCC", "ZERO",
                                                              "BMKZ"]))
    return data


def edge_batch(engine: Engine) -> int:
    # Scores in the same order as the returns: a rank IC of exactly +1.
    return add_batch(engine, {"AAA": [("Buy", 0.8)], "BBB": [("Hold", 0.0)],
                              "CCC": [("Sell", -0.8)], "ZERO": [("Buy", 0.9)]},
                     settings={"samples": 1, "data_provider": "snapshot"})


def test_a_zero_price_gives_an_undefined_return_not_infinity(
        sqlite_engine: Engine, edge_snapshot: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    batch = edge_batch(sqlite_engine)
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "forward", "--batch", str(batch),
                               "--format", "json")
    assert code == 0, err
    assert "Infinity" not in out and "NaN" not in out
    data = json.loads(out)
    rows = {t["ticker"]: t for t in data["tickers"]}
    assert rows["ZERO"]["forward_return"] is None and rows["ZERO"]["excess_return"] is None
    assert data["n"] == 3  # ZERO is not counted
    assert data["rank_ic"] == pytest.approx(1.0)
    # IC +1: t is infinite (undefined); p is the chance of a perfect order of 3 tickers
    # either way, 2 of 6 orders, never the t's p of 0.000.
    assert data["t_stat"] is None and data["p_value"] == pytest.approx(2 / 6)
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "forward", "--batch", str(batch))
    assert code == 0, err
    assert "inf" not in out.lower().replace("information", "")
    zero_row = next(line for line in out.splitlines() if "ZERO" in line)
    assert "undefined" in zero_row
    assert re.search(r"p-value \(two-sided, permutation\)\s*│?\s*0\.333", out), out


@pytest.mark.parametrize(("benchmark", "why"), [
    ("NOPE", "not in snapshot"), ("BMKZ", "return undefined"),
])
def test_a_bad_benchmark_is_one_line_exit_2_named_once(
        sqlite_engine: Engine, edge_snapshot: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], benchmark: str, why: str) -> None:
    batch = edge_batch(sqlite_engine)
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "forward", "--batch", str(batch),
                               "--benchmark", benchmark)
    assert code == 2 and out == "", err
    assert len(err.strip().splitlines()) == 1 and why in err
    # The path inside the message may contain it; the message names it once.
    assert err.split(" (missing")[0].count(benchmark) == 1, err


# The oldest version of each dependency that has every call app/quality makes.
NEEDED = {
    "scipy": "1.15",  # stats.bootstrap(rng=...): `rng` replaced random_state in 1.15
    "scikit-learn": "1.3",  # sklearn.config_context(skip_parameter_validation=...)
}


def test_the_pins_allow_no_version_without_the_calls_made() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {Requirement(r).name: Requirement(r).specifier for r in project["dependencies"]}
    for name, needed in NEEDED.items():
        lower = [Version(s.version) for s in pins[name] if s.operator in (">=", "==", "~=")]
        assert lower and max(lower) >= Version(needed), (name, pins[name])


def test_bootstrap_takes_rng_on_the_installed_scipy() -> None:
    # The call app/quality/statistics.py makes; fails loudly if scipy drops or renames it.
    result = stats.bootstrap((np.arange(5.0),), np.mean, n_resamples=9, method="percentile",
                             rng=np.random.default_rng(0))
    assert result.bootstrap_distribution.shape == (9,)
