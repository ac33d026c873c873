"""Check that the unit tests keep each helper in one place (issue 45).

A helper (a module-level function that is not a test) written out again in a second
module of tests/unit/ (its test modules and tests/unit/support/) or of tests/'s top
(tests/webhook.py, tests/dbfaults.py) fails: the second copy belongs in
tests/unit/support/ (or is the one already there), imported by both. Two helpers are the
same when their bodies are, their docstrings and names aside; one of a few statements
(``return x + 1``) may repeat.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SMALL = 12  # syntax nodes; a helper this small may be written twice


def helpers(name: str, tree: ast.Module) -> dict[str, str]:
    """Return {body as syntax: ``module:name``} of each module-level helper of ``tree``."""
    found = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if node.name.startswith("test_"):
            continue
        body = node.body
        if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            body = body[1:]  # its docstring
        code = ast.Module(body=body, type_ignores=[])
        if sum(1 for _ in ast.walk(code)) >= SMALL:
            found[ast.dump(node.args) + ast.dump(code)] = f"{name}:{node.name}"
    return found


def repeated(modules: dict[str, str]) -> list[list[str]]:
    """Return the helpers written out in more than one of ``modules`` ({name: source})."""
    where: dict[str, list[str]] = defaultdict(list)
    for name, source in modules.items():
        for body, helper in helpers(name, ast.parse(source)).items():
            where[body].append(helper)
    return sorted(sorted(found) for found in where.values()
                  if len({helper.split(":")[0] for helper in found}) > 1)


def test_no_helper_is_written_out_in_two_test_modules() -> None:
    files = [*sorted((TESTS / "unit").rglob("*.py")), *sorted(TESTS.glob("*.py"))]
    modules = {str(path.relative_to(TESTS)): path.read_text() for path in files}
    assert repeated(modules) == [], "keep one in tests/unit/support/ and import it"


def test_the_check_sees_a_helper_written_twice() -> None:
    port = ("import socket\n\ndef {name}() -> int:\n    {doc}with socket.socket() as sock:\n"
            "        sock.bind(('127.0.0.1', 0))\n        return int(sock.getsockname()[1])\n")
    a = port.format(name="_free_port", doc="")
    b = port.format(name="closed_port", doc='"""A port nothing listens on."""\n    ')
    assert repeated({"a.py": a, "b.py": b}) == [["a.py:_free_port", "b.py:closed_port"]]
    assert repeated({"a.py": a}) == []  # one module's own helper
    assert repeated({"a.py": "def f(x):\n    return x + 1\n",
                     "b.py": "def g(x):\n    return x + 1\n"}) == []  # too small to count
