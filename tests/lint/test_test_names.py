"""Check that every unit test module is named after what it tests (issue 45).

The rule, for each folder ``tests/unit/<pkg>/`` that mirrors a code package (``app/<pkg>/``,
or ``agents/`` and ``serving/`` themselves):

- ``test_<name>.py`` names a module of that package: ``<name>`` is the module's path inside
  the package with ``_`` for ``/`` (``agents/data/demo.py``: ``data_demo``), or begins with
  it and an aspect (``engine_resume``, ``sampler_lag``), so a module renamed or removed
  leaves a test name that fails here instead of one that points at nothing;
- or ``<name>`` is one of the few behaviours listed below, each of which no one module owns.

A folder that mirrors no package is listed too, with what it holds. The top of tests/unit/
is left out: it holds the tests of app/'s loose modules beside the cross-cutting ones
(bad input, quiet output, secrets in URLs, ...), which would make a list of its own.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "tests" / "unit"
# Folders of tests/unit/ that mirror no package, and what they hold instead.
OTHER_FOLDERS = {
    "faults": "faults injected through a whole night: engine, database and CLI at once",
    "support": "what the unit tests share (no tests)",
}
# Behaviours that span a package's modules, so that no module's name would say what they test.
BEHAVIOURS = {
    "bench": {"sims": "the benches of tests/bench/ run from a checkout (no app module)"},
    "cli": {"advised_commands": "every command nightdesk's own words advise, from all modules",
            "closed_pipe": "every command's output to a reader gone (the group of app/cli/)",
            "help": "every command's help, its docstring in each module",
            "night_reader_gone": "a night whose log reader went away (logs.py and the group)",
            "full_output": "stdout or stderr on a full disk (logs.py and the group)",
            "hangup": "a terminal that hangs up: SIGHUP, then EIO (logs.py and the group)",
            "output_paths": "every --out and --json-out of every command, checked in common.py"},
    "morning": {"latest_night": "the one order of nights (app.db.models.nights_newest_first) that "
                                "every reader of the latest night uses: ranking, status, pages"},
    "quality": {
        "docs": "docs/quality.md against its committed outputs",
        "inputs": "the ids and edge values every quality report meets",
        "no_lookahead": "no prompt sees a later price: the engine and the snapshot together",
    },
}


def package_of(folder: str) -> Path:
    """Return the code package that ``tests/unit/<folder>/`` mirrors."""
    return ROOT / folder if folder in ("agents", "serving") else ROOT / "app" / folder


def module_names(package: Path) -> set[str]:
    """Return the package's modules as test names spell them: subpackage parts joined by _."""
    return {"_".join(p.relative_to(package).with_suffix("").parts)
            for p in package.rglob("*.py") if p.name != "__init__.py"}


def name_problems(tests: list[str], modules: set[str], behaviours: set[str]) -> list[str]:
    """Return the test modules (``test_<name>.py``) named after neither a module nor a
    listed behaviour."""
    problems = []
    for test in tests:
        name = test.removeprefix("test_").removesuffix(".py")
        if name not in behaviours and not any(
                name == module or name.startswith(module + "_") for module in modules):
            problems.append(test)
    return problems


def folders() -> list[str]:
    return sorted(p.name for p in UNIT.iterdir() if p.is_dir() and p.name != "__pycache__")


def test_every_unit_test_module_names_a_module_of_its_package_or_a_listed_behaviour() -> None:
    problems = []
    for folder in folders():
        if folder in OTHER_FOLDERS:
            continue
        package = package_of(folder)
        assert package.is_dir(), (f"tests/unit/{folder}/ mirrors no package ({package} is "
                                  "missing): name it after one, or list it in OTHER_FOLDERS")
        tests = sorted(p.name for p in (UNIT / folder).glob("test_*.py"))
        problems += [f"tests/unit/{folder}/{test}" for test in name_problems(
            tests, module_names(package), set(BEHAVIOURS.get(folder, {})))]
    assert problems == [], ("named after no module of the package the folder mirrors, nor a "
                            "behaviour listed in tests/lint/test_test_names.py:\n  "
                            + "\n  ".join(problems))


def test_the_lists_name_what_exists_and_nothing_a_module_covers() -> None:
    # A list that outlived its entries would let a stale name pass later.
    assert set(OTHER_FOLDERS) <= set(folders())
    for folder, behaviours in BEHAVIOURS.items():
        modules = module_names(package_of(folder))
        for name in behaviours:
            assert (UNIT / folder / f"test_{name}.py").is_file(), f"{folder}: test_{name}.py"
            assert name_problems([f"test_{name}.py"], modules, set()), (
                f"tests/unit/{folder}/test_{name}.py names a module: drop it from BEHAVIOURS")


def test_the_rule_on_names_old_and_new() -> None:
    modules = module_names(ROOT / "app" / "traffic") | {"data_demo"}
    assert "server" in modules and "endpoints" not in modules  # app/batch/endpoints.py moved
    fine = ["test_server.py", "test_server_health_clock.py", "test_data_demo.py",
            "test_data_demo_seeds.py", "test_docs.py"]
    assert name_problems(fine, modules, {"docs"}) == []
    # A module gone (endpoints), a behaviour not listed, a module's name only inside another.
    stale = ["test_endpoints.py", "test_docs.py", "test_serverless.py", "test_demo.py"]
    assert name_problems(stale, modules, set()) == stale
