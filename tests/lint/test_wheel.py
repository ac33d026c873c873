"""Check that the wheel carries no test code: no package of ``tests``, no fake, no import of one.

The fakes (tests/fakevllm/) and the benches that need them (tests/bench/) live under
``tests/``, which the wheel leaves out. What would put them back: pyproject.toml packaging
``tests``, a packaged module importing ``tests`` (the installed nightdesk would then fail
to import it), or a fake written into a packaged folder. The packages are found as
setuptools' ``packages.find`` finds them, from pyproject.toml's own ``include``, without
building the wheel.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.support.wheel import packaged

ROOT = Path(__file__).resolve().parents[2]


def _imports_tests(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(name == "tests" or name.startswith("tests.") for name in names):
            return True
    return False


def wheel_problems(root: Path) -> dict[str, str]:
    """Return {path: what is wrong} for test code the wheel built from ``root`` would carry."""
    packages = packaged(root)
    problems: dict[str, str] = {}
    for package in packages:
        folder = root.joinpath(*package.split("."))
        if package.split(".")[0] == "tests":
            problems[f"{folder.relative_to(root)}/"] = "the tests are packaged"
            continue
        for module in sorted(folder.glob("*.py")):
            where = str(module.relative_to(root))
            if "fake" in module.stem.lower():
                problems[where] = "a fake in a packaged folder"
            elif _imports_tests(ast.parse(module.read_text(), where)):
                problems[where] = "a packaged module imports tests"
    return problems


def test_the_wheel_carries_no_test_code() -> None:
    assert wheel_problems(ROOT) == {}


def test_the_check_sees_the_packages_the_wheel_has() -> None:
    # Guards the test above against finding no packages (it would then pass on nothing).
    found = set(packaged(ROOT))
    assert {"app", "app.bench", "app.traffic", "agents", "serving", "migrations"} <= found
    assert not any(name.split(".")[0] == "tests" for name in found)


def _tree(root: Path, include: list[str], files: dict[str, str]) -> Path:
    includes = ", ".join(f'"{pattern}"' for pattern in include)
    root.mkdir()
    (root / "pyproject.toml").write_text(
        f"[tool.setuptools.packages.find]\ninclude = [{includes}]\n")
    for name, text in {"app/__init__.py": "", "tests/__init__.py": "",
                       "tests/fakes.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_wrong_tree_fails(tmp_path: Path) -> None:
    clean = _tree(tmp_path / "clean", ["app*"], {"app/bench.py": "import httpx\n"})
    assert wheel_problems(clean) == {}
    imports = _tree(tmp_path / "imports", ["app*"], {
        "app/bench.py": "from tests.fakes import FakeServer\n",
        "app/other.py": "def f():\n    import tests.fakes\n"})
    assert wheel_problems(imports) == {"app/bench.py": "a packaged module imports tests",
                                       "app/other.py": "a packaged module imports tests"}
    fake = _tree(tmp_path / "fake", ["app*"], {"app/fakeserver.py": ""})
    assert wheel_problems(fake) == {"app/fakeserver.py": "a fake in a packaged folder"}
    packaged = _tree(tmp_path / "packaged", ["app*", "tests*"], {})
    assert wheel_problems(packaged) == {"tests/": "the tests are packaged"}
