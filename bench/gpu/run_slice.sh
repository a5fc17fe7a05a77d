#!/usr/bin/env bash
# Run (or continue) a profiling slice on the GPU host, in the background, and collect what it wrote.
#
# usage (on the GPU host, from the repo root, after unpack.sh put vLLM in /tmp/site):
#   bench/gpu/run_slice.sh SHAPE GRID WAIT_S [profile options...]
# SHAPE is a file in models/shapes/ without .json. The profiler runs under setsid, so it outlives one
# device call; calling this again with the same arguments while it runs only waits and collects. The
# dataset is resumable (--resume), so a new host picks up where the last slice stopped.
set -uo pipefail
shape="$1"; grid="$2"; wait_s="$3"; shift 3
work=/tmp/gm; mkdir -p "$work/model-$shape"
cp "models/shapes/$shape.json" "$work/model-$shape/config.json"
export PYTHONPATH="/tmp/site:$PWD/src" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
ds="$work/$shape.sqlite"
# Seed from the committed rows so --resume skips what earlier sessions measured.
[ -f "$ds" ] || { [ -f "models/profiles/h200-$shape.sqlite" ] && cp "models/profiles/h200-$shape.sqlite" "$ds"; }
if ! pgrep -f "graphmode.profiling profile" >/dev/null; then
  setsid nohup python3 -m graphmode.profiling profile --grid "$grid" --dataset "$ds" --resume \
    --log-dir "$work/logs" --vllm-cmd "python3 -m vllm.entrypoints.openai.api_server" "$@" \
    -- --model "$work/model-$shape" --load-format dummy --skip-tokenizer-init --max-model-len 4096 \
    --gpu-memory-utilization 0.5 >>"$work/profile-$shape.out" 2>&1 < /dev/null &
  echo "started profiler pid $!"
fi
end=$((SECONDS + wait_s))
while pgrep -f "graphmode.profiling profile" >/dev/null && [ $SECONDS -lt $end ]; do sleep 5; done
pgrep -f "graphmode.profiling profile" >/dev/null && echo "profiler still running" || echo "profiler finished"
if [ -n "${OUT:-}" ]; then
  python3 - "$ds" "$OUT/$shape.sqlite" <<'PY'
import sqlite3, sys
src = sqlite3.connect(sys.argv[1]); dst = sqlite3.connect(sys.argv[2]); src.backup(dst); dst.close()
PY
  cp "$work/profile-$shape.out" "$OUT/" 2>/dev/null
  tar -C "$work" -czf "$OUT/logs-$shape.tgz" logs 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv" 2>/dev/null
fi
tail -n 40 "$work/profile-$shape.out"
