#!/usr/bin/env bash
# Runs ON the GPU host, from the repository root, once a vLLM server answers (see
# gpu-host-bench.sh's header): a real night — `nightdesk run` over N demo tickers with the
# production max_tokens — detached, so that it outlives the device call that starts it (a call
# lasts at most 10 minutes; a process in its own session runs on while the machine is held).
#   bash docs/bench/gpu-night.sh start [N]      # db, demo snapshot of N tickers (default 100), run
#                                               # (ND_LIMIT=K: the night runs the first K of them)
#   bash docs/bench/gpu-night.sh wait SECONDS   # progress every 30 s until the run ends (exit 0)
#                                               # or SECONDS pass (exit 1); with $OUT set, the
#                                               # progress lines and the report so far go there
#   bash docs/bench/gpu-night.sh again          # the same night once more, in the same database
#                                               # (ND_LIMIT=K: over the first K tickers)
#                                               # (the night before, for the ETA, is the first)
#   (ND_STRATEGY=S: `run --strategy S`, e.g. adaptive:fill=0.98,overbook=1.05, for start/again)
#   bash docs/bench/gpu-night.sh resume         # `nightdesk run --resume` (after a lost process)
#   bash docs/bench/gpu-night.sh collect        # report (table, JSON), ranking, db, logs -> $OUT
# Everything lives under ND_NIGHT_DIR (default /root/night): home, night.db, night.log, run.rc.
set -uo pipefail
die() { echo "night.sh: ERROR: $*" >&2; exit 2; }
cd "$(dirname "$0")/../.." || die "cannot cd to the repository root"

dir=${ND_NIGHT_DIR:-/root/night}
as_of=${ND_AS_OF:-2026-11-27}
export NIGHTDESK_HOME=$dir/home ND_DB=$dir/night.db ND_VLLM_LOG=none NIGHTDESK_LOG_LEVEL=info
nd() { bash docs/bench/gpu-host-bench.sh "$@"; }

# The run, in its own session; $OUT belongs to the call that started it and is gone after it.
launch() {
  rm -f "$dir/run.rc"
  setsid nohup env -u OUT bash -c "$1; echo \$? > '$dir/run.rc'" >> "$dir/night.log" 2>&1 < /dev/null &
  echo "night.sh: started in the background (log $dir/night.log)"
}

case "${1:-}" in
  start)
    n=${2:-100}
    [ -e "$dir/night.db" ] && die "$dir/night.db exists: a night already ran here (resume or collect it)"
    mkdir -p "$dir"
    # Installs the wheels into /tmp/site once; the runs below skip that.
    env -u OUT bash docs/bench/gpu-host-bench.sh db upgrade || die "db upgrade failed"
    ND_SKIP_INSTALL=1 env -u OUT bash docs/bench/gpu-host-bench.sh data demo --tickers "$n" --as-of "$as_of" \
      || die "demo snapshot failed"
    export ND_SKIP_INSTALL=1
    date +%s > "$dir/started"
    launch "bash docs/bench/gpu-host-bench.sh run --universe '$NIGHTDESK_HOME/data/$as_of/universe.txt' --as-of $as_of ${ND_LIMIT:+--limit $ND_LIMIT} ${ND_STRATEGY:+--strategy $ND_STRATEGY}"
    ;;
  again)
    [ -e "$dir/night.db" ] || die "no night ran here yet: start one first"
    export ND_SKIP_INSTALL=1
    date +%s > "$dir/started"
    launch "bash docs/bench/gpu-host-bench.sh run --universe '$NIGHTDESK_HOME/data/$as_of/universe.txt' --as-of $as_of ${ND_LIMIT:+--limit $ND_LIMIT} ${ND_STRATEGY:+--strategy $ND_STRATEGY}"
    ;;
  resume)
    export ND_SKIP_INSTALL=1
    launch "bash docs/bench/gpu-host-bench.sh run --resume"
    ;;
  wait)
    limit=${2:-540}; t0=$(date +%s)
    # Each call takes home what the night has so far: a machine given back between two calls
    # (it goes 30 s after a call) takes the run with it, but not these.
    snapshot() {
      [ -n "${OUT:-}" ] || return 0
      grep progress "$dir/night.log" > "$OUT/night-progress.log"
      OUT= ND_SKIP_INSTALL=1 nd report --format json 2>&1 | grep -v '^bench.sh:' > "$OUT/night-report-so-far.json"
    }
    while :; do
      if [ -f "$dir/run.rc" ]; then
        echo "night.sh: run ended, status $(cat "$dir/run.rc"), $(( $(date +%s) - $(cat "$dir/started") )) s after start"
        grep -v '"progress"' "$dir/night.log" | tail -5
        snapshot; exit 0
      fi
      grep progress "$dir/night.log" | tail -1 | cut -c1-400
      [ $(( $(date +%s) - t0 )) -ge "$limit" ] && { echo "night.sh: still running after $limit s"; snapshot; exit 1; }
      sleep 30
    done
    ;;
  collect)
    [ -n "${OUT:-}" ] || die "OUT is not set: nowhere to collect into"
    export ND_SKIP_INSTALL=1
    # At most 8 files come back: the report and ranking, the JSON report, the tail of the run's
    # log, and the database (gpu-host-bench.sh compresses it and splits it into 15 MiB parts).
    # The first report, with $OUT set, also copies the database there (once).
    { nd report; OUT= nd ranking; } > "$OUT/night-report.txt" 2>&1
    OUT= nd report --format json 2>&1 | grep -v '^bench.sh:' > "$OUT/night-report.json"
    tail -c 4M "$dir/night.log" > "$OUT/night.log"
    ls -l "$OUT"
    head -80 "$OUT/night-report.txt"
    ;;
  *) die "usage: gpu-night.sh start [N] | again | wait SECONDS | resume | collect" ;;
esac
