"""Check that no two modules of the code share a name unless listed here with why (issue 45:
names that do not collide).

A newcomer who reads ``from app.recorder import summary`` and ``from app.morning import
summary`` cannot tell the two apart. Modules of app/cli/ are named after the commands they
hold (``app/cli/plan.py`` is ``nightdesk plan``) and are left out, as are ``__init__`` and
``__main__``. A pair listed here that is renamed leaves a stale entry, which fails too.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Module name: (the modules that share it, why they may).
SHARED = {
    "config": ({"app/config.py", "agents/config.py"},
               "each package's own settings; app's builds agents' PipelineConfig"),
    "errors": ({"app/errors.py", "agents/errors.py", "serving/errors.py"},
               "each package's error tree; app's re-exports the other two's roots"),
    "preflight": ({"app/runs/preflight.py", "serving/preflight.py"},
                  "the night's checks, which run the serving layer's checks of the server"),
    "track": ({"app/quality/track.py", "app/web/track.py"},
              "the track record, and its page"),
    "engine": ({"app/batch/engine.py", "app/db/engine.py"},
               "not the same thing (the batch engine, SQLAlchemy's engines): left, as a rename "
               "of either touches most of app/"),
    "server": ({"app/traffic/server.py", "app/web/server.py"},
               "not the same thing (a vLLM server of a batch, the web server): left likewise"),
    "state": ({"agents/state.py", "app/web/state.py"},
              "not the same thing (a graph's state, a web request's): left likewise"),
}


def modules_by_name() -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for package in ("app", "agents", "serving"):
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if path.stem in ("__init__", "__main__") or rel.parts[:2] == ("app", "cli"):
                continue
            found[path.stem].add(str(rel))
    return found


def test_no_two_modules_share_a_name_unless_listed() -> None:
    shared = {name: paths for name, paths in modules_by_name().items() if len(paths) > 1}
    assert {name: paths for name, paths in shared.items()
            if name not in SHARED or SHARED[name][0] != paths} == {}, (
        "rename one (say what it is), or list the pair in SHARED with why")
    assert set(SHARED) <= set(shared), f"no longer shared, drop: {set(SHARED) - set(shared)}"


def test_the_summary_modules_stay_apart() -> None:
    # The collision issue 45's audit found (2026-12-07): the recorder's figures were summary.py.
    assert modules_by_name()["summary"] == {"app/morning/summary.py"}
