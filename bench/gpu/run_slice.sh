#!/usr/bin/env bash
# Run or continue profiling slices on the GPU host, one profiler chain per GPU, and collect their results.
#
# usage (on the GPU host, from the repo root, after unpack.sh put vLLM in /tmp/site, or GM_SITE):
#   bench/gpu/run_slice.sh WAIT_S GRID SHAPE:GPU[:REPEATS[:MODES]] [SHAPE:GPU[:REPEATS[:MODES]] ...] [-- profile options...]
# example:
#   bench/gpu/run_slice.sh 540 src/graphmode/data/default_grid.yaml llama-3.1-8b:0:3 qwen2.5-0.5b:1:3 llama-3.2-1b:1:3
#   (the 8B shape on GPU 0; the Qwen shape, then the 1B shape, on GPU 1; three repeats each)
#
# Assignments:
#   SHAPE    a file in models/shapes/ without .json; every mode of a shape runs on one GPU
#            (CUDA_VISIBLE_DEVICES), so a round of modes is compared on the same GPU
#   GPU      assignments that share a GPU run one after another in that order; different GPUs run at once
#   REPEATS  becomes --repeats for that shape (the total wanted; --resume skips done repeats)
#   MODES    comma-separated --modes, e.g. qwen2.5-0.5b:1:4:FULL,FULL_AND_PIECEWISE adds one paired round of
#            two modes without touching the others
#
# The chains start under setsid and outlive the device call. The script waits up to WAIT_S seconds, then
# copies each shape's dataset, a tarball of every log and the GPU list into $OUT. Calling it again with the
# same arguments while the chains run starts nothing new: it only waits and collects, so a lease is one
# start call followed by wait-and-collect calls. Datasets are resumable and seeded from
# models/profiles/h200-SHAPE.sqlite, so a new host continues where the last lease stopped. vLLM's compile
# caches (~270 MB) are too big to come back through $OUT, so every host compiles afresh (the first start on
# a host takes 150-200 s). GM_PIN=numa pins each chain to the CPUs local to its GPU.
# Runbook: docs/operations.md, "Air-gapped GPU-host runbook".
set -uo pipefail
wait_s="$1"; grid="$2"; shift 2
assign=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do assign+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
work=/tmp/gm; mkdir -p "$work"
# GM_SITE picks the release's site dir (/tmp/site: 0.24; /tmp/site-0.33); its .env, written by unpack.sh,
# adds the CUDA library setup the probe chose (LD_PRELOAD or LD_LIBRARY_PATH).
site="${GM_SITE:-/tmp/site}"
. bench/gpu/preflight.sh && gm_preflight "$site" python3 "$PWD/src" || exit 3
PYTHONPATH="$site"
if [ -f "$site.env" ]; then . "$site.env"; fi
export PYTHONPATH="$PYTHONPATH:$PWD/src" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
running() { [ -f "$work/$1.pid" ] && kill -0 "$(cat "$work/$1.pid")" 2>/dev/null; }

# Assignments that share a GPU run one after another in a single chain; chains on different GPUs run at once.
gpus=()
for a in "${assign[@]}"; do
  IFS=: read -r _ gpu _ <<< "$a"
  [[ " ${gpus[*]} " == *" $gpu "* ]] || gpus+=("$gpu")
done
for gpu in "${gpus[@]}"; do
  chain=()
  for a in "${assign[@]}"; do
    IFS=: read -r shape g reps modes <<< "$a"
    [ "$g" = "$gpu" ] && chain+=("$shape:${reps:-}:${modes:-}")
  done
  # GM_PIN=numa pins the chain (profiler, vLLM, load generator) to the CPUs local to its GPU; rows record
  # where the engine ran either way (engine_numa_nodes, gpu_numa_node), so a pinned and an unpinned lease
  # can be compared before pinning becomes the method.
  pin=()
  if [ "${GM_PIN:-}" = "numa" ]; then
    bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i "$gpu" 2>/dev/null | tr 'A-F' 'a-f')
    cpus=$(cat "/sys/bus/pci/devices/${bus:4}/local_cpulist" 2>/dev/null || true)
    [ -n "$cpus" ] && pin=(taskset -c "$cpus") && echo "GPU $gpu ($bus): pinned to CPUs $cpus"
  fi
  if ! running "gpu$gpu"; then
    setsid nohup "${pin[@]}" bash bench/gpu/profile_chain.sh "$grid" "$gpu" "${chain[@]}" -- "$@" \
      >>"$work/chain-gpu$gpu.out" 2>&1 < /dev/null &
    echo $! > "$work/gpu$gpu.pid"
    echo "started chain on GPU $gpu: ${chain[*]} (pid $!)"
  fi
done

any_running() { for g in "${gpus[@]}"; do running "gpu$g" && return 0; done; return 1; }
end=$((SECONDS + wait_s))
while any_running && [ $SECONDS -lt $end ]; do sleep 5; done
any_running && echo "profilers still running" || echo "profilers finished"

# At most 8 files come back from $OUT: one dataset per shape, one tarball of every log, the GPU list.
if [ -n "${OUT:-}" ]; then
  for a in "${assign[@]}"; do
    shape="${a%%:*}"
    [ -f "$work/$shape.sqlite" ] || continue
    python3 - "$work/$shape.sqlite" "$OUT/$shape.sqlite" <<'PY'
import sqlite3, sys
src = sqlite3.connect(sys.argv[1]); dst = sqlite3.connect(sys.argv[2]); src.backup(dst); dst.close()
PY
  done
  (cd "$work" && tar -czf "$OUT/logs.tgz" --exclude='model-*' --exclude='*.sqlite*' --exclude='*.pid' .) 2>/dev/null
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,uuid --format=csv > "$OUT/gpu.csv" 2>/dev/null
fi
for a in "${assign[@]}"; do echo "== ${a%%:*}"; tail -n 12 "$work/profile-${a%%:*}.out" 2>/dev/null; done
