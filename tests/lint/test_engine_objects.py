"""Check issue 45's rules on the engine's objects, so that a break cannot come back unseen.

In the engine (app/batch, app/traffic), the recorder that reads its objects (app/recorder)
and the call path's modules (app/llm.py, app/promptsize.py, app/usage.py):

- no ``getattr``/``hasattr``: an object's fields are read as typed attributes. Allowed: an
  object's own fields by name (``getattr(self, name)``, the knobs' range checks), and any
  listed in ``KNOWN_GETATTR`` with why (none now), a list that may shrink and never grow;
- no parameter typed ``Any`` (``*args``/``**kwargs`` and ``__aexit__``'s aside);
- a ``Ticket``'s fields are written by the ticker's client and its gate only
  (app/traffic/client.py, gate.py), and by the scheduler's tail rule, which marks
  ``urgent`` (docs/architecture.md, "The engine's call path").

And nowhere in app/, agents/ or serving/ does the product name a test's stand-in: no
identifier with ``fake`` in it, no ``SimpleNamespace`` (fakes live in tests/, never in
the wheel: tests/lint/test_wheel.py).
"""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

from app.traffic.ticket import Ticket

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ["app/batch", "app/traffic", "app/recorder", "app/llm.py", "app/promptsize.py",
           "app/usage.py"]
# (module, attribute read): why it is still read by name. Empty since the server's reader
# declares what the server reads of it (GaugeSource: interval, capacity, block, fleet read).
KNOWN_GETATTR: dict[tuple[str, str], str] = {}
TICKET_WRITERS = {"app/traffic/client.py", "app/traffic/gate.py"}
TICKET_MARKS = {("app/traffic/scheduler.py", "urgent")}  # the tail rule's
TICKET_FIELDS = {f.name for f in fields(Ticket)}


def modules(paths: list[str]) -> list[tuple[str, ast.Module]]:
    found = []
    for name in paths:
        path = ROOT / name
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            found.append((str(file.relative_to(ROOT)), ast.parse(file.read_text())))
    return found


def getattrs(name: str, tree: ast.Module) -> list[tuple[str, str]]:
    """Return (module, attribute) of each getattr/hasattr on an object other than self."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and node.args):
            target = node.args[0]
            if isinstance(target, ast.Name) and target.id == "self":
                continue
            attribute = node.args[1] if len(node.args) > 1 else None
            found.append((name, attribute.value if isinstance(attribute, ast.Constant)
                          else ast.unparse(node)))
    return found


def any_parameters(name: str, tree: ast.Module) -> list[str]:
    """Return ``module:function(parameter)`` for each parameter typed Any or Any | None."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if node.name == "__aexit__":
            continue
        arguments = node.args
        for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            if arg.annotation is not None and ast.unparse(arg.annotation) in (
                    "Any", "Any | None", "Optional[Any]"):
                found.append(f"{name}:{node.name}({arg.arg})")
    return found


def ticket_writes(name: str, tree: ast.Module) -> list[tuple[str, str]]:
    """Return (module, field) for each write of a Ticket field on an object other than self."""
    found = []
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign)
                   else [])
        for target in targets:
            for each in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if (isinstance(each, ast.Attribute) and each.attr in TICKET_FIELDS
                        and not (isinstance(each.value, ast.Name) and each.value.id == "self")):
                    found.append((name, each.attr))
    return found


def names_a_fake(name: str, tree: ast.Module) -> list[str]:
    """Return each identifier of ``tree`` that names a test's stand-in."""
    found = []
    for node in ast.walk(tree):
        ident = (node.id if isinstance(node, ast.Name)
                 else node.attr if isinstance(node, ast.Attribute)
                 else node.name if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef
                                              | ast.ClassDef)
                 else node.module or "" if isinstance(node, ast.ImportFrom)
                 else None)
        if ident is not None and ("fake" in ident.lower() or ident == "SimpleNamespace"):
            found.append(f"{name}:{getattr(node, 'lineno', '?')}: {ident}")
    return found


def test_no_getattr_on_the_engines_objects_beyond_the_known() -> None:
    found = [seen for name, tree in modules(CHECKED) for seen in getattrs(name, tree)]
    assert sorted(set(found) - set(KNOWN_GETATTR)) == [], (
        "read it as a typed attribute (declare it on the object's class or protocol)")
    # A known one fixed leaves its entry stale: take it off the list.
    assert set(KNOWN_GETATTR) <= set(found), set(KNOWN_GETATTR) - set(found)


def test_no_parameter_of_the_engine_is_typed_any() -> None:
    found = [seen for name, tree in modules(CHECKED) for seen in any_parameters(name, tree)]
    assert found == []


def test_only_the_client_and_its_gate_write_a_ticket() -> None:
    found = {seen for name, tree in modules(["app"]) for seen in ticket_writes(name, tree)
             if name.startswith(("app/batch", "app/traffic", "app/recorder"))
             and name not in TICKET_WRITERS}
    assert found == TICKET_MARKS


def test_no_product_module_names_a_fake() -> None:
    found = [seen for name, tree in modules(["app", "agents", "serving"])
             for seen in names_a_fake(name, tree)]
    assert found == []


def test_each_check_sees_a_break() -> None:
    tree = ast.parse("def f(server, x: Any, *a: Any):\n"
                     "    getattr(server.gauges, 'fleet', None); getattr(self, 'fill')\n"
                     "    ticket.chained = True; self.hold = 0; t.done += 1\n"
                     "    reader = FakeServer(); ns = SimpleNamespace()\n")
    assert getattrs("m.py", tree) == [("m.py", "fleet")]
    assert any_parameters("m.py", tree) == ["m.py:f(x)"]
    assert ticket_writes("m.py", tree) == [("m.py", "chained"), ("m.py", "done")]
    assert [seen.split(": ")[1] for seen in names_a_fake("m.py", tree)] == [
        "FakeServer", "SimpleNamespace"]
