#!/usr/bin/env bash
# Runs ON the GPU host, from the repository root, once a vLLM server answers (see
# gpu-host-bench.sh's header): issue #46's fair sweep, detached so that it outlives the device
# call that starts it (a call lasts at most 10 minutes). Three invocations, one after another,
# each writing its own JSON (a machine lost between them keeps what the earlier ones wrote):
#   r1: one run of four fixed-N sizes, the tail rule on the rule's n*, and adaptive;
#   r2: the second run of adaptive, the two likeliest best fixed arms and fixed-15:tail=on;
#   r3: the second run of the remaining fixed sizes.
# Or, where the device time allows one round only (2026-12-06, an H100 session):
#   a: adaptive and fixed-15 twice each, interleaved (--repeat 2), the comparison first;
#   b1, b2: one run of fixed-10 and fixed-22, then of fixed-30 and fixed-15:tail=on.
#   k: whether the cache headroom is adaptive's last half percent (docs/lab/2026-12-06-h100-
#      fair-sweep.md): adaptive (with its tail-off twin), adaptive:kv_high=0.95,tail=off and
#      fixed-15, twice each, interleaved (8 arms: about 17 minutes on an H100).
#   m1, m2: the token budget's margins spent (`fill=0.98,overbook=1.05`, the fleet simulation's
#      probe: docs/lab/2026-12-07-fleet-sims-targets.md) beside adaptive as it is, one run each
#      per invocation, so that a lease cut after m1 keeps one round: its preemptions and KV peak.
#      Both with the tail rule off, so that the bench adds no twins (two runs a round, not four).
# `nightdesk bench combine r1.json r2.json r3.json` pools them: every strategy's mean and spread.
#   bash docs/bench/gpu-fair-sweep.sh start     # installs the wheels, prints the sweep, launches
#   bash docs/bench/gpu-fair-sweep.sh wait SECS  # until all three end or SECS pass; JSON -> $OUT
# ND_FAIR_ROUNDS="r2 r3" runs only those invocations (a later session completing a sweep whose
# r1 is already committed).
set -uo pipefail
die() { echo "fair.sh: ERROR: $*" >&2; exit 2; }
cd "$(dirname "$0")/../.." || die "cannot cd to the repository root"

dir=${ND_FAIR_DIR:-/root/fair}
W="--tickers 40 --scale 0.2 --output-scale 0.04"
bench() {  # NAME STRATEGIES
  echo "ND_DB=$dir/$1.db bash docs/bench/gpu-host-bench.sh bench schedulers $W --strategies $2" \
       "--json-out $dir/$1.json > $dir/$1.log 2>&1"
}

case "${1:-}" in
  start)
    mkdir -p "$dir"
    # Installs the wheels into /tmp/site and prints the arms the sweep's rule picks here.
    env -u OUT ND_VLLM_LOG=none ND_DB=$dir/plan.db bash docs/bench/gpu-host-bench.sh \
      bench schedulers $W --strategies sweep,adaptive --plan || die "the plan did not run"
    export ND_SKIP_INSTALL=1 ND_VLLM_LOG=none
    declare -A arms=([r1]=fixed-15,adaptive,fixed-15:tail=on,fixed-22,fixed-10,fixed-30
                     [r2]=adaptive,fixed-15,fixed-15:tail=on,fixed-22 [r3]=fixed-10,fixed-30
                     [a]="adaptive,fixed-15 --repeat 2" [b1]=fixed-10,fixed-22
                     [b2]=fixed-30,fixed-15:tail=on
                     [k]="adaptive,adaptive:kv_high=0.95,tail=off,fixed-15 --repeat 2"
                     [m1]="adaptive:tail=off,adaptive:fill=0.98,overbook=1.05,tail=off"
                     [m2]="adaptive:fill=0.98,overbook=1.05,tail=off,adaptive:tail=off")
    script=""
    for r in ${ND_FAIR_ROUNDS:-r1 r2 r3}; do
      [ -n "${arms[$r]:-}" ] || die "unknown round $r (r1, r2, r3, a, b1, b2, k, m1 or m2)"
      script="$script$(bench "$r" "${arms[$r]}"); "
    done
    setsid nohup env -u OUT bash -c "$script touch '$dir/done'" > "$dir/sweep.log" 2>&1 < /dev/null &
    echo "fair.sh: started in the background (logs in $dir)"
    ;;
  wait)
    limit=${2:-540}; t0=$(date +%s)
    while [ ! -e "$dir/done" ] && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
      sleep 15
      echo "fair.sh: $(( $(date +%s) - t0 )) s: $(ls "$dir"/*.json 2>/dev/null | xargs -rn1 basename | tr '\n' ' ')"
    done
    for f in "$dir"/*.log; do echo "--- $f"; tail -25 "$f"; done
    if [ -n "${OUT:-}" ]; then
      cp "$dir"/*.json "$OUT"/ 2>/dev/null
      tail -c 2M /root/vllm.log > "$OUT/vllm.log" 2>/dev/null
      tar -czf "$OUT/logs.tgz" -C "$dir" $(cd "$dir" && ls *.log) 2>/dev/null
    fi
    [ -e "$dir/done" ]
    ;;
  *) die "usage: gpu-fair-sweep.sh start | wait SECONDS" ;;
esac
