"""Check two of issue 45's must-shows on the tree, so a drift past them fails ``make lint``:

- the engine, app/batch + app/traffic, is at most ``ENGINE_MAX`` lines, counted as
  ``wc -l app/batch/*.py app/traffic/*.py | tail -1`` counts them;
- at most ``TOP_MODULES_MAX`` modules lie loose at ``app/``'s top (``ls app/*.py``,
  ``__init__.py`` included).

docs/architecture.md ("Sizes") gives today's figures; docs/lab/2026-12-03-engine-size.md
and docs/lab/2026-12-05-app-size.md how the engine was brought under its limit, and the
rules for doing it again: economy, never a measured behaviour dropped or lines joined.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
ENGINE_MAX = 3_450
TOP_MODULES_MAX = 8


def engine_files() -> list[Path]:
    """Return the files ``wc -l app/batch/*.py app/traffic/*.py`` counts."""
    return sorted([*APP.glob("batch/*.py"), *APP.glob("traffic/*.py")])


def lines(path: Path) -> int:
    """Return the lines of ``path`` as ``wc -l`` counts them: its newline characters."""
    return path.read_bytes().count(b"\n")


def test_the_engine_stays_within_its_lines() -> None:
    counts = {str(path.relative_to(ROOT)): lines(path) for path in engine_files()}
    total = sum(counts.values())
    largest = ", ".join(f"{name} {n}" for name, n in
                        sorted(counts.items(), key=lambda item: -item[1])[:5])
    assert total <= ENGINE_MAX, (
        f"app/batch + app/traffic is {total:,} lines, over issue 45's {ENGINE_MAX:,} "
        f"(largest: {largest}); bring it back by economy (docs/lab/2026-12-05-app-size.md)")


def test_app_top_holds_few_loose_modules() -> None:
    loose = sorted(path.name for path in APP.glob("*.py"))
    assert len(loose) <= TOP_MODULES_MAX, (
        f"app/ holds {len(loose)} modules at its top ({', '.join(loose)}), over issue 45's "
        f"{TOP_MODULES_MAX}: a module its importers place in one package belongs there")


def test_the_engine_count_is_wc_l() -> None:
    # The control for the limit above: the count is the one the issue and the docs quote.
    files = engine_files()
    out = subprocess.run(["wc", "-l", *map(str, files)], capture_output=True, text=True,
                         check=True).stdout
    assert int(out.splitlines()[-1].split()[0]) == sum(map(lines, files))
