#!/usr/bin/env bash
# Runs ON the GPU host, from the repository root, once a vLLM server answers on
# http://127.0.0.1:8000 with the model name gpu-model, and vLLM with its dependencies (openai,
# pydantic, pydantic-settings ...) is installed under /root/site. That is how the H200 runs in
# docs/performance.md were set up: the host had no package index, so vLLM 0.24.0 and the
# packages its Python image lacked were installed from copied wheels into /root/site, and the
# server was started from there with random weights (--load-format dummy) and
# VLLM_USE_FLASHINFER_SAMPLER=0 (FlashInfer was not installed); its log is /root/vllm.log.
# docs/bench/gpu-stage.sh builds that stage here, with nightdesk's wheels, in carry-sized pieces.
#
# This script installs the wheels nightdesk needs beyond those (.whl files) into /tmp/site, then
# runs the nightdesk CLI from this checkout with the script's arguments, e.g.
#   bash docs/bench/gpu-host-bench.sh bench schedulers --tickers 32 --json-out "$OUT/schedulers.json"
# When $OUT names a folder (where results are collected), the SQLite database of the run and
# the tail of /root/vllm.log are copied there at the end.
# Wheels are read from ./.whl, else from $NIGHTDESK_WHL_DIR, else /root/stage/nd-whl.
# Optional: NIGHTDESK_LLM_BASE_URL (one URL or several, comma-joined: one per replica, e.g.
# started by docs/bench/gpu-serve.sh), ND_DB (the SQLite file, default /tmp/nd.db; two runs at
# once need two), ND_SKIP_INSTALL=1 (the wheels are already in /tmp/site), NIGHTDESK_LOG_LEVEL
# (default warning; info shows a batch's progress lines).
set -uo pipefail
die() { echo "bench.sh: ERROR: $*" >&2; exit 2; }

cd "$(dirname "$0")/../.." || die "cannot cd to the repository root"
[ -f app/cli/__init__.py ] || die "not in nightdesk's repository root ($PWD has no app/cli)"
[ "$#" -gt 0 ] || die "no CLI arguments given (e.g.: bench schedulers --tickers 32)"

# --- wheels -> /tmp/site ---------------------------------------------------------------------
whl=""
for d in "${NIGHTDESK_WHL_DIR:-}" .whl /root/stage/nd-whl; do
  [ -n "$d" ] && compgen -G "$d/*.whl" >/dev/null && { whl=$d; break; }
done
[ -n "${ND_SKIP_INSTALL:-}" ] || [ -n "$whl" ] || die "no wheels found in .whl/, \$NIGHTDESK_WHL_DIR or /root/stage/nd-whl"
if [ -n "${ND_SKIP_INSTALL:-}" ]; then
  echo "bench.sh: ND_SKIP_INSTALL set: using the wheels already in /tmp/site"
else
echo "bench.sh: installing $(ls "$whl"/*.whl | wc -l) wheels from $whl into /tmp/site"
if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
       --target /tmp/site "$whl"/*.whl 2>/tmp/nd-pip.err; then
  grep -vi warning /tmp/nd-pip.err >&2
  die "pip could not install the wheels from $whl into /tmp/site (see above)"
fi
fi

# --- environment -------------------------------------------------------------------------------
[ -d /root/site/vllm ] || die "/root/site has no vllm: install vLLM and its dependencies (openai, pydantic, pydantic-settings ...) there first (see this script's header)"
export PYTHONPATH=/tmp/site:/root/site:$PWD
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
db=${ND_DB:-/tmp/nd.db}
export NIGHTDESK_DATABASE_URL=sqlite:///$db
export NIGHTDESK_LLM_BASE_URL=${NIGHTDESK_LLM_BASE_URL:-http://127.0.0.1:8000/v1}
export NIGHTDESK_LLM_MODEL=${NIGHTDESK_LLM_MODEL:-gpu-model}
export NIGHTDESK_SERVER_PROFILE=${NIGHTDESK_SERVER_PROFILE:-gpu-dummy}
export NIGHTDESK_LOG_LEVEL=${NIGHTDESK_LOG_LEVEL:-warning}
export NIGHTDESK_CONTEXT_CHECK_INCLUDES_OUTPUT=true
export NIGHTDESK_METRICS_INTERVAL_S=1
[ -f "$db" ] && echo "bench.sh: note: $db already exists (earlier run on this machine); new rows are added to it"

# --- preflight: imports and server ---------------------------------------------------------------
if ! python3 - <<'PY'
import importlib, sys
mods = ["app.cli", "app.bench.schedulers", "app.batch.engine", "agents.graph"]
try:
    for m in mods:
        importlib.import_module(m)
except ImportError as e:
    print(f"bench.sh: ERROR: nightdesk does not import on this host: {e!r}\n"
          f"  missing module {getattr(e, 'name', '?')!r}: add its wheel (cp312, manylinux x86_64) to .whl", file=sys.stderr)
    sys.exit(1)
import importlib.metadata as md
def v(n):
    try: return md.version(n)
    except Exception: return "-"
print("bench.sh: imports ok; python", sys.version.split()[0], "|",
      ", ".join(f"{n} {v(n)}" for n in ("openai", "pydantic", "pydantic-settings", "httpx", "typer",
                                        "rich", "sqlalchemy", "langgraph", "numpy", "pandas")))
PY
then
  die "import check failed (see above)"
fi
for url in ${NIGHTDESK_LLM_BASE_URL//,/ }; do
  root=${url%/v1}
  if ! curl -sf --max-time 10 "$root/health" >/dev/null; then
    [ -f /root/vllm.log ] && { echo "--- tail of /root/vllm.log ---" >&2; tail -30 /root/vllm.log >&2; }
    die "the vLLM server does not answer on $root/health: start it first (see this script's header)"
  fi
  curl -sf --max-time 10 "$url/models" | grep -q "\"$NIGHTDESK_LLM_MODEL\"" \
    || echo "bench.sh: WARNING: $url/models does not list $NIGHTDESK_LLM_MODEL" >&2
done

# --- the run -------------------------------------------------------------------------------------
echo "bench.sh: running: nightdesk $*"
start=$(date +%s)
python3 -c 'from app.cli import main; main()' "$@"
rc=$?
echo "bench.sh: nightdesk exited with status $rc after $(( $(date +%s) - start )) s"

# --- results -------------------------------------------------------------------------------------
if [ -n "${OUT:-}" ]; then
  # The database and, beside it, its SQLite checkpoints (a night resumes from both).
  for f in "$db" "${db%.db}.checkpoints.db"; do
    name=$(basename "$f")
    if [ -f "$f" ]; then
      size=$(stat -c %s "$f")
      if [ "$size" -le $((15 * 1024 * 1024)) ]; then
        cp "$f" "$OUT/$name" && echo "bench.sh: copied $f ($size bytes) to \$OUT/$name"
      else
        # Keep every file under 16 MiB (the limit on what was collected from $OUT on the H200
        # machine): compress (zstd from /root/site), split if needed.
        echo "bench.sh: $f is $size bytes: writing \$OUT/$name.zst (decompress: zstd -d)"
        if python3 -c '
import sys, zstandard
with open(sys.argv[1], "rb") as f, open(sys.argv[2], "wb") as o:
    zstandard.ZstdCompressor(level=10, threads=-1).copy_stream(f, o)' "$f" "$OUT/$name.zst"; then
          zsize=$(stat -c %s "$OUT/$name.zst")
          if [ "$zsize" -gt $((15 * 1024 * 1024)) ]; then
            (cd "$OUT" && split -b 15M -d -a 1 $name.zst $name.zst.part && rm $name.zst)
            echo "bench.sh: $name.zst is $zsize bytes: split into $(ls "$OUT"/$name.zst.part* | wc -l) parts (cat $name.zst.part* > $name.zst)"
          fi
        else
          echo "bench.sh: ERROR: could not compress $f; it will not come back" >&2
        fi
      fi
    elif [ "$f" = "$db" ]; then
      echo "bench.sh: WARNING: $db does not exist; nothing to copy" >&2
    fi
  done
  # ND_VLLM_LOG: the server log to keep (none: keep none; two runs at once keep one each).
  log=${ND_VLLM_LOG:-/root/vllm.log}
  [ "$log" != none ] && [ -f "$log" ] && tail -c 8M "$log" > "$OUT/$(basename "$log")"
fi
exit $rc
