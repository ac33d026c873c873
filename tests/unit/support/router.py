"""Where the vllm-router binary is, when it is installed."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

# Where `pip install nightdesk[router]` puts it: next to this interpreter, else on PATH.
ROUTER = shutil.which("vllm-router", path=str(Path(sys.executable).parent)) or shutil.which(
    "vllm-router")
