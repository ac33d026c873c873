"""No test module imports from another: what tests share lives in tests/unit/support."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# `from tests.unit.db.test_lock import x`, `from .test_x import y`, `import tests.unit.test_x`
FROM_A_TEST = re.compile(r"^\s*(?:from\s+(?:tests(?:\.\w+)*)?\.?test_\w*\s+import|"
                         r"from\s+tests(?:\.\w+)*\.test_\w+\s+import|"
                         r"import\s+tests(?:\.\w+)*\.test_\w+)", re.MULTILINE)


def test_no_test_module_imports_from_another() -> None:
    found = [f"{path.relative_to(TESTS)}: {match.group(0).strip()}"
             for path in sorted(TESTS.rglob("*.py"))
             for match in FROM_A_TEST.finditer(path.read_text())]
    assert found == []


def test_the_check_sees_an_import_from_a_test_module() -> None:
    assert FROM_A_TEST.search("    from tests.unit.db.test_lock import fake_llm\n")
    assert FROM_A_TEST.search("from .test_usage import new_batch\n")
    assert not FROM_A_TEST.search("from tests.unit.support.engines import fake_llm\n")
