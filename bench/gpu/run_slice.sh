#!/usr/bin/env bash
# Run (or continue) profiling slices on the GPU host, one profiler per GPU, in the background, and
# collect what they wrote.
#
# usage (on the GPU host, from the repo root, after unpack.sh put vLLM in /tmp/site):
#   bench/gpu/run_slice.sh WAIT_S GRID SHAPE:GPU[:REPEATS] [SHAPE:GPU[:REPEATS] ...] [-- profile options...]
# e.g. bench/gpu/run_slice.sh 540 src/graphmode/data/default_grid.yaml llama-3.1-8b:0:1 llama-3.2-1b:1:2
# (8B repeat 0 on GPU 0 while GPU 1 adds repeat 1 of the 1B shape; REPEATS becomes --repeats for that shape)
#
# SHAPE is a file in models/shapes/ without .json; each shape gets its own GPU (CUDA_VISIBLE_DEVICES),
# port, dataset and logs, so every mode of a shape is compared on the same GPU. Profilers run under
# setsid and outlive one device call; calling this again with the same arguments while they run only
# waits and collects. Datasets are resumable (--resume) and seeded from models/profiles/h200-SHAPE.sqlite,
# so a new host picks up where the last slice stopped. (vLLM's compile caches, 269 MB after two shapes,
# are too big to come back through $OUT, so every host compiles afresh: NOTES.md.)
set -uo pipefail
wait_s="$1"; grid="$2"; shift 2
assign=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do assign+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
work=/tmp/gm; mkdir -p "$work"
export PYTHONPATH="/tmp/site:$PWD/src" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
running() { [ -f "$work/$1.pid" ] && kill -0 "$(cat "$work/$1.pid")" 2>/dev/null; }

for a in "${assign[@]}"; do
  IFS=: read -r shape gpu reps <<< "$a"
  per=(); [ -n "${reps:-}" ] && per=(--repeats "$reps")
  mkdir -p "$work/model-$shape"
  cp "models/shapes/$shape.json" "$work/model-$shape/config.json"
  ds="$work/$shape.sqlite"
  [ -f "$ds" ] || { [ -f "models/profiles/h200-$shape.sqlite" ] && cp "models/profiles/h200-$shape.sqlite" "$ds"; }
  if ! running "$shape"; then
    CUDA_VISIBLE_DEVICES="$gpu" setsid nohup python3 -m graphmode.profiling profile --grid "$grid" \
      --dataset "$ds" --resume --port $((8100 + gpu)) --log-dir "$work/logs-$shape" \
      --vllm-cmd "python3 -m vllm.entrypoints.openai.api_server" "${per[@]}" "$@" \
      -- --model "$work/model-$shape" --load-format dummy --skip-tokenizer-init --max-model-len 4096 \
      --gpu-memory-utilization 0.5 >>"$work/profile-$shape.out" 2>&1 < /dev/null &
    echo $! > "$work/$shape.pid"
    echo "started profiler for $shape on GPU $gpu ${per[*]} (pid $!)"
  fi
done

any_running() { for a in "${assign[@]}"; do running "${a%%:*}" && return 0; done; return 1; }
end=$((SECONDS + wait_s))
while any_running && [ $SECONDS -lt $end ]; do sleep 5; done
any_running && echo "profilers still running" || echo "profilers finished"

if [ -n "${OUT:-}" ]; then
  for a in "${assign[@]}"; do
    shape="${a%%:*}"
    python3 - "$work/$shape.sqlite" "$OUT/$shape.sqlite" <<'PY'
import sqlite3, sys
src = sqlite3.connect(sys.argv[1]); dst = sqlite3.connect(sys.argv[2]); src.backup(dst); dst.close()
PY
    cp "$work/profile-$shape.out" "$OUT/" 2>/dev/null
    tar -C "$work" -czf "$OUT/logs-$shape.tgz" "logs-$shape" 2>/dev/null
  done
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,uuid --format=csv > "$OUT/gpu.csv" 2>/dev/null
fi
for a in "${assign[@]}"; do echo "== ${a%%:*}"; tail -n 15 "$work/profile-${a%%:*}.out"; done
