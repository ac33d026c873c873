"""Check issue 45's "no callback from a lower layer into a higher one" where it was broken last.

The /metrics reader (app/traffic/sampler.py) once held two callables its Server set on it
(``push = Server.reading``, ``slots = Server.chain_slots``) and called them up. Now the
Server takes each reading and applies it. Two guards keep it so:

- the reader, and what its Server knows of one (``GaugeSource``), declare no attribute or
  method parameter of a callable type (``Callable``, ``Awaitable``);
- no module of the engine (app/batch, app/traffic) hands one of its own bound methods to
  another object by setting an attribute of it (``other.field = self.method``).

The usage writer (app/usage.py, below the engine) once took ``on_lost``, a callable the
engine set to its batch's ``Halt.request``. Now it sets ``stopped`` (an asyncio.Event) and
``lost``, which the batch waits on beside its work. Its only callable is ``sleep`` (time,
not a layer above it).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The reader, and the server's view of a reader (GaugeSource): neither holds a callable.
READER = [ROOT / "app" / "traffic" / "sampler.py", ROOT / "app" / "traffic" / "server.py"]
CALLABLE_TYPES = {"Callable", "Awaitable", "Coroutine"}
USAGE = ROOT / "app" / "usage.py"


def callable_attributes(path: Path) -> list[str]:
    """Return ``Class.name`` for each attribute, or parameter of a method, of a class in
    ``path`` annotated with a callable type (one given in is one that could be called up)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ClassDef):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.AnnAssign):
                annotated = [(ast.unparse(inner.target), inner.annotation)]
            elif isinstance(inner, ast.arg) and inner.annotation is not None:
                annotated = [(inner.arg, inner.annotation)]
            else:
                continue
            for name, annotation in annotated:
                names = {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}
                names |= {n.attr for n in ast.walk(annotation) if isinstance(n, ast.Attribute)}
                if names & CALLABLE_TYPES:
                    found.append(f"{node.name}.{name}")
    return found


def methods_handed_over(path: Path) -> list[str]:
    """Return each ``x.attr = self.method`` in ``path`` where ``x`` is not ``self`` and
    ``method`` is one of the class's own (a field copied over is no callback)."""
    found = []
    for cls in ast.walk(ast.parse(path.read_text())):
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = {f.name for f in cls.body
                   if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
        for node in ast.walk(cls):
            value = node.value if isinstance(node, ast.Assign) else None
            if not (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                    and value.value.id == "self" and value.attr in methods):
                continue
            for target in node.targets:  # type: ignore[attr-defined]
                if isinstance(target, ast.Attribute) and not (
                        isinstance(target.value, ast.Name) and target.value.id == "self"):
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_metrics_reader_holds_no_callable() -> None:
    assert [hit for path in READER for hit in callable_attributes(path)] == [], (
        "the /metrics reader must not hold a callable set from outside: its Server takes "
        "each reading (docs/architecture.md, 'Each Server reads its /metrics')")


def test_the_usage_writer_holds_no_callable_but_its_sleep() -> None:
    assert callable_attributes(USAGE) == ["UsageRecorder.sleep"], (
        "the usage writer must not call up into the batch: it sets ``stopped`` and ``lost``, "
        "which the batch waits on (docs/architecture.md, 'How the objects were counted')")


def test_no_engine_module_hands_its_methods_down() -> None:
    engine = sorted([*ROOT.glob("app/batch/*.py"), *ROOT.glob("app/traffic/*.py")])
    assert [hit for path in engine for hit in methods_handed_over(path)] == []


def test_the_guards_see_what_they_forbid(tmp_path: Path) -> None:
    # The control: each guard finds the pattern it forbids (the reader as it was).
    module = tmp_path / "reader.py"
    module.write_text("class Reader:\n"
                      "    def note(self, then: Callable[[], None]): ...\n"
                      "    def __init__(self, server):\n"
                      "        self.push: Callable[[int], None] | None = None\n"
                      "        server.gauges.on_read = self.note\n")
    assert sorted(callable_attributes(module)) == ["Reader.self.push", "Reader.then"]
    assert methods_handed_over(module) == ["reader.py:5: server.gauges.on_read = self.note"]
