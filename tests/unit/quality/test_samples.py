"""Check `quality samples`: sample-against-sample statistics and split-half stability by hand."""

from __future__ import annotations

import itertools
import json

import pytest
from sqlalchemy import Engine

from app.quality.samples import samples_report
from tests.unit.support.clirun import nightdesk
from tests.unit.support.quality_rows import (
    SAMPLES_A,
    add_batch,
    band_by_hand,
    kappa_by_hand,
    one_each,
    spearman_by_hand,
)

TICKERS = sorted(SAMPLES_A)


def test_every_pair_of_samples_by_hand(sqlite_engine: Engine) -> None:
    batch = add_batch(sqlite_engine, SAMPLES_A)
    report = samples_report(sqlite_engine, batch, resamples=0)
    assert report.samples == 4 and report.tickers == TICKERS
    assert [(p.i, p.j) for p in report.pairs] == list(itertools.combinations(range(4), 2))
    kappas, rhos = [], []
    for p in report.pairs:
        a = [SAMPLES_A[t][p.i] for t in TICKERS]
        b = [SAMPLES_A[t][p.j] for t in TICKERS]
        kappas.append(kappa_by_hand([r for r, _ in a], [r for r, _ in b]))
        rhos.append(spearman_by_hand([s for _, s in a], [s for _, s in b]))
        assert p.stats.qwk == pytest.approx(kappas[-1])
        assert p.stats.spearman == pytest.approx(rhos[-1])
    assert report.mean["qwk"] == pytest.approx(sum(kappas) / 6)
    assert report.mean["spearman"] == pytest.approx(sum(rhos) / 6)
    counted = {r: sum(g[0] == r for v in SAMPLES_A.values() for g in v)
               for r in ("Buy", "Overweight", "Hold", "Underweight", "Sell")}
    assert report.sample_distribution == counted


def test_split_half_of_two_against_two_by_hand(sqlite_engine: Engine) -> None:
    batch = add_batch(sqlite_engine, SAMPLES_A)
    rows = samples_report(sqlite_engine, batch, resamples=0).split_half
    assert [r.k for r in rows] == [1, 2]  # N = 4 allows halves of 1 and 2
    k1, k2 = rows
    # k = 1: the six sample pairs, so the same means as the pair table.
    assert k1.choices == 6
    # k = 2: the three ways to split four samples into two pairs.
    splits = [((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0, 3), (1, 2))]
    rhos, agreements = [], []
    for left, right in splits:
        mean_l = [sum(SAMPLES_A[t][i][1] for i in left) / 2 for t in TICKERS]
        mean_r = [sum(SAMPLES_A[t][i][1] for i in right) / 2 for t in TICKERS]
        rhos.append(spearman_by_hand(mean_l, mean_r))
        agreements.append(sum(band_by_hand(x) == band_by_hand(y)
                              for x, y in zip(mean_l, mean_r, strict=True)) / len(TICKERS))
    assert k2.choices == 3
    assert k2.spearman == pytest.approx(sum(rhos) / 3)
    assert k2.agreement == pytest.approx(sum(agreements) / 3)
    assert k1.spearman is not None
    assert k2.spearman_predicted == pytest.approx(2 * k1.spearman / (1 + k1.spearman))


def test_a_ticker_short_of_samples_is_named_not_used(sqlite_engine: Engine) -> None:
    grades = dict(SAMPLES_A, ZZZ=[("Buy", 0.9), ("Buy", 0.8)])
    report = samples_report(sqlite_engine, add_batch(sqlite_engine, grades), resamples=0)
    assert report.incomplete == ["ZZZ"] and "ZZZ" not in report.tickers


def test_all_hold_samples_are_undefined_not_zero(sqlite_engine: Engine) -> None:
    grades = {t: [("Hold", 0.0)] * 3 for t in TICKERS}
    report = samples_report(sqlite_engine, add_batch(sqlite_engine, grades), resamples=200)
    assert report.mean == {"agreement": 1.0, "qwk": None, "spearman": None,
                           "flip_rate": None}
    (k1,) = report.split_half
    assert k1.qwk is None and k1.spearman is None
    assert k1.qwk_ci is None and k1.spearman_ci is None


def test_one_sample_batch_is_refused_in_one_line(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    batch = add_batch(sqlite_engine, one_each({"AAA": "Buy", "BBB": "Hold"}))
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "samples", "--batch", str(batch))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--samples 2 or more" in err
    for bad, message in (("424242", "no batch with id 424242"), ("x1", "whole number")):
        code, out, err = nightdesk(monkeypatch, capsys, "quality", "samples", "--batch", bad)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_cli_json_defaults_to_the_newest_nightly_batch(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    add_batch(sqlite_engine, SAMPLES_A)
    newest = add_batch(sqlite_engine, {t: v[:2] for t, v in SAMPLES_A.items()})
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "samples", "--format", "json",
                               "--resamples", "0")
    assert code == 0, err
    data = json.loads(out)
    assert data["batch"]["batch_id"] == newest and data["samples"] == 2
    assert next(iter(data)) == "schema" and data["schema"] == "quality-samples/1"
    assert [(p["i"], p["j"]) for p in data["pairs"]] == [(0, 1)]
