"""Check issue 45's "no callback from a lower layer into a higher one" where it was broken last.

The /metrics reader (app/traffic/sampler.py) once held two callables its Server set on it
(``push = Server.reading``, ``slots = Server.chain_slots``) and called them up. Now the
Server takes each reading and applies it. Two guards keep it so:

- the reader, and what its Server knows of one (``GaugeSource``), declare no attribute or
  method parameter of a callable type (``Callable``, ``Awaitable``);
- no module of the engine (app/batch, app/traffic) hands one of its own bound methods to
  another object by setting an attribute of it (``other.field = self.method``).

The usage writer (app/usage.py, below the engine) once took ``on_lost``, a callable the
engine set to its batch's ``Halt.request``; the scheduler's ``run`` took ``on_done``, which
it called with each ticker's result. Now the writer sets ``stopped`` (an asyncio.Event) and
``lost``, which the batch waits on beside its work, and a ticker's job does its own end
work. Two more guards:

- the usage writer's only callable is ``sleep`` (time, not a layer above it);
- no module of the engine, nor the usage writer, takes or passes an event hook: a
  parameter, field or keyword named ``on_*`` (what a lower layer would call up with).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The reader, and the server's view of a reader (GaugeSource): neither holds a callable.
READER = [ROOT / "app" / "traffic" / "sampler.py", ROOT / "app" / "traffic" / "server.py"]
CALLABLE_TYPES = {"Callable", "Awaitable", "Coroutine"}
USAGE = ROOT / "app" / "usage.py"
LOWER = sorted([*ROOT.glob("app/batch/*.py"), *ROOT.glob("app/traffic/*.py"), USAGE])


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


def event_hooks(path: Path) -> list[str]:
    """Return ``file:line: name`` for each parameter, annotated field, attribute set or
    keyword argument in ``path`` named ``on_*``: an event hook, given or handed over."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.arg | ast.keyword):
            name = node.arg
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            name = node.attr
        else:
            continue
        if name is not None and name.startswith("on_"):
            found.append(f"{path.name}:{node.lineno}: {name}")
    return found


def test_the_metrics_reader_holds_no_callable() -> None:
    assert [hit for path in READER for hit in callable_attributes(path)] == [], (
        "the /metrics reader must not hold a callable set from outside: its Server takes "
        "each reading (docs/architecture.md, 'Each Server reads its /metrics')")


def test_the_usage_writer_holds_no_callable_but_its_sleep() -> None:
    assert callable_attributes(USAGE) == ["UsageRecorder.sleep"], (
        "the usage writer must not call up into the batch: it sets ``stopped`` and ``lost``, "
        "which the batch waits on (docs/architecture.md, 'How the objects were counted')")


def test_no_lower_layer_takes_an_event_hook() -> None:
    assert [hit for path in LOWER for hit in event_hooks(path)] == [], (
        "a lower layer must not be handed something to call up with: expose plain state "
        "the engine reads or waits on (docs/architecture.md, 'How the objects were counted')")


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
    # The usage writer and the scheduler as they were.
    hooked = tmp_path / "hooked.py"
    hooked.write_text("class Writer:\n"
                      "    on_full: Callable[[], None] | None = None\n"
                      "    def __init__(self, on_lost=None): ...\n"
                      "async def run(jobs, on_done): ...\n"
                      "Writer(on_lost=halt.request).on_stop = halt.cut\n")
    assert sorted(event_hooks(hooked)) == ["hooked.py:2: on_full", "hooked.py:3: on_lost",
                                           "hooked.py:4: on_done", "hooked.py:5: on_lost",
                                           "hooked.py:5: on_stop"]
