"""Check `quality repro` on constructed batches against hand computations, and its errors."""

from __future__ import annotations

import itertools
import json

import pytest
from sqlalchemy import Engine

from app.quality.repro import repro
from tests.unit.support.clirun import nightdesk
from tests.unit.support.quality_rows import (
    SAMPLES_A,
    add_batch,
    band_by_hand,
    kappa_by_hand,
    one_each,
    spearman_by_hand,
)

TICKERS = ["AAA", "BBB", "CCC", "DDD", "EEE", "FFF"]
FIRST = dict(zip(TICKERS, ["Buy", "Hold", "Sell", "Overweight", "Hold", "Underweight"],
                 strict=True))
SECOND = dict(zip(TICKERS, ["Overweight", "Hold", "Buy", "Overweight", "Underweight", "Hold"],
                  strict=True))
FIRST_SCORES = dict(zip(TICKERS, [0.8, 0.05, -0.9, 0.2, -0.1, -0.3], strict=True))
SECOND_SCORES = dict(zip(TICKERS, [0.4, 0.0, 0.6, 0.35, -0.2, 0.1], strict=True))


def two_batches(engine: Engine) -> tuple[int, int]:
    a = add_batch(engine, one_each(FIRST, FIRST_SCORES))
    b = add_batch(engine, one_each(SECOND, SECOND_SCORES))
    return a, b


def test_pair_statistics_match_hand_computations(sqlite_engine: Engine) -> None:
    a, b = two_batches(sqlite_engine)
    report = repro(sqlite_engine, [a, b], resamples=0)
    assert report.common == TICKERS
    (pair,) = report.pairs
    first, second = [FIRST[t] for t in TICKERS], [SECOND[t] for t in TICKERS]
    assert pair.stats.n == 6
    assert pair.stats.agreement == pytest.approx(2 / 6)  # BBB Hold, DDD Overweight
    assert pair.stats.qwk == pytest.approx(kappa_by_hand(first, second))
    assert pair.stats.spearman == pytest.approx(spearman_by_hand(
        [FIRST_SCORES[t] for t in TICKERS], [SECOND_SCORES[t] for t in TICKERS]))
    # Both non-Hold: AAA (Buy/Overweight), CCC (Sell/Buy: a flip), DDD: 1 flip in 3.
    assert pair.stats.flip_rate == pytest.approx(1 / 3) and pair.stats.directional == 3
    assert report.mean["qwk"] == pair.stats.qwk
    assert report.batches[0].distribution == {"Buy": 1, "Overweight": 1, "Hold": 2,
                                              "Underweight": 1, "Sell": 1}
    # SECOND's CCC says Buy with +0.6 (inside), EEE Underweight −0.2 (inside), FFF Hold +0.1
    # (inside): no contradiction. FIRST's are all inside too.
    assert [b.contradicting for b in report.batches] == [0, 0]


def test_three_batches_give_every_pair_and_their_mean(sqlite_engine: Engine) -> None:
    a, b = two_batches(sqlite_engine)
    third = dict(FIRST, AAA="Sell")
    c = add_batch(sqlite_engine, one_each(third, dict(FIRST_SCORES, AAA=-0.8)))
    report = repro(sqlite_engine, [a, b, c], resamples=0)
    assert [(p.a, p.b) for p in report.pairs] == [(a, b), (a, c), (b, c)]
    grades = {a: FIRST, b: SECOND, c: third}
    kappas = [kappa_by_hand([grades[x][t] for t in TICKERS], [grades[y][t] for t in TICKERS])
              for x, y in itertools.combinations([a, b, c], 2)]
    assert [p.stats.qwk for p in report.pairs] == pytest.approx(kappas)
    assert report.mean["qwk"] == pytest.approx(sum(kappas) / 3)


def test_contradicting_decisions_are_flagged_and_counted(sqlite_engine: Engine) -> None:
    grades = one_each(FIRST, FIRST_SCORES)
    grades["AAA"] = [("Sell", 0.97)]  # the example
    grades["BBB"] = [("Buy", -0.1)]
    a = add_batch(sqlite_engine, grades)
    b = add_batch(sqlite_engine, one_each(SECOND, SECOND_SCORES))
    report = repro(sqlite_engine, [a, b], resamples=0)
    assert report.batches[0].contradicting == 2 and report.batches[0].decisions == 6


def test_all_hold_constant_scores_are_undefined_not_zero(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    holds = one_each(dict.fromkeys(TICKERS, "Hold"))  # every score 0.0
    a, b = add_batch(sqlite_engine, holds), add_batch(sqlite_engine, holds)
    (pair,) = repro(sqlite_engine, [a, b], resamples=0).pairs
    assert pair.stats.agreement == 1.0
    assert pair.stats.qwk is None and pair.stats.spearman is None
    assert pair.stats.flip_rate is None and pair.stats.directional == 0
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "repro", "--batches",
                               f"{a},{b}", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["pairs"][0]["qwk"] is None and data["pairs"][0]["spearman"] is None
    assert next(iter(data)) == "schema" and data["schema"] == "quality-repro/1"
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "repro", "--batches", f"{a},{b}")
    assert code == 0, err
    row = next(line for line in out.splitlines() if f"{a} vs {b}" in line)
    assert row.count("undefined") == 2 and "nan" not in out.lower()


def test_a_single_common_ticker(sqlite_engine: Engine) -> None:
    a = add_batch(sqlite_engine, one_each({"AAA": "Buy", "BBB": "Sell"}))
    b = add_batch(sqlite_engine, one_each({"AAA": "Buy", "CCC": "Hold"}))
    report = repro(sqlite_engine, [a, b], resamples=0)
    (pair,) = report.pairs
    assert report.common == ["AAA"] and pair.stats.n == 1 and pair.stats.agreement == 1.0
    assert pair.stats.qwk is None and pair.stats.spearman is None
    assert report.only_in == {a: ["BBB"], b: ["CCC"]}


def test_no_overlap_reports_nothing_to_compare(sqlite_engine: Engine) -> None:
    a = add_batch(sqlite_engine, one_each({"AAA": "Buy", "BBB": "Sell"}))
    b = add_batch(sqlite_engine, one_each({"CCC": "Buy", "DDD": "Hold"}))
    report = repro(sqlite_engine, [a, b], resamples=0)
    (pair,) = report.pairs
    assert pair.stats.n == 0
    assert (pair.stats.agreement, pair.stats.qwk, pair.stats.spearman) == (None, None, None)
    assert report.mean == {"agreement": None, "qwk": None, "spearman": None,
                           "flip_rate": None}
    assert any("nothing to compare" in note for note in report.notes)


def test_constant_scores_leave_spearman_undefined(sqlite_engine: Engine) -> None:
    a = add_batch(sqlite_engine, one_each(FIRST, FIRST_SCORES))
    b = add_batch(sqlite_engine, one_each(FIRST, dict.fromkeys(TICKERS, 0.1)))
    (pair,) = repro(sqlite_engine, [a, b], resamples=0).pairs
    # Every score 0.1 grades every ticker Hold (the band of its score, whatever rating the
    # model gave): one constant side, so kappa is 0 by its formula; 2 of 6 agree.
    assert pair.stats.spearman is None and pair.stats.qwk == pytest.approx(0.0)
    assert pair.stats.agreement == pytest.approx(2 / 6)


SAMPLES_B = {
    "AAA": [("Overweight", 0.35), ("Buy", 0.8), ("Hold", 0.0), ("Buy", 0.7)],
    "BBB": [("Underweight", -0.3), ("Hold", 0.05), ("Sell", -0.55), ("Hold", -0.1)],
    "CCC": [("Underweight", -0.45), ("Sell", -0.9), ("Hold", 0.1), ("Underweight", -0.2)],
    "DDD": [("Hold", 0.0), ("Overweight", 0.3), ("Overweight", 0.45), ("Buy", 0.5)],
    "EEE": [("Overweight", 0.2), ("Hold", 0.0), ("Underweight", -0.25), ("Hold", 0.1)],
}


def test_by_k_the_mean_of_all_samples_by_hand(sqlite_engine: Engine) -> None:
    a, b = add_batch(sqlite_engine, SAMPLES_A), add_batch(sqlite_engine, SAMPLES_B)
    report = repro(sqlite_engine, [a, b], resamples=0)
    tickers = sorted(SAMPLES_A)
    mean_a = [sum(s for _, s in SAMPLES_A[t]) / 4 for t in tickers]
    mean_b = [sum(s for _, s in SAMPLES_B[t]) / 4 for t in tickers]
    # The whole-batch pair row uses each ticker's band of the mean score.
    (pair,) = report.pairs
    bands_a, bands_b = [band_by_hand(m) for m in mean_a], [band_by_hand(m) for m in mean_b]
    assert pair.stats.spearman == pytest.approx(spearman_by_hand(mean_a, mean_b))
    assert pair.stats.agreement == pytest.approx(
        sum(x == y for x, y in zip(bands_a, bands_b, strict=True)) / 5)
    assert [r.k for r in report.by_k] == [1, 2, 4]
    k4 = report.by_k[2]
    assert k4.choices == 1 and k4.n == 5
    assert k4.spearman == pytest.approx(spearman_by_hand(mean_a, mean_b))
    # k = 1 with the predicted value at k = 4 from Spearman–Brown on the k = 1 Spearman.
    r1 = report.by_k[0].spearman
    assert r1 is not None
    assert k4.spearman_predicted == pytest.approx(4 * r1 / (1 + 3 * r1))


def test_by_k_one_sample_is_the_mean_over_sample_pairs(sqlite_engine: Engine) -> None:
    two_a = {t: v[:2] for t, v in SAMPLES_A.items()}
    two_b = {t: v[:2] for t, v in SAMPLES_B.items()}
    a, b = add_batch(sqlite_engine, two_a), add_batch(sqlite_engine, two_b)
    k1 = repro(sqlite_engine, [a, b], resamples=0).by_k[0]
    tickers = sorted(two_a)
    kappas, rhos = [], []
    for i, j in itertools.product(range(2), range(2)):  # sample i of A against sample j of B
        kappas.append(kappa_by_hand([two_a[t][i][0] for t in tickers],
                                    [two_b[t][j][0] for t in tickers]))
        rhos.append(spearman_by_hand([two_a[t][i][1] for t in tickers],
                                     [two_b[t][j][1] for t in tickers]))
    assert k1.choices == 4
    assert k1.qwk == pytest.approx(sum(kappas) / 4)
    assert k1.spearman == pytest.approx(sum(rhos) / 4)


@pytest.mark.slow
def test_by_k_intervals_are_given_ordered_and_bounded(sqlite_engine: Engine) -> None:
    a, b = add_batch(sqlite_engine, SAMPLES_A), add_batch(sqlite_engine, SAMPLES_B)
    rows = repro(sqlite_engine, [a, b], resamples=100).by_k
    intervals = [i for r in rows for i in (r.spearman_ci, r.qwk_ci) if i is not None]
    assert intervals  # five tickers with varied grades: the bootstrap is defined
    for low, high in intervals:
        assert -1.0 <= low <= high <= 1.0
    again = repro(sqlite_engine, [a, b], resamples=100).by_k
    assert [r.spearman_ci for r in again] == [r.spearman_ci for r in rows]  # seeded


@pytest.mark.parametrize(("args", "message"), [
    (["--batches", "1,999"], "no batch with id 999"),
    (["--batches", "1"], "at least 2 batch ids"),
    (["--batches", "1,x"], "batch ids separated by commas"),
    (["--batches", "1,1"], "names a batch twice"),
    (["--batches", "1,,2"], "an empty item between its commas"),
    (["--batches", "1,2,"], "an empty item between its commas"),
    ([], "needs 2 finished nightly batches"),
])
def test_bad_input_is_one_line_and_exit_2(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    add_batch(sqlite_engine, one_each(FIRST))
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "repro", *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_default_is_the_two_newest_nightly_batches_of_one_as_of(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    a, b = two_batches(sqlite_engine)
    add_batch(sqlite_engine, one_each({"AAA": "Buy"}), kind="rerun")
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "repro", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert [p["a"] for p in data["pairs"]] == [a] and [p["b"] for p in data["pairs"]] == [b]


def test_batches_with_seeds_are_not_called_independent(sqlite_engine: Engine) -> None:
    seeded = {"samples": 1, "request_seeds": True}
    a = add_batch(sqlite_engine, one_each(FIRST), settings=seeded)
    b = add_batch(sqlite_engine, one_each(SECOND), settings=seeded)
    c = add_batch(sqlite_engine, one_each(SECOND), settings={"request_seeds": False})
    assert any("not independent runs" in n for n in repro(sqlite_engine, [a, b],
                                                          resamples=0).notes)
    assert not any("not independent" in n for n in repro(sqlite_engine, [a, c],
                                                         resamples=0).notes)


def test_a_withheld_qwk_interval_is_explained_in_one_line_below_the_table(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Five tickers of four samples: QWK is defined at every k, its interval needs 40 tickers
    # (docs/quality.md): the table's "—" is followed by one line that says so.
    a, b = add_batch(sqlite_engine, SAMPLES_A), add_batch(sqlite_engine, SAMPLES_B)
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "repro", "--batches",
                               f"{a},{b}", "--resamples", "50")
    assert code == 0, err
    notes = [line for line in out.splitlines() if "QWK's 95% interval" in line]
    assert notes == [f"note: QWK's 95% interval needs 40 tickers, here {len(SAMPLES_A)} "
                     "(the repository's docs/quality.md)"]
    code, out, err = nightdesk(monkeypatch, capsys, "quality", "repro", "--batches",
                               f"{a},{b}", "--format", "json", "--resamples", "50")
    rows = json.loads(out)["by_k"]
    assert {r["qwk_ci_withheld"] for r in rows if r["qwk"] is not None} == {
        f"QWK's 95% interval needs 40 tickers, here {len(SAMPLES_A)}"}
