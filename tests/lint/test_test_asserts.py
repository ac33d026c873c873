"""Every test checks something that can fail (the project's standard: no test that asserts
nothing, no check that cannot fail; docs/lab/2026-12-07-test-audit.md).

Read from the tests' syntax, for each ``test_*`` function of ``tests/**/test_*.py``:

- it asserts: an ``assert``, ``pytest.raises``/``fail``/``warns``, a call named ``assert*``,
  or a call of a function of tests/ that does (followed through the module's own functions
  and what it imports from ``tests.*``, at any depth);
- no ``assert`` holds whatever the code does: a true constant, ``x or True``, or a
  comparison of an expression with itself that calls nothing (``a == a``; ``f() is f()``
  asks whether f caches, and is kept);
- its asserts are not all ``isinstance`` (a type says nothing of the value);
- it catches no ``Exception``/``BaseException`` (nor everything): an AssertionError is one,
  so such a handler can swallow the test's own verdict. A helper may keep an error to check.

And every ``xfail`` in tests/ is ``strict`` (a limitation fixed makes it XPASS, which fails)
and names what it ``raises`` (a known miss is an AssertionError; a crash is no known miss).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
# pytest's own ways of failing a test; ``approx`` alone asserts nothing.
PYTEST_CHECKS = {"raises", "fail", "warns", "deprecated_call"}
BROAD = {"Exception", "BaseException"}


@dataclass
class Module:
    """A module of tests/: its functions and the names it imports from other tests modules."""

    name: str
    tree: ast.Module
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)  # local -> (module, name)
    aliases: dict[str, str] = field(default_factory=dict)  # local -> module (``import ... as``)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_module(name: str, tree: ast.Module) -> Module:
    module = Module(name, tree)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            module.functions[node.name] = node
        elif isinstance(node, ast.ClassDef):  # methods, by their own names
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    module.functions.setdefault(item.name, item)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                local = alias.asname or alias.name
                if node.module.startswith("tests"):
                    module.imported[local] = (node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tests") and alias.asname:
                    module.aliases[alias.asname] = alias.name
    return module


def read_tree(files: dict[str, str]) -> dict[str, Module]:
    """Return the modules of ``files`` (module name -> source)."""
    return {name: read_module(name, ast.parse(source)) for name, source in files.items()}


def suite_tree() -> dict[str, Module]:
    return read_tree({module_name(p): p.read_text() for p in sorted(TESTS.rglob("*.py"))})


def _called(call: ast.Call) -> tuple[str | None, str]:
    """Return (the name of the object a call is made on, if a plain name; the called name)."""
    func = call.func
    if isinstance(func, ast.Attribute):
        owner = func.value.id if isinstance(func.value, ast.Name) else None
        return owner, func.attr
    return None, func.id if isinstance(func, ast.Name) else ""


class Checker:
    """Whether functions of the modules assert, each found once."""

    def __init__(self, modules: dict[str, Module]) -> None:
        self.modules = modules
        self.known: dict[tuple[str, str], bool] = {}

    def resolve(self, module: Module, owner: str | None, name: str) -> tuple[str, str] | None:
        """Return the tests function a call names: (module, function), or None."""
        if owner is None:
            if name in module.functions:
                return module.name, name
            return module.imported.get(name)
        target = module.aliases.get(owner) or (
            ".".join(module.imported[owner]) if owner in module.imported else None)
        return (target, name) if target in self.modules else None

    def asserts(self, module: str, function: str) -> bool:
        key = (module, function)
        if key not in self.known:
            self.known[key] = False  # a cycle proves nothing
            found = self.modules.get(module)
            node = found.functions.get(function) if found else None
            self.known[key] = (found is not None and node is not None
                               and self.body_asserts(found, node))
        return self.known[key]

    def body_asserts(self, module: Module, node: ast.AST) -> bool:
        for inner in ast.walk(node):
            if isinstance(inner, ast.Assert):
                return True
            if not isinstance(inner, ast.Call):
                continue
            owner, name = _called(inner)
            if owner == "pytest" and name in PYTEST_CHECKS:
                return True
            target = self.resolve(module, owner, name)
            if target is not None:
                if self.asserts(*target):
                    return True
            elif name.startswith("assert"):  # unittest.mock's, numpy's, pandas' asserts
                return True
        return False


def _calls_nothing(node: ast.expr) -> bool:
    return not any(isinstance(n, ast.Call | ast.Await | ast.Yield | ast.NamedExpr)
                   for n in ast.walk(node))


def always_true(test: ast.expr) -> str | None:
    """Return why an assert's test holds whatever the code does, or None."""
    if isinstance(test, ast.Constant) and test.value:
        return "a true constant"
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) and any(
            isinstance(v, ast.Constant) and v.value for v in test.values):
        return "`or` a true constant"
    if (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq | ast.Is | ast.LtE | ast.GtE)
            and ast.dump(test.left) == ast.dump(test.comparators[0])
            and _calls_nothing(test.left)):
        return "compared with itself"
    return None


def _broad(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(k, ast.Name) and k.id in BROAD for k in kinds)


def problems(modules: dict[str, Module], test_modules: set[str]) -> list[str]:
    """Return each test of ``test_modules`` that breaks a rule above, as ``module:line name:
    why``."""
    checker = Checker(modules)
    found = []
    for name in sorted(test_modules):
        module = modules[name]
        tests = [n for n in module.functions.values() if n.name.startswith("test")]
        for test in tests:
            where = f"{name}:{test.lineno} {test.name}"
            if not checker.body_asserts(module, test):
                found.append(f"{where}: asserts nothing")
            asserts = [n for n in ast.walk(test) if isinstance(n, ast.Assert)]
            for node in asserts:
                why = always_true(node.test)
                if why:
                    found.append(f"{where}: `assert {ast.unparse(node.test)}` is {why}")
            if asserts and len(asserts) == sum(
                    isinstance(a.test, ast.Call) and _called(a.test) == (None, "isinstance")
                    for a in asserts) and not _asserts_otherwise(checker, module, test):
                found.append(f"{where}: asserts only types (isinstance)")
            for handler in (n for n in ast.walk(test) if isinstance(n, ast.ExceptHandler)):
                if _broad(handler):
                    found.append(f"{where}: catches every exception at line {handler.lineno}"
                                 " (an AssertionError too)")
    return found


def loose_xfails(modules: dict[str, Module]) -> list[str]:
    """Return each ``pytest.mark.xfail`` of ``modules`` not strict or naming no ``raises``."""
    found = []
    for name, module in sorted(modules.items()):
        called = {id(n.func) for n in ast.walk(module.tree) if isinstance(n, ast.Call)}
        for node in ast.walk(module.tree):
            if id(node) in called:
                continue  # read with its call
            mark = node.func if isinstance(node, ast.Call) else node
            if not (isinstance(mark, ast.Attribute) and mark.attr == "xfail"
                    and ast.unparse(mark.value) == "pytest.mark"):
                continue
            given = {k.arg: k.value for k in node.keywords} if isinstance(node, ast.Call) else {}
            strict = given.get("strict")
            if not (isinstance(strict, ast.Constant) and strict.value is True) \
                    or "raises" not in given:
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def _asserts_otherwise(checker: Checker, module: Module, test: ast.AST) -> bool:
    """Tell whether a test asserts beyond its ``assert`` statements (raises, helpers)."""
    stripped = ast.parse(ast.unparse(test))
    for node in ast.walk(stripped):
        if isinstance(node, ast.Assert):
            node.test = ast.Constant(False)
    return any(checker.body_asserts(module, n) for n in ast.walk(stripped)
               if isinstance(n, ast.Call))


def test_every_test_asserts_something_that_can_fail() -> None:
    modules = suite_tree()
    test_modules = {name for name in modules if name.rsplit(".", 1)[-1].startswith("test_")}
    assert len(test_modules) > 150  # the check reads the whole suite
    found = problems(modules, test_modules)
    assert found == [], "tests that cannot fail (rules: tests/lint/test_test_asserts.py):\n  " \
        + "\n  ".join(found)


def test_every_xfail_is_strict_and_names_the_failure_it_expects() -> None:
    found = loose_xfails(suite_tree())
    assert found == [], "add strict=True and raises=...:\n  " + "\n  ".join(found)


EXAMPLES = {
    "tests.unit.support.helpers": (
        "def check(x):\n    assert x == 1\n"
        "def deeper(x):\n    check(x)\n"
        "def quiet(x):\n    return x\n"),
    "tests.unit.test_examples": (
        "import pytest\n"
        "import tests.unit.support.helpers as helpers\n"
        "from tests.unit.support.helpers import deeper, quiet\n"
        "def local(x):\n    assert x\n"
        "def test_direct():\n    assert 1 + 1 == 2\n"
        "def test_raises():\n    with pytest.raises(ValueError):\n        int('x')\n"
        "def test_via_import():\n    deeper(1)\n"
        "def test_via_alias():\n    helpers.check(1)\n"
        "def test_via_local():\n    local(1)\n"
        "def test_mock(m):\n    m.assert_called_once_with(1)\n"
        "def test_cached(f):\n    assert f() is f()\n"
        "def test_nothing():\n    quiet(1)\n"
        "def test_or_true(x):\n    assert x == 2 or True\n"
        "def test_constant():\n    assert 'always'\n"
        "def test_itself(x):\n    assert x.y == x.y\n"
        "def test_type(x):\n    assert isinstance(x, int)\n"
        "def test_swallowed():\n    try:\n        assert 1 == 2\n    except Exception:\n"
        "        pass\n"
        "def test_bare():\n    try:\n        assert 1 == 2\n    except:\n        pass\n"
        "@pytest.mark.xfail(strict=True, raises=AssertionError, reason='known')\n"
        "def test_known():\n    assert 1 == 2\n"
        "@pytest.mark.xfail(reason='not strict')\n"
        "def test_loose():\n    assert 1 == 2\n"
        "@pytest.mark.xfail\n"
        "def test_bare_mark():\n    assert 1 == 2\n"
        "CASES = [pytest.param(1, marks=pytest.mark.xfail(strict=True, reason='no raises'))]\n"),
}


def test_the_check_tells_a_test_that_asserts_from_one_that_cannot_fail() -> None:
    modules = read_tree(EXAMPLES)
    said = problems(modules, {"tests.unit.test_examples"})
    flagged = {line.split(" ", 1)[1].split(":")[0]: line.rsplit(": ", 1)[1] for line in said}
    assert flagged == {
        "test_nothing": "asserts nothing",
        "test_or_true": "`assert x == 2 or True` is `or` a true constant",
        "test_constant": "`assert 'always'` is a true constant",
        "test_itself": "`assert x.y == x.y` is compared with itself",
        "test_type": "asserts only types (isinstance)",
        "test_swallowed": "catches every exception at line 34 (an AssertionError too)",
        "test_bare": "catches every exception at line 39 (an AssertionError too)",
    }, said
    assert sorted(line.split(":")[1] for line in loose_xfails(modules)) == ["44", "47", "50"]
