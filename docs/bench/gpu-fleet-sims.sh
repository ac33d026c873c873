#!/usr/bin/env bash
# Runs ON a lent GPU host (16 CPU cores), from the repository root, detached, beside a GPU night
# that keeps to other cores: issue #46's fleet simulations (tests/bench/fleet.py), one after
# another, on a host where the client and the simulated endpoints each have cores of their own.
# No GPU is used; the usage rows go to SQLite (the host has no PostgreSQL).
#   setsid nohup bash docs/bench/gpu-fleet-sims.sh OUT_DIR "TICKERSxENDPOINTS:STRATEGY" ... &
# e.g. "500x8:adaptive:initial=256". Client CPUs: $ND_FLEET_CLIENT_CPUS (default 10-13); the
# endpoints' process: $ND_FLEET_SERVER_CPUS (default 14-15). Wheels: /root/stage/nd-whl, installed
# into /tmp/fleet-site (apart from the night's /tmp/site), read before vLLM's stage in /root/site (pydantic and the rest). Each run writes OUT_DIR/fleet-T-E-N.json
# and its summary lines to OUT_DIR/fleet.log.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
out=${1:?usage: gpu-fleet-sims.sh OUT_DIR "TICKERSxENDPOINTS:STRATEGY" ...}
shift
[ "$#" -gt 0 ] || { echo "gpu-fleet-sims.sh: no run named" >&2; exit 2; }
client=${ND_FLEET_CLIENT_CPUS:-10-13}
server=${ND_FLEET_SERVER_CPUS:-14-15}
mkdir -p "$out"
log=$out/fleet.log
note() { echo "$(date -u +%FT%TZ) $*" >> "$log"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/fleet-site /root/stage/nd-whl/*.whl 2>> "$log" || { note "wheels failed"; exit 1; }
i=0
for spec in "$@"; do
  i=$((i + 1))
  shape=${spec%%:*}; strategy=${spec#*:}
  tickers=${shape%x*}; endpoints=${shape#*x}
  note "run $i: $tickers tickers over $endpoints endpoints, $strategy (load $(cut -d' ' -f1 /proc/loadavg))"
  env -u OUT PYTHONPATH=/tmp/fleet-site:/root/site:$PWD NIGHTDESK_HOME=/tmp/fleet-home-$i \
    taskset -c "$client" python3 -m tests.bench.fleet --tickers "$tickers" --endpoints "$endpoints" \
      --speedup 1 --output-scale 0.2 --strategy "$strategy" --database sqlite \
      --server-cpus "$server" --json-out "$out/fleet-$tickers-$endpoints-$i.json" \
      > "$out/run-$i.log" 2>&1
  note "run $i: exit $?"
  grep -A8 '^fleet:' "$out/run-$i.log" >> "$log"
done
note "done"
