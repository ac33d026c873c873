#!/usr/bin/env bash
# Runs ON the GPU host, detached, once host-setup.sh has started the MoE-shaped server with bf16
# weights (see gpu-host-bench.sh's header): the same night twice in one database, first on that
# server, then on the same model with FP8 weights (`--quantization fp8`), so the two weights sit
# side by side on one night shape, and the second night has the first as its night before (the
# ETA's prior). Every step appends to $ND_PAIR_DIR/steps.log; each night's report, progress
# lines and the second night's ETA fixture land in $ND_PAIR_DIR, for a device call to copy.
#   setsid nohup bash docs/bench/gpu-moe-pair.sh N "SERVER FLAGS" [same] > /root/pair.log 2>&1 &
# N: tickers; SERVER FLAGS: the vllm serve flags both servers share (the second adds
# --quantization fp8); `same` runs the second night on the first server, unchanged (the ETA's
# pair alone, when the device time left has no room for a second server's start); `bf16` runs the
# pair the other way round: FLAGS (host-setup.sh's) hold `--quantization fp8`, and the second
# server starts without it. The first night's own fixture (a first night: no night before) is
# exported as soon as it ends, so a lease cut during the second night keeps it.
# NIGHTDESK_NODE_MAX_TOKENS, if set, shapes both nights alike. ND_BEFORE_TICKERS=K runs the night
# before over the first K of the N tickers only (a universe that grew overnight: the ETA's prior
# then comes from a night of another size, not a copy of tonight). ND_THIRD_TICKERS=K adds a third
# night over the first K tickers on the same server, with its own fixture (eta_night_gpu_moe_3.json):
# tonight's night before is then the second night.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
n=${1:?usage: gpu-moe-pair.sh N "SERVER FLAGS"}
flags=${2:?usage: gpu-moe-pair.sh N "SERVER FLAGS"}
second=${3:-fp8}
out=${ND_PAIR_DIR:-/root/pair}
dir=${ND_NIGHT_DIR:-/root/night}
mkdir -p "$out"
# With `same`, the first night is only the night before: labelled so, not by its weights.
first=bf16; [ "$second" = same ] && first=before; [ "$second" = bf16 ] && first=fp8
case $second in fp8|same|bf16) ;; *) echo "gpu-moe-pair.sh: the second night is fp8, bf16 or same, not $second" >&2; exit 2 ;; esac
step() { echo "$(date -u +%FT%TZ) $*" | tee -a "$out/steps.log"; }
nd() { env -u OUT ND_SKIP_INSTALL=1 NIGHTDESK_HOME="$dir/home" ND_DB="$dir/night.db" \
         ND_VLLM_LOG=none bash docs/bench/gpu-host-bench.sh "$@" 2>&1 | grep -v '^bench.sh:'; }

# Waits for the night started last, then keeps its report and progress lines under a label.
night() {
  local label=$1 t0; t0=$(date +%s)
  until [ -f "$dir/run.rc" ]; do sleep 10; done
  step "night $label ended: status $(cat "$dir/run.rc"), $(( $(date +%s) - t0 )) s after the wait began"
  nd report --format json > "$out/$label-report.json"
  { nd report; nd ranking; } > "$out/$label-report.txt"
  grep progress "$dir/night.log" > "$out/$label-progress.log"
  : > "$dir/night.log"
}

# A night's ETA replay fixture (tests/unit/support/): the newest night, with its night before if any.
fixture() {
  local file=$1 tickers=$2 before=$3 served=$4 batch
  batch=$(env -u OUT PYTHONPATH=/tmp/site:/root/site:$PWD python3 -c "
import sqlite3; print(sqlite3.connect('$dir/night.db').execute('select max(id) from batches').fetchone()[0])")
  env -u OUT PYTHONPATH=/tmp/site:/root/site:$PWD python3 -m tests.unit.support.eta_fixture \
    "sqlite:///$dir/night.db" "$batch" "$out/$file" \
    "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), vLLM 0.24.0, MoE shape with random weights, vllm serve $served, $tickers demo tickers, budgets ${NIGHTDESK_NODE_MAX_TOKENS:-production}; the night before: $before" \
    >> "$out/steps.log" 2>&1 || step "fixture export failed ($file)"
}

step "night $first: ${ND_BEFORE_TICKERS:-$n} of $n tickers, flags: $flags, budgets: ${NIGHTDESK_NODE_MAX_TOKENS:-production}"
ND_LIMIT=${ND_BEFORE_TICKERS:-} bash docs/bench/gpu-night.sh start "$n" >> "$out/steps.log" 2>&1 \
  || { step "start failed"; exit 1; }
night "$first"
fixture "eta_night_gpu_moe_$first.json" "${ND_BEFORE_TICKERS:-$n}" none "$flags"
grep -E "Model loading took|Available KV cache|KV cache size|Maximum concurrency" /root/vllm.log \
  > "$out/server-$first.txt"

if [ "$second" = same ]; then
  step "night again: the same server"
else
  # The second server's flags: FP8 added to bf16's, or taken out of FP8's.
  if [ "$second" = fp8 ]; then flags2="$flags --quantization fp8"; else flags2=${flags/--quantization fp8/}; fi
  step "server $second: stopping $first, starting with: $flags2"
  bash docs/bench/gpu-serve.sh stop >> "$out/steps.log" 2>&1
  # shellcheck disable=SC2086  # the flags are words
  if ! bash docs/bench/gpu-serve.sh 0 8000 $flags2 > "$out/server-$second.txt" 2>&1; then
    step "$second server did not start"; tail -40 /root/vllm-8000.log >> "$out/server-$second.txt"; exit 1
  fi
  grep -E "Model loading took" /root/vllm-8000.log >> "$out/server-$second.txt"
  step "night $second"
fi
bash docs/bench/gpu-night.sh again >> "$out/steps.log" 2>&1
night "$second"

fixture eta_night_gpu_moe.json "$n" "${ND_BEFORE_TICKERS:-$n} tickers, $([ "$second" = same ] && echo the same server || echo "$first weights")" "${flags2:-$flags}"

if [ -n "${ND_THIRD_TICKERS:-}" ]; then
  step "night 3: $ND_THIRD_TICKERS of $n tickers, the same server"
  ND_LIMIT=$ND_THIRD_TICKERS bash docs/bench/gpu-night.sh again >> "$out/steps.log" 2>&1
  night third
  fixture eta_night_gpu_moe_3.json "$ND_THIRD_TICKERS" "$n tickers, the same server" "${flags2:-$flags}"
fi
# ND_PAIR_DB=0 leaves the database behind (its compression takes a minute or more of a lease; the
# fixtures above hold what the ETA's replay reads).
if [ "${ND_PAIR_DB:-1}" != 0 ]; then
  python3 -c "
import sqlite3; sqlite3.connect('$dir/night.db').execute(\"vacuum into '$out/night.db'\")" \
    && (cd "$out" && python3 -c "
import sys; sys.path.insert(0, '/root/zs'); import zstandard
open('night.db.zst','wb').write(zstandard.ZstdCompressor(level=19).compress(open('night.db','rb').read()))") \
    && rm -f "$out/night.db"
fi
step "done"
