"""``nightdesk bench schedulers`` and ``bench combine`` driven as an operator would: figures
that must not claim what was not computed, and bad input that must be one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.bench.schedulers import BenchResult, _judge, machine_facts
from app.config import load_settings
from tests.unit.support.bench_arms import SERVER, fake_arm
from tests.unit.support.clirun import run_cli

MACHINE = {"cpu_model": "x", "cores": 1, "python": "3", "model": "m", "profile": "p",
           "server": "s", "date": "d", "commit": "abc", "host": "h", "server_facts": SERVER,
           "server_flags": {"model": "m", "max_num_seqs": 32, "max_model_len": 8192,
                            "quantization": None, "gpu": "H200"}}


@pytest.mark.parametrize("beaten_by", ["fixed-14", "adaptive", "sequential:tail=on"])
def test_a_bound_some_graph_respecting_arm_beat_is_no_bound(beaten_by: str) -> None:
    # The model's figure is 800 tok/s (tests/unit/support/bench_arms.py); an arm that respects the
    # graph ran at 880. The model is wrong for this run: no ratio to it, no check against it.
    arms = [fake_arm("fixed-3", 300.0), fake_arm("adaptive:tail=off", 500.0),
            fake_arm(beaten_by, 880.0), fake_arm("flood", 950.0)]
    result = BenchResult("w", 100, 1700, arms=arms, machine={"server_facts": SERVER})
    _judge(result)
    assert result.bound_tok_s is None
    assert result.bound is not None and "880.0 tok/s" in result.bound["unavailable"]
    assert result.bound["tok_s"] == pytest.approx(800.0)  # the figure stays, called no bound
    assert all(a["ratio_to_bound"] is None for a in result.arms)
    assert not [c for c in result.checks if "graph bound" in c]


def test_flood_over_the_bound_leaves_it_a_bound() -> None:
    # flood shares a ticker's context across its calls, which no graph schedule may.
    result = BenchResult("w", 100, 1700, arms=[fake_arm("fixed-14", 500.0),
                                               fake_arm("adaptive", 520.0),
                                               fake_arm("flood", 950.0)],
                         machine={"server_facts": SERVER})
    _judge(result)
    assert result.bound_tok_s == pytest.approx(800.0)
    assert result.bound is not None and result.bound.get("unavailable") is None
    assert result.checks["adaptive >= 0.9 x graph bound"] is False


def _write(tmp_path: Path, name: str, data: Any) -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _run(strategy: str, tok_s: float) -> dict[str, Any]:
    result = BenchResult("w", 100, 1700, arms=[fake_arm(strategy, tok_s)],
                         machine=json.loads(json.dumps(MACHINE)))
    _judge(result)
    return result.to_json()


def _arm_without_tok_s() -> dict[str, Any]:
    run = _run("adaptive", 520.0)
    del run["arms"][0]["output_tokens_per_s"]
    return run


def _arm_with_text_tok_s() -> dict[str, Any]:
    run = _run("adaptive", 520.0)
    run["arms"][0]["output_tokens_per_s"] = "fast"
    return run


def _arms_not_a_list() -> dict[str, Any]:
    run = _run("adaptive", 520.0)
    run["arms"] = "adaptive"
    return run


def _arm_with_tok_s(value: float) -> dict[str, Any]:
    run = _run("adaptive", 520.0)
    run["arms"][0]["output_tokens_per_s"] = value
    return run


@pytest.mark.parametrize(("second", "says"), [
    ([1, 2], "is not a bench schedulers result"),
    # Written by Python's json as NaN and Infinity: combined, a ceiling of inf tok/s and
    # checks against nan. A negative rate is no run's either.
    (json.dumps(_arm_with_tok_s(float("nan"))), "no output_tokens_per_s of 0 or more"),
    (json.dumps(_arm_with_tok_s(float("inf"))), "no output_tokens_per_s of 0 or more"),
    (_arm_with_tok_s(-5.0), "no output_tokens_per_s of 0 or more"),
    ("{not json", "cannot read bench JSON"),
    (_arm_without_tok_s(), "is not a bench schedulers result"),
    (_arm_with_text_tok_s(), "is not a bench schedulers result"),
    (_arms_not_a_list(), "is not a bench schedulers result"),
])
def test_combine_refuses_what_is_no_bench_result_in_one_line(
        tmp_path: Path, second: Any, says: str) -> None:
    first = _write(tmp_path, "a.json", _run("fixed-14", 500.0))
    bad = _write(tmp_path, "b.json", second)
    result = run_cli("bench", "combine", str(first), str(bad))
    assert result.code == 2, result.stderr
    assert len(result.error_lines) == 1 and says in result.error_lines[0]
    assert "b.json" in result.error_lines[0] and "Traceback" not in result.stderr


def test_combine_names_the_server_flag_that_differs(tmp_path: Path) -> None:
    other = _run("adaptive", 520.0)
    other["machine"]["server_flags"]["max_num_seqs"] = 256
    result = run_cli("bench", "combine", str(_write(tmp_path, "a.json", _run("fixed-14", 500.0))),
                     str(_write(tmp_path, "b.json", other)))
    assert result.code == 2
    assert len(result.error_lines) == 1
    assert "max_num_seqs: 32 and 256" in result.error_lines[0]


def test_combine_refuses_runs_over_another_number_of_endpoints(tmp_path: Path) -> None:
    # One server and two set up alike (their flags are the first endpoint's): a fixed arm
    # over two makes about twice the tok/s, which combined read as one arm's spread.
    one = _write(tmp_path, "one.json", _run("adaptive", 500.0))
    two = _run("adaptive", 990.0)
    two["machine"]["server"] = "http://127.0.0.1:8000/v1,http://127.0.0.1:8001/v1"
    result = run_cli("bench", "combine", str(one), str(_write(tmp_path, "two.json", two)))
    assert result.code == 2 and len(result.error_lines) == 1, result.stderr
    assert "endpoint count differs (1 and 2)" in result.error_lines[0]
    mixed = run_cli("bench", "combine", str(one), str(tmp_path / "two.json"), "--allow-mixed")
    assert mixed.code == 0 and "endpoint count: 2 values" in mixed.stdout


@pytest.mark.parametrize(("field", "says"), [
    ("model", "served model names (machine.models) differ ([\"m\"] and [\"other\"])"),
    ("profile", "server profile (machine.profile) differs (\"p\" and \"other\")")])
def test_combine_refuses_another_served_model_or_profile_naming_files_and_field(
        tmp_path: Path, field: str, says: str) -> None:
    # Not compared before: runs against another model name or server profile were joined.
    other = _run("adaptive", 520.0)
    other["machine"][field] = "other"
    first = _write(tmp_path, "a.json", _run("fixed-14", 500.0))
    result = run_cli("bench", "combine", str(first), str(_write(tmp_path, "b.json", other)))
    assert result.code == 2 and len(result.error_lines) == 1, result.stderr
    assert says in result.error_lines[0]
    assert f"({tmp_path / 'b.json'} against {tmp_path / 'a.json'})" in result.error_lines[0]
    mixed = run_cli("bench", "combine", str(first), str(tmp_path / "b.json"), "--allow-mixed")
    assert mixed.code == 0, mixed.stderr


def _two_endpoints(strategy: str, *models: str) -> dict[str, Any]:
    """A run over two endpoints, its machine as the bench records it, each serving a model."""
    settings = load_settings(check_context_length=False,
                             llm_base_url="http://a:8000/v1,http://b:8000/v1")
    run = _run(strategy, 990.0)
    run["machine"] = {**json.loads(machine_facts(settings, {}, [
        {"id": model} for model in models]).model_dump_json()), "commit": "abc", "host": "h"}
    return run


def test_combine_sees_an_endpoint_that_served_another_model(tmp_path: Path) -> None:
    # Before, machine.model was the first endpoint's: a second endpoint serving another
    # model was joined to a run where both served one, and no table said so.
    alike = _write(tmp_path, "alike.json", _two_endpoints("fixed-14", "m", "m"))
    unlike = _write(tmp_path, "unlike.json", _two_endpoints("adaptive", "m", "other"))
    refused = run_cli("bench", "combine", str(alike), str(unlike))
    assert refused.code == 2 and len(refused.error_lines) == 1, refused.stderr
    assert ('served model names (machine.models) differ (["m","m"] and ["m","other"])'
            in refused.error_lines[0].replace(", ", ","))
    alone = run_cli("bench", "combine", str(unlike))
    assert alone.code == 0, alone.stderr
    assert ("WARNING: the endpoints serve different models (m at http://a:8000/v1, other at "
            "http://b:8000/v1)") in " ".join(alone.stdout.split())
    assert "WARNING" not in run_cli("bench", "combine", str(alike)).stdout


@pytest.mark.parametrize(("args", "says"), [
    (("--tickers", "0"), "--tickers"),
    (("--tickers", "-1"), "--tickers"),
    # plan's cap, the same option: past it a workload of that many tickers was built.
    (("--tickers", "1000001"), "--tickers"),
    # Read before any server is asked: a typo is named even with no server up.
    (("--strategies", "fixed-15:tail=yes"), "bad knob 'tail=yes'"),
    (("--strategies", "fixed-0"), "unknown strategy 'fixed-0'"),
    # Arms of --strategies, but of no knobs: "unknown strategy" named neither as an arm.
    (("--strategies", "sweep:tail=on"), "sweep takes no knobs (got 'sweep:tail=on')"),
    (("--strategies", "flood:tail=on"), "flood takes no knobs (got 'flood:tail=on')"),
    (("--strategies", "fixed-01"), "strategy 'fixed-01': write N without leading zeros"),
    (("--strategies", "adaptive:initial=-3"), "initial must be at least 1"),
    (("--workload", "bogus"), "--workload takes synthetic or recorded:BATCH_ID"),
    (("--workload", "recorded:abc"), "--workload recorded:BATCH_ID takes a batch id"),
    (("--workload", "recorded:424242"), "no batch with id 424242"),
    (("--scale", "-1"), "--scale takes a number above 0"),
    (("--scale", "nan"), "--scale takes a number above 0"),
    (("--output-scale", "0"), "--output-scale takes a number above 0"),
])
def test_bench_schedulers_refuses_bad_input_before_asking_a_server(
        args: tuple[str, ...], says: str) -> None:
    # Port 9 (discard) on loopback: nothing answers there.
    result = run_cli("bench", "schedulers", *args, "--plan",
                     env={"NIGHTDESK_LLM_BASE_URL": "http://127.0.0.1:9/v1"})
    assert result.code == 2, result.stderr
    assert len(result.error_lines) == 1 and says in result.error_lines[0], result.stderr


def test_combine_refuses_a_run_given_twice(tmp_path: Path) -> None:
    # Two runs a side 10% apart: "not shown". The same file twice made it four runs a side
    # and a verdict from runs that are one.
    result = BenchResult("w", 100, 1700, arms=[
        fake_arm("fixed-14", 500.0), fake_arm("adaptive", 520.0),
        fake_arm("fixed-14", 510.0), fake_arm("adaptive", 560.0)],
        machine=json.loads(json.dumps(MACHINE)))
    for i, arm in enumerate(result.arms):
        arm["batch_id"] = i + 1
    _judge(result)
    one = _write(tmp_path, "one.json", result.to_json())
    twice = run_cli("bench", "combine", str(one), str(one))
    assert twice.code == 2 and len(twice.error_lines) == 1
    # Which files: among many, "batch 1" alone does not say where to look.
    assert (f"a run of fixed-14 (batch 1) is given twice (in {one} and {one})"
            in twice.error_lines[0])
    # A combined file beside one of its parts: the same, though the combination set the
    # part's arms' ratios against another ceiling (fixed-all's 700 tok/s).
    other = _write(tmp_path, "other.json", _run("fixed-all", 700.0))
    both = tmp_path / "both.json"
    assert run_cli("bench", "combine", str(one), str(other), "--json-out", str(both)).code == 0
    assert json.loads(both.read_text())["arms"][0]["ratio_to_ceiling"] == pytest.approx(500 / 700)
    again = run_cli("bench", "combine", str(both), str(one))
    assert again.code == 2 and f"is given twice (in {both} and {one})" in again.error_lines[0]


@pytest.mark.parametrize("where", ["a-directory", "under-a-file/out.json"])
def test_an_unwritable_json_out_is_refused_before_any_work(tmp_path: Path, where: str) -> None:
    (tmp_path / "a-directory").mkdir()
    (tmp_path / "under-a-file").write_text("")
    out = tmp_path / where
    one = _write(tmp_path, "a.json", _run("fixed-14", 500.0))
    combined = run_cli("bench", "combine", str(one), "--json-out", str(out))
    assert combined.code == 2 and len(combined.error_lines) == 1, combined.stderr
    assert f"--json-out {out}: cannot write there" in combined.error_lines[0]
    assert combined.stdout == ""  # refused before the table: nothing judged, then lost
    # The scheduler bench, which would have run every arm first: refused with no server up.
    bench = run_cli("bench", "schedulers", "--plan", "--json-out", str(out),
                    env={"NIGHTDESK_LLM_BASE_URL": "http://127.0.0.1:9/v1"})
    assert bench.code == 2 and "cannot write there" in bench.error_lines[0]


def test_a_writable_json_out_is_not_left_behind_by_the_check(tmp_path: Path) -> None:
    out = tmp_path / "new" / "out.json"
    refused = run_cli("bench", "schedulers", "--plan", "--json-out", str(out),
                      "--strategies", "fixed-0",
                      env={"NIGHTDESK_LLM_BASE_URL": "http://127.0.0.1:9/v1"})
    assert refused.code == 2 and not out.exists()



def _levels(noise: float) -> dict[str, list[float]]:
    # Steps of 20 ms + 2 ms a running request at 4..28 running, every other level off by
    # ``noise`` up or down: 1,000 steps a level.
    return {str(r): [1000.0 * r, 1000 * (0.020 + 0.002 * r) * (1 + noise * (-1) ** r)]
            for r in range(4, 29, 2 if noise == 0 else 1)}


def test_the_bound_says_how_sure_its_fitted_step_is(tmp_path: Path) -> None:
    # Readings on the step's line give an interval that is the bound itself; readings off it
    # give one around the fitted bound that widens with the noise, and the JSON and the
    # printed result carry it.
    def judged(noise: float) -> BenchResult:
        arm = {**fake_arm("adaptive", 300.0), "decode_levels": _levels(noise)}
        result = BenchResult("w", 100, 1700, arms=[arm, {**arm, "strategy": "fixed-14"}],
                             machine=json.loads(json.dumps(MACHINE)))
        _judge(result)
        assert result.bound is not None and result.bound_tok_s is not None
        return result

    exact = judged(0.0)
    low, high = exact.bound["interval_90_tok_s"]
    assert low == pytest.approx(exact.bound_tok_s) and high == pytest.approx(exact.bound_tok_s)
    loose, looser = judged(0.1), judged(0.3)
    low, high = loose.bound["interval_90_tok_s"]
    assert low < loose.bound_tok_s < high
    looser_low, looser_high = looser.bound["interval_90_tok_s"]
    assert looser_high - looser_low > high - low > 0
    out = run_cli("bench", "combine", str(_write(tmp_path, "r.json", loose.to_json())))
    assert out.code == 0, out.stderr
    assert f"90% interval: {low:.1f}–{high:.1f} tok/s" in " ".join(out.stdout.split())
    one_level = BenchResult("w", 100, 1700, arms=[fake_arm("adaptive", 520.0)],
                            machine=json.loads(json.dumps(MACHINE)))
    _judge(one_level)
    assert one_level.bound is not None and one_level.bound["interval_90_tok_s"] is None
    # ... and the bench says so, rather than show the fitted bound as if it were sure.
    out = run_cli("bench", "combine", str(_write(tmp_path, "one.json", one_level.to_json())))
    assert out.code == 0, out.stderr
    assert ("no interval for the bound: 1 level of readings, fewer than the 5"
            in " ".join(out.stdout.split()))


def test_an_arm_that_made_no_output_is_judged_without_a_traceback(tmp_path: Path) -> None:
    # The server went away during fixed-14's runs: every request failed, 0 tok/s twice. The
    # verdict had divided by its mean, and the means table its spread by it: a traceback
    # where `bench schedulers` judges, after every arm had run, so nothing was written. It
    # measured no ceiling either: adaptive ">= ceiling" against 0 tok/s was "met".
    arms = [fake_arm("fixed-14", 0.0), fake_arm("adaptive", 520.0), fake_arm("fixed-14", 0.0),
            fake_arm("adaptive", 510.0), fake_arm("fixed-3", 0.0)]
    for batch_id, arm in enumerate(arms, start=1):  # each run its own batch, as in a bench
        arm["batch_id"] = batch_id
    result = BenchResult("w", 100, 1700, machine=json.loads(json.dumps(MACHINE)), repeat=2,
                         arms=arms)
    _judge(result)
    assert result.ceiling_arm == "" and result.verdicts == []
    # Nor is fixed-3 at 0 tok/s a yardstick: "adaptive >= 1.5 x fixed-3" was "met".
    assert not [check for check in result.checks if "ceiling" in check or "fixed-3" in check]
    assert all(a["ratio_to_ceiling"] is None for a in result.arms)
    shown = run_cli("bench", "combine", str(_write(tmp_path, "r.json", result.to_json())))
    assert shown.code == 0, shown.stderr
    assert "ceiling none (no fixed arm made output)" in " ".join(shown.stdout.split())
    assert "10.0 (1.9%)" in shown.stdout  # adaptive's spread, and its share of its mean


def test_a_combined_result_claims_no_repeat_count(tmp_path: Path) -> None:
    # Two files of one run each: fixed-14 ran twice in all, adaptive once. The combined
    # JSON's "repeat" said 1, as if every arm had run once, interleaved.
    first, second = _run("fixed-14", 500.0), _run("fixed-14", 505.0)
    second["arms"][0]["batch_id"] = 2
    out = tmp_path / "both.json"
    shown = run_cli("bench", "combine", str(_write(tmp_path, "a.json", first)),
                    str(_write(tmp_path, "b.json", second)), "--json-out", str(out))
    assert shown.code == 0, shown.stderr
    both = json.loads(out.read_text())
    assert both["repeat"] is None and both["means"]["fixed-14"]["runs"] == 2


def test_a_run_without_a_fixed_arm_claims_no_ceiling(tmp_path: Path) -> None:
    # Only adaptive ran (as in the two-GPU files): the title said "ceiling 0.0 tok/s (-)".
    shown = run_cli("bench", "combine", str(_write(tmp_path, "a.json", _run("adaptive", 520.0))))
    assert shown.code == 0, shown.stderr
    title = " ".join(shown.stdout.split())
    assert "ceiling none (no fixed arm made output)" in title and "ceiling 0.0" not in title
    # With one, as before.
    fixed = run_cli("bench", "combine", str(_write(tmp_path, "f.json", _run("fixed-14", 500.0))))
    assert "ceiling 500.0 tok/s (fixed-14)" in " ".join(fixed.stdout.split())


def test_combine_names_the_files_it_refuses_and_what_it_could_not_compare(
        tmp_path: Path) -> None:
    first = _write(tmp_path, "a.json", _run("fixed-14", 500.0))
    other = _run("adaptive", 520.0)
    other["machine"]["host"] = "h2"
    third = _write(tmp_path, "c.json", other)
    refused = run_cli("bench", "combine", str(first), str(_write(tmp_path, "b.json",
                                                                 _run("fixed-3", 300.0))),
                      str(third))
    assert refused.code == 2 and len(refused.error_lines) == 1
    # Of three files, which one: the refusal said what differed, not where.
    assert f"({third} against {first})" in refused.error_lines[0]
    # Files from before the provenance fields record no commit, host or flags: equal as
    # "none" on every side, they were combined as if checked alike.
    old = []
    for name, strategy, tok_s in (("o1.json", "fixed-14", 500.0), ("o2.json", "adaptive", 520.0)):
        run = _run(strategy, tok_s)
        for key in ("commit", "host", "server_flags"):
            del run["machine"][key]
        old.append(str(_write(tmp_path, name, run)))
    out = tmp_path / "joined.json"
    shown = run_cli("bench", "combine", *old, "--json-out", str(out))
    assert shown.code == 0, shown.stderr
    assert ("not compared (no run records it): code commit, host, server flags"
            in " ".join(shown.stdout.split()))
    assert json.loads(out.read_text())["unchecked"] == ["code commit", "host", "server flags"]
    both = run_cli("bench", "combine", str(first), str(tmp_path / "b.json"))
    assert "not compared" not in both.stdout


@pytest.mark.parametrize(("schema", "says"), [
    # A later nightdesk's file: its fields may have been renamed or changed meaning.
    ("bench-schedulers/3", "is of schema 'bench-schedulers/3', not one this nightdesk reads "
                           "(up to bench-schedulers/2): a newer nightdesk wrote it"),
    ("plan/1", "is not a bench schedulers result (its schema is 'plan/1')"),
    ("bench-schedulers/x", "is not a bench schedulers result (its schema is")])
def test_combine_reads_a_file_by_its_schema(tmp_path: Path, schema: str, says: str) -> None:
    first = _write(tmp_path, "a.json", _run("fixed-14", 500.0))
    # Every bench JSON names its schema first; the combined one too.
    assert next(iter(json.loads(first.read_text()))) == "schema"
    other = {**_run("adaptive", 520.0), "schema": schema}
    result = run_cli("bench", "combine", str(first), str(_write(tmp_path, "b.json", other)))
    assert result.code == 2 and len(result.error_lines) == 1, result.stderr
    assert says in result.error_lines[0] and "b.json" in result.error_lines[0]
    # A file from before the schema: read as it always was, by the keys it has.
    older = _run("adaptive", 520.0)
    del older["schema"]
    out = tmp_path / "joined.json"
    joined = run_cli("bench", "combine", str(first), str(_write(tmp_path, "o.json", older)),
                     "--json-out", str(out))
    assert joined.code == 0, joined.stderr
    assert json.loads(out.read_text())["schema"] == "bench-schedulers/2"


def test_combine_shows_each_arm_as_typed_where_its_name_was_made_canonical(
        tmp_path: Path) -> None:
    # One run typed fixed-14:tail=off, one fixed-14: one arm, fixed-14. Before, the tables
    # showed only "fixed-14", and what the operator typed was only in the JSON.
    typed = _write(tmp_path, "a.json", _run("fixed-14:tail=off", 500.0))
    plain = _write(tmp_path, "b.json", _run("fixed-14", 510.0))
    shown = run_cli("bench", "combine", str(typed), str(plain), env={"COLUMNS": "300"})
    assert shown.code == 0, shown.stderr
    lines = [" ".join(line.split()) for line in shown.stdout.splitlines()]
    assert any("fixed-14 (run as fixed-14:tail=off) │ " in line for line in lines)
    # The means table pools both spellings under one name, and says both.
    assert any("fixed-14 (run as fixed-14, fixed-14:tail=off) │ 2 │" in line for line in lines)


def test_the_durability_bench_json_names_its_schema() -> None:
    from app.bench.durability import MODES, DurabilityResult
    result = DurabilityResult("sqlite", 1, 17, 10, ms_per_node=dict.fromkeys(MODES, 1.0))
    assert next(iter(result.to_json())) == "schema"
    assert result.to_json()["schema"] == "bench-durability/1"


def _bound_coverage(levels: int, noise: float, draws: int, seed: int) -> float:
    """How often the bound's 90% interval holds the true step's bound, over ``draws`` level
    sets of ``levels`` running levels drawn from 1-64, each level's seconds off a known step
    (20 ms + 0.4 ms a running request) by a lognormal factor of mean 1 and sd ``noise``."""
    import numpy as np

    from app.bench.bound import GraphFacts, StepCost, bound_interval, graph_bound

    graph = GraphFacts(output_tokens=200_000, kv_token_steps=4e8, critical_path_tokens=3_000,
                       calls=400)
    step, kv, seqs = StepCost(0.020, 0.0004), 200_000, 64
    true = graph_bound(graph, kv, seqs, step)
    assert true is not None
    rng = np.random.default_rng(seed)
    held = 0
    for _ in range(draws):
        running = rng.choice(np.arange(1, seqs + 1), size=levels, replace=False)
        tokens = rng.uniform(500, 20_000, levels)
        factor = np.exp(rng.normal(-noise**2 / 2, noise, levels))
        drawn = {int(r): [float(t), float(t / r * step.at(r) * f)]
                 for r, t, f in zip(running, tokens, factor, strict=True)}
        interval = bound_interval(graph, kv, seqs, drawn)
        assert interval is not None
        held += interval[0] <= true.tok_s <= interval[1]
    return held / draws


@pytest.mark.parametrize("noise", [0.1, 0.3])
def test_the_bounds_90_percent_interval_holds_90_percent_from_the_fewest_levels_it_is_given(
        noise: float) -> None:
    # At MIN_INTERVAL_LEVELS (5) running levels, readings 10% and 30% off the step: the
    # expanded interval held 96.4% and 92.9% ± 0.6 of 2,000 draws there; at 12 levels the plain
    # one had held 88.75% ± 0.5 (docs/lab/2026-12-07-verdicts-outside-3.md, -4.md).
    from app.bench.bound import MIN_INTERVAL_LEVELS

    # What it states, with no allowance: 92.9% is 6 standard errors of 3,000 draws above it.
    assert _bound_coverage(MIN_INTERVAL_LEVELS, noise, 3000, 21) >= 0.9


def test_the_bound_gives_no_interval_below_the_fewest_levels_that_hold_90_percent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # One level fewer, with the rule lifted: at 4 levels and 30% noise the expanded interval
    # held 86.0% ± 0.8 of 2,000 draws (docs/lab/2026-12-07-verdicts-outside-4.md), so the
    # minimum is the fewest levels whose interval keeps its word.
    import app.bench.bound as bound

    fewest = bound.MIN_INTERVAL_LEVELS
    monkeypatch.setattr(bound, "MIN_INTERVAL_LEVELS", 3)
    assert _bound_coverage(fewest - 1, 0.3, 2000, 22) < 0.9
