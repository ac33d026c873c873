"""The simulated benches the bench tests run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def bench(module: str, *args: str, tmp_path: Path) -> dict[str, Any]:
    """Run ``python -m MODULE ARGS --json-out`` from the checkout's root; return its JSON."""
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", module, *args, "--json-out", str(out)],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


ROOT = Path(__file__).resolve().parents[3]
