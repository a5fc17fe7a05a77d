#!/usr/bin/env bash
# Run bench/gpu/start_effect.py (issue 17, step 1) on the GPU host in the background, and collect it.
#
# usage (GPU host, repo root, after unpack.sh put vLLM in /tmp/site):
#   bench/gpu/start_effect.sh WAIT_S [SHAPE [KV [ROUNDS]]]     (defaults: qwen2.5-0.5b 4G 8,6,6)
# The experiment starts once under setsid and outlives the device call (about 13 minutes on the Qwen shape:
# a cold overlapped start of six engines, two warm restart waves of three, 20 rounds of 12 cells); calling
# again only waits up to WAIT_S and collects. Into $OUT: cells.jsonl, starts.jsonl, out.txt, logs.tgz.
# GM_PYTHON / GM_VLLM_CMD: a local smoke test against tests/support/fake_vllm.py.
set -uo pipefail
wait_s="$1"; shape="${2:-qwen2.5-0.5b}"; kv="${3:-4G}"; rounds="${4:-8,6,6}"
work="${GM_WORK:-/tmp/gse}"; mkdir -p "$work"
py="${GM_PYTHON:-python3}"
if ! { [ -f "$work/pid" ] && kill -0 "$(cat "$work/pid")" 2>/dev/null; }; then
  if [ -f "$work/out.txt" ] && grep -q "experiment finished" "$work/out.txt"; then
    echo "already finished"
  else
    rm -rf "$work/src" && cp -r src "$work/src" && cp bench/gpu/start_effect.py "$work/"
    mkdir -p "$work/model" && cp "models/shapes/$shape.json" "$work/model/config.json"
    PYTHONPATH="/tmp/site:$work/src" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 \
      setsid nohup "$py" "$work/start_effect.py" --model "$work/model" --out "$work/data" --kv "$kv" \
      --rounds "$rounds" ${GM_VLLM_CMD:+--vllm-cmd "$GM_VLLM_CMD"} >>"$work/out.txt" 2>&1 < /dev/null &
    echo $! > "$work/pid"
    echo "started (pid $!): $shape kv $kv rounds $rounds"
  fi
fi
end=$((SECONDS + wait_s))
while kill -0 "$(cat "$work/pid")" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 5; done
kill -0 "$(cat "$work/pid")" 2>/dev/null && echo "experiment still running" || echo "experiment process ended"
if [ -n "${OUT:-}" ]; then
  cp "$work/data/cells.jsonl" "$work/data/starts.jsonl" "$work/out.txt" "$OUT/" 2>/dev/null
  (cd "$work/data" && tar -czf "$OUT/logs.tgz" logs) 2>/dev/null
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,uuid --format=csv > "$OUT/gpu.csv" 2>/dev/null
fi
tail -n 8 "$work/out.txt"
