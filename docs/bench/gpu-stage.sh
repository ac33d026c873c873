#!/usr/bin/env bash
# Runs HERE (the developer's machine, from the repository root): stages everything a lent GPU host
# needs for the docs/bench/gpu-*.sh runs, in pieces small enough for the device tool's carries
# (64 MiB a call, the working tree included). Writes .gpu/p0 .. .gpu/pN, each one piece of one
# tar holding vLLM's stage (prepare.sh's four parts) and nightdesk's own wheels (nd-whl/).
#   bash docs/bench/gpu-stage.sh PREPARE_SH [MODEL_SHAPE]
# PREPARE_SH: the gpu-vllm recipe's prepare.sh (it downloads vLLM 0.24.0 and the wheels the host
# image lacks); MODEL_SHAPE: dense-32b-shape or moe-30b-a3b-shape. The tokenizer is the embedded
# model's (`make model` first).
# On the host, one call per piece, back to back (the machine goes back 30 s after a call):
#   mkdir -p /root/stage && mv .gpu/pK/* /root/stage/
# and in the last, before anything else:
#   cd /root/stage && cat piece.* | tar -xf - && rm piece.* && bash host-setup.sh FLAGS
# after which the gpu-*.sh scripts find nightdesk's wheels in /root/stage/nd-whl.
set -euo pipefail
prep=${1:?usage: gpu-stage.sh PREPARE_SH [MODEL_SHAPE]}
shape=${2:-moe-30b-a3b-shape}
home=${NIGHTDESK_HOME:-var}
tok=$home/models/smollm2-135m
[ -f "$tok/tokenizer.json" ] || { echo "no tokenizer in $tok: run make model first"; exit 2; }

bash "$prep" "$tok" "$shape"
work=$(mktemp -d)
mkdir -p "$work/stage/nd-whl"
for s in .gpu/s*; do cp "$s"/* "$work/stage/"; done

# nightdesk's dependencies for the host's Python 3.12, less what vLLM's stage and the image hold:
# the host-wheels list, torch and its CUDA wheels, numpy/scipy/scikit-learn (the image's
# sentence-transformers and jax need them), and matplotlib with its compiled needs (the
# earlier H200 and H100 nights ran without carrying them) — but pandas travels: the image's 3.0.6
# is below nightdesk's floor (3.1: read_csv's float round trip). Anything else the image holds is
# installed again under /tmp/site, which is harmless.
plat="--only-binary=:all: --python-version 3.12 --implementation cp"
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_27_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64 \
         manylinux1_x86_64; do plat="$plat --platform $p"; done
deps=$(python3 - <<'PY'
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))
PY
)
skip=$(sed 's/==.*//' "$(dirname "$prep")/host-wheels.txt"; printf '%s\n' torch numpy scipy scikit-learn triton \
       matplotlib pillow fonttools kiwisolver contourpy)
mkdir -p "$work/all"
# shellcheck disable=SC2086  # the platform flags are words
echo "$deps" | python3 -m pip download -q $plat -d "$work/all" -r /dev/stdin
norm() { echo "$1" | tr 'A-Z_.' 'a-z--'; }
for w in "$work"/all/*.whl; do
  name=$(norm "$(basename "$w" | cut -d- -f1)")
  keep=1
  for s in $skip; do [ "$name" = "$(norm "$s")" ] && keep=0; done
  case $name in nvidia-*) keep=0 ;; esac
  [ $keep = 1 ] && cp "$w" "$work/stage/nd-whl/"
done
echo "nightdesk wheels: $(ls "$work/stage/nd-whl" | wc -l), $(du -sh "$work/stage/nd-whl" | cut -f1)"

rm -rf .gpu && mkdir -p .gpu
# A call carries the working tree with its .git (~26 MiB in 2026-12) beside its piece, 64 MiB in all.
(cd "$work/stage" && tar -cf - . | split -b "${ND_PIECE_MB:-36}M" -d -a 1 - "$work/piece.")
i=0; for f in "$work"/piece.*; do mkdir -p .gpu/p$i; mv "$f" .gpu/p$i/; i=$((i+1)); done
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
du -sh .gpu/p*
rm -rf "$work"
echo "ready: $i pieces, .gpu/p0 .. .gpu/p$((i-1)): one carry each, the last joins them"
