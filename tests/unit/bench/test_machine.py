"""``code_version``: the commit a bench's figures came from, and edits made on top of it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from app.bench.machine import code_version


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True)


def test_two_different_edits_of_one_commit_are_not_the_same_code(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-q", "-m", "one")
    clean = code_version(tmp_path)
    assert len(clean) == 40 and "+" not in clean
    # Both runs were "<commit>+dirty", so bench combine took them for one code.
    (tmp_path / "a.py").write_text("x = 2\n")
    first = code_version(tmp_path)
    (tmp_path / "a.py").write_text("x = 3\n")
    second = code_version(tmp_path)
    assert first.startswith(f"{clean}+dirty-") and second.startswith(f"{clean}+dirty-")
    assert first != second
    (tmp_path / "a.py").write_text("x = 2\n")
    assert code_version(tmp_path) == first  # the same edit: the same version
    (tmp_path / "b.py").write_text("untracked\n")
    assert code_version(tmp_path) == first  # an untracked file is not the code's
