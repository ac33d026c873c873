#!/usr/bin/env bash
# Runs ON the GPU host, after /root/stage/host-setup.sh installed vLLM 0.24 under /root/site (see
# gpu-host-bench.sh's header): start one more vLLM server with random weights, detached, on the
# GPUs and port given, with the same model and name (gpu-model) as the first, and wait for
# /health. Its log is /root/vllm-PORT.log.
#   bash docs/bench/gpu-serve.sh 1 8001 --quantization fp8 ...      # a second replica on GPU 1
#   bash docs/bench/gpu-serve.sh 0,1 8000 --data-parallel-size 2 ... # vLLM's own data parallel
#   bash docs/bench/gpu-serve.sh stop                                 # stop every vLLM server
set -uo pipefail
if [ "${1:-}" = stop ]; then
  # The bracket keeps this shell's own command line from matching the pattern.
  pkill -TERM -f 'vllm[.]entrypoints[.]cli[.]main serve'
  for _ in $(seq 1 60); do
    sleep 2
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && { echo "gpu-serve: all servers stopped"; exit 0; }
  done
  pkill -KILL -f 'vllm[.]entrypoints[.]cli[.]main serve'; pkill -KILL -f 'VLLM[:]'; sleep 5
  echo "gpu-serve: servers killed after 120 s"; exit 0
fi
[ "$#" -ge 2 ] || { echo "usage: gpu-serve.sh GPUS PORT [vllm serve flags] | stop" >&2; exit 2; }
gpus=$1 port=$2; shift 2
[ -d /root/site/vllm ] || { echo "gpu-serve: /root/site has no vllm: run host-setup.sh first" >&2; exit 2; }
export PYTHONPATH=/root/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
log=/root/vllm-$port.log
cd /root || exit 2
CUDA_VISIBLE_DEVICES=$gpus setsid nohup python3 -m vllm.entrypoints.cli.main serve /root/stage/model \
  --served-model-name gpu-model --load-format dummy --host 127.0.0.1 --port "$port" "$@" \
  > "$log" 2>&1 < /dev/null &
pid=$!
start=$(date +%s)
while sleep 5; do
  if curl -sf "127.0.0.1:$port/health" >/dev/null; then
    echo "gpu-serve: GPUs $gpus port $port healthy after $(( $(date +%s) - start )) s"; break
  fi
  if ! kill -0 "$pid" 2>/dev/null; then echo "gpu-serve: server died" >&2; tail -20 "$log" >&2; exit 1; fi
  [ $(( $(date +%s) - start )) -gt 480 ] && { echo "gpu-serve: not healthy after 480 s" >&2; exit 1; }
done
grep -E "Available KV cache|KV cache size|Maximum concurrency" "$log" | tail -4
