"""Check the project's rule that concurrency is structured: no bare task in app/, agents/,
serving/, no thread in app/ that outlives its caller.

A task started with ``asyncio.create_task``, ``asyncio.ensure_future``, ``asyncio.Task(...)``
or an event loop's ``create_task`` belongs to no group: it runs until someone remembers to
end it, as the usage writer, the progress loops, the /metrics readers and the checkpoint
saver's calls once did (each awaited in a ``stop()`` that every owner had to call). A task
belongs to an ``asyncio.TaskGroup`` instead (``group.create_task``), whose ``async with``
ends it: app/tasks/'s ``beside`` for a loop that runs beside a body.

A loop is known by where it came from: the value of ``get_running_loop()``,
``get_event_loop()`` or ``new_event_loop()``, called in place or kept in a name or attribute.

A thread cannot be cancelled: ``asyncio.to_thread``, a loop's ``run_in_executor`` (and
``anyio.to_thread``) raise their caller's cancellation at once and leave the thread running,
so a group exits under it. app/ calls a blocking function through app/tasks/'s
``in_thread`` instead, which waits for the thread; it alone may name them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "agents", "serving")
LOOP_FACTORIES = {"get_running_loop", "get_event_loop", "new_event_loop"}
BARE = {"create_task", "ensure_future", "Task"}  # what ``asyncio.`` must not start
THREADS = {"to_thread", "run_in_executor"}  # named at all (called or passed), a thread let go
IN_THREAD = ROOT / "app" / "tasks" / "__init__.py"


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


def bare_threads(source: str) -> list[str]:
    """Return ``line: code`` for each place ``source`` names a thread its caller may outlive."""
    def names_one(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute):
            return node.attr in THREADS
        return isinstance(node, ast.ImportFrom) and (
            (node.module or "").split(".")[-1] in THREADS
            or any(alias.name in THREADS for alias in node.names))

    return [f"{node.lineno}: {ast.unparse(node)[:80]}"  # type: ignore[attr-defined]
            for node in ast.walk(ast.parse(source)) if names_one(node)]


def test_no_module_starts_a_task_outside_a_task_group() -> None:
    found = [f"{path.relative_to(ROOT)}:{where}"
             for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             for where in bare_tasks(path.read_text(encoding="utf-8"))]
    assert not found, ("tasks started outside an asyncio.TaskGroup (start them in a group "
                       "whose async with ends them; app/tasks/'s beside runs a "
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


def test_no_module_of_app_lets_a_thread_outlive_its_caller() -> None:
    found = [f"{path.relative_to(ROOT)}:{where}"
             for path in sorted((ROOT / "app").rglob("*.py")) if path != IN_THREAD
             for where in bare_threads(path.read_text(encoding="utf-8"))]
    assert not found, ("threads a cancelled caller leaves running (call a blocking function "
                       "through app/tasks/'s in_thread, which waits for its end):\n"
                       + "\n".join(found))


def test_the_check_finds_each_thread_form_and_passes_in_thread() -> None:
    # The control: each way of handing a call to a thread is found, passed as a value too.
    source = """
import asyncio
from asyncio import to_thread
from anyio import to_thread as threads
from anyio.to_thread import run_sync
from app.tasks import in_thread


async def f(call, retrying):
    await asyncio.to_thread(call)
    await retrying(asyncio.to_thread, call)
    await asyncio.get_running_loop().run_in_executor(None, call)
    await anyio.to_thread.run_sync(call)
    await in_thread(call)
    await retrying(in_thread, call)
"""
    assert sorted(int(line.split(":")[0]) for line in bare_threads(source)) == [
        3, 4, 5, 10, 11, 12, 13]
