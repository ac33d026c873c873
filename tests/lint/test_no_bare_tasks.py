"""Check the project's rule that concurrency is structured: no bare task in app/, agents/,
serving/.

A task started with ``asyncio.create_task``, ``asyncio.ensure_future``, ``asyncio.Task(...)``
or an event loop's ``create_task`` belongs to no group: it runs until someone remembers to
end it, as the usage writer, the progress loops, the /metrics readers and the checkpoint
saver's calls once did (each awaited in a ``stop()`` that every owner had to call). A task
belongs to an ``asyncio.TaskGroup`` instead (``group.create_task``), whose ``async with``
ends it: app/traffic/tasks.py's ``beside`` for a loop that runs beside a body.

A loop is known by where it came from: the value of ``get_running_loop()``,
``get_event_loop()`` or ``new_event_loop()``, called in place or kept in a name or attribute.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "agents", "serving")
LOOP_FACTORIES = {"get_running_loop", "get_event_loop", "new_event_loop"}
BARE = {"create_task", "ensure_future", "Task"}  # what ``asyncio.`` must not start


def _called(node: ast.expr) -> str | None:
    """Return the name a call calls (``f`` of ``f()`` or ``x.f()``; None: not a call)."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def bare_tasks(source: str) -> list[str]:
    """Return ``line: code`` for each task ``source`` starts outside a TaskGroup."""
    tree = ast.parse(source)
    # Names and attributes a loop is kept in: ``loop = asyncio.get_running_loop()``.
    loops = {ast.unparse(target) for node in ast.walk(tree) if isinstance(node, ast.Assign)
             and _called(node.value) in LOOP_FACTORIES for target in node.targets}
    # ``from asyncio import create_task``: the name alone starts one.
    imported = {alias.asname or alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module == "asyncio"
                for alias in node.names if alias.name in BARE}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name):
            bare = func.id in imported
        elif isinstance(func, ast.Attribute):
            owner = func.value
            bare = ((isinstance(owner, ast.Name) and owner.id == "asyncio" and func.attr in BARE)
                    or (func.attr == "create_task"
                        and (_called(owner) in LOOP_FACTORIES or ast.unparse(owner) in loops)))
        else:
            bare = False
        if bare:
            found.append(f"{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_no_module_starts_a_task_outside_a_task_group() -> None:
    found = [f"{path.relative_to(ROOT)}:{where}"
             for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             for where in bare_tasks(path.read_text(encoding="utf-8"))]
    assert not found, ("tasks started outside an asyncio.TaskGroup (start them in a group "
                       "whose async with ends them; app/traffic/tasks.py's beside runs a "
                       "loop beside a body):\n" + "\n".join(found))


def test_the_check_finds_each_bare_form_and_passes_a_group() -> None:
    # The control: every way of starting a bare task is found; a group's task is not.
    source = """
import asyncio
from asyncio import create_task as start, ensure_future


async def f(coro, group):
    asyncio.create_task(coro)
    asyncio.ensure_future(coro)
    asyncio.Task(coro)
    start(coro)
    ensure_future(coro)
    asyncio.get_running_loop().create_task(coro)
    loop = asyncio.get_event_loop()
    loop.create_task(coro)
    self._loop = asyncio.new_event_loop()
    self._loop.create_task(coro)
    group.create_task(coro)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(coro)
"""
    assert [line.split(":")[0] for line in bare_tasks(source)] == [
        "7", "8", "9", "10", "11", "12", "14", "16"]
