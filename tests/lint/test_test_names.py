"""Check that every unit test module is named after what it tests (issue 45).

The rule, for each folder ``tests/unit/<pkg>/`` that mirrors a code package (``app/<pkg>/``,
or ``agents/`` and ``serving/`` themselves):

- ``test_<name>.py`` names a module of that package: ``<name>`` is the module's path inside
  the package with ``_`` for ``/`` (``agents/data/demo.py``: ``data_demo``), or begins with
  it and an aspect (``engine_resume``, ``sampler_lag``), so a module renamed or removed
  leaves a test name that fails here instead of one that points at nothing;
- or ``<name>`` is one of the few behaviours listed below, each of which no one module owns.

A folder that mirrors no package is listed too, with what it holds; ``fakevllm`` mirrors
the tests' own fake server, tests/fakevllm/. The top of tests/unit/ mirrors app/'s top: a
test module there names one of app/'s loose modules (``config``, ``llm``, ...) or a package
of one module (``tasks``: app/tasks/__init__.py), or is one of the cross-cutting behaviours
listed in ``TOP_BEHAVIOURS`` (bad input, quiet output, secrets in URLs, ...); any other
belongs in the folder of the package it tests.
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
# Behaviours at the top of tests/unit/ that span packages: no module's name says what they test.
TOP_BEHAVIOURS = {
    "bad_input_ids": "each bad batch id to a command or a page",
    "bad_input_properties": "malformed tickers, universe files, dates and settings",
    "bad_input_table": "each bad setting or database given to nightdesk",
    "bad_option_values": "a bad value for any typed option of any command",
    "bom_inputs": "a byte-order mark at the start of every text file read",
    "demo_label": "the DEMO label on every face of a night",
    "errno_lines": "a path or address that cannot be used: one line, no [Errno N]",
    "quiet_output": "one line per error, one mask, each failure once",
    "unreadable_paths": "a directory where a file is expected",
    "url_secrets": "a password in any URL appears nowhere",
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
    if folder == "fakevllm":
        return ROOT / "tests" / "fakevllm"
    return ROOT / folder if folder in ("agents", "serving") else ROOT / "app" / folder


def top_names() -> set[str]:
    """Return what the top of tests/unit/ mirrors: app/'s loose modules, and its packages of
    one module (only an ``__init__.py``), which have no folder of tests of their own."""
    loose = {p.stem for p in (ROOT / "app").glob("*.py") if p.name != "__init__.py"}
    return loose | {p.name for p in (ROOT / "app").iterdir()
                    if p.is_dir() and [f.name for f in p.glob("*.py")] == ["__init__.py"]}


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


def test_a_test_module_at_the_top_names_a_module_of_apps_top_or_a_listed_behaviour() -> None:
    tests = sorted(p.name for p in UNIT.glob("test_*.py"))
    problems = name_problems(tests, top_names(), set(TOP_BEHAVIOURS))
    assert problems == [], ("at tests/unit/'s top, named after no loose module of app/ nor a "
                            "behaviour in TOP_BEHAVIOURS: move it to the folder of the "
                            "package it tests\n  " + "\n  ".join(problems))


def test_the_lists_name_what_exists_and_nothing_a_module_covers() -> None:
    # A list that outlived its entries would let a stale name pass later.
    assert set(OTHER_FOLDERS) <= set(folders())
    for name in TOP_BEHAVIOURS:
        assert (UNIT / f"test_{name}.py").is_file(), f"top: test_{name}.py"
        assert name_problems([f"test_{name}.py"], top_names(), set()), (
            f"tests/unit/test_{name}.py names a module of app/'s top: drop it from the list")
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
    # The top: app/'s loose modules and app/tasks/ pass; a fake's test or a package's does not.
    assert {"config", "llm", "usage", "tasks"} <= top_names() and "traffic" not in top_names()
    assert name_problems(["test_fakevllm.py", "test_router_rows.py", "test_settings_names.py",
                          "test_llm_router_rows.py"], top_names(), set(TOP_BEHAVIOURS)) == [
        "test_fakevllm.py", "test_router_rows.py", "test_settings_names.py"]
