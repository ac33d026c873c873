"""What the wheel built from a checkout carries, read from pyproject.toml without building it:
its packages as setuptools' ``packages.find`` finds them, and their files."""

from __future__ import annotations

import tomllib
from fnmatch import fnmatchcase
from pathlib import Path


def packaged(root: Path) -> list[str]:
    """Return the packages ``packages.find`` ships: folders with ``__init__.py`` all the way
    down from ``root``, whose dotted name matches one of pyproject.toml's ``include``."""
    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = setup["packages"]["find"]["include"]
    found: list[str] = []
    stack = [p for p in root.iterdir() if (p / "__init__.py").is_file()]
    while stack:
        folder = stack.pop()
        name = ".".join(folder.relative_to(root).parts)
        if any(fnmatchcase(name, pattern) for pattern in include):
            found.append(name)
        stack += [p for p in folder.iterdir() if (p / "__init__.py").is_file()]
    return sorted(found)


def shipped(root: Path) -> set[str]:
    """Return the files the wheel carries, relative to ``root``: each packaged folder's
    modules and the package data pyproject.toml names for it."""
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = data.get("package-data", {})
    files: set[str] = set()
    for package in packaged(root):
        folder = root.joinpath(*package.split("."))
        for pattern in ["*.py", *patterns.get(package, [])]:
            files |= {str(path.relative_to(root)) for path in folder.glob(pattern)}
    return files
