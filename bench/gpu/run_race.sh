#!/usr/bin/env bash
# Race model shapes on the GPU host (graphmode profile --race), in the background, and collect what they wrote.
#
# usage (on the GPU host, from the repo root, after unpack.sh put vLLM in /tmp/site):
#   bench/gpu/run_race.sh WAIT_S SHAPE[:MODES[:KV_BYTES]] [SHAPE...] [-- race options...]
# e.g. bench/gpu/run_race.sh 540 qwen2.5-0.5b llama-3.2-1b:FULL,NONE:6G -- --budget-min 10 --control
#
# SHAPE is a file in models/shapes/ without .json (its config.json becomes a model dir; --load-format dummy).
# MODES (comma-separated) becomes --modes (default: all five; the default mode always races). KV_BYTES is each
# engine's --kv-cache-memory-bytes (default $GM_KV or 8G). Every shape races on the one GPU at the same time,
# each on its own ports (8200 + 20 per shape) and with its own dataset and logs under /tmp/gmr.
#
# Races run under setsid and outlive one device call: calling this again with the same arguments while they
# run only waits and collects. Datasets resume: a race continues from /tmp/gmr/race-h200-SHAPE.sqlite, or on a
# fresh host from models/profiles/race-h200-SHAPE.sqlite (commit the collected dataset under that name), and
# reuses every round already measured (same profile key and race settings).
#
# Memory: every engine holds its weights, its KV share and its graphs. Rough H200 sums for all five modes plus
# --control (6 engines) at 8G each: Qwen-0.5B ~60 GiB, Llama-1B ~70 GiB, Llama-8B ~160 GiB (does not fit: race
# it alone with 4G, or fewer modes). Shapes raced at once share the GPU's time too: their cells interleave, which
# adds noise to both (the pairing inside a round still cancels slow drift).
#
# Into $OUT (at most 8 files): race-h200-SHAPE.sqlite per shape (an SQLite backup, consistent while the race
# writes), logs.tgz (every vLLM log and race output), summary.txt (one line per shape).
set -uo pipefail
wait_s="$1"; shift
assign=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do assign+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
work="${GM_WORK:-/tmp/gmr}"; mkdir -p "$work"
py="${GM_PYTHON:-python3}"  # GM_PYTHON / GM_VLLM_CMD: a local smoke test against tests/support/fake_vllm.py
vllm_cmd="${GM_VLLM_CMD:-python3 -m vllm.entrypoints.openai.api_server}"
export PYTHONPATH="/tmp/site:$PWD/src" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
running() { [ -f "$work/$1.pid" ] && kill -0 "$(cat "$work/$1.pid")" 2>/dev/null; }

i=0
for a in "${assign[@]}"; do
  IFS=: read -r shape modes kv <<< "$a"
  kv="${kv:-${GM_KV:-8G}}"
  if ! running "$shape"; then
    mkdir -p "$work/model-$shape"
    cp "models/shapes/$shape.json" "$work/model-$shape/config.json"
    ds="$work/race-h200-$shape.sqlite"
    [ -f "$ds" ] || { [ -f "models/profiles/race-h200-$shape.sqlite" ] && cp "models/profiles/race-h200-$shape.sqlite" "$ds"; }
    per=(); [ -n "${modes:-}" ] && per=(--modes "$modes")
    echo "$(date -u +%FT%TZ) racing $shape ${per[*]} kv $kv $*" >>"$work/race-$shape.out"
    setsid nohup "$py" -m graphmode.profiling profile --race --dataset "$ds" --port $((8200 + 20 * i)) \
      --log-dir "$work/logs-$shape" --vllm-cmd "$vllm_cmd" \
      --kv-cache-memory-bytes "$kv" "${per[@]}" "$@" \
      -- --model "$work/model-$shape" --load-format dummy --skip-tokenizer-init --max-model-len 4096 \
      >>"$work/race-$shape.out" 2>&1 < /dev/null &
    echo $! > "$work/$shape.pid"
    echo "started race of $shape (pid $!, ports from $((8200 + 20 * i)), kv $kv)"
  fi
  i=$((i + 1))
done

any_running() { for a in "${assign[@]}"; do running "${a%%:*}" && return 0; done; return 1; }
end=$((SECONDS + wait_s))
while any_running && [ $SECONDS -lt $end ]; do sleep 5; done
any_running && echo "races still running" || echo "races finished"

summary() {
  for a in "${assign[@]}"; do
    shape="${a%%:*}"
    state=finished; running "$shape" && state=running
    last=$(grep -E '^(race race-|round [0-9]+ done)' "$work/race-$shape.out" 2>/dev/null | tail -n 1)
    echo "$shape [$state] ${last:-no round yet}"
  done
}
if [ -n "${OUT:-}" ]; then
  for a in "${assign[@]}"; do
    shape="${a%%:*}"
    [ -f "$work/race-h200-$shape.sqlite" ] || continue
    "$py" - "$work/race-h200-$shape.sqlite" "$OUT/race-h200-$shape.sqlite" <<'PY'
import sqlite3, sys
src = sqlite3.connect(sys.argv[1]); dst = sqlite3.connect(sys.argv[2]); src.backup(dst); dst.close()
PY
  done
  (cd "$work" && tar -czf "$OUT/logs.tgz" --exclude='model-*' --exclude='vllm-cache' --exclude='*.sqlite*' --exclude='*.pid' .) 2>/dev/null
  summary > "$OUT/summary.txt"
fi
summary
for a in "${assign[@]}"; do echo "== ${a%%:*}"; tail -n 14 "$work/race-${a%%:*}.out" 2>/dev/null; done
