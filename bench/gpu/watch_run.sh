#!/usr/bin/env bash
# `graphmode watch --listen` on a GPU host: a managed vLLM of the 1B under a TTFT objective, driven through
# watch's proxy by bench/watch_drive.py: phase A concurrency-1 short prompts (the verdicts favour FULL),
# phase B long prompts open-loop (FULL's win is gone). Records each decision with its numbers, each
# switch's blue/green overlap or downtime, requests sent/ok/lost and TTFT/ITL before and after.
#
# usage (on the GPU host, from the repo root, after unpack.sh put vLLM 0.33 in $GM_SITE):
#   bench/gpu/watch_run.sh WAIT_S [-- extra vLLM args]
# The run starts once under setsid and outlives the device call; calling again only waits (up to WAIT_S)
# and collects. WAIT_S 585 fits one 10-minute call: the driver ends everything by GM_WATCH_DEADLINE_S
# (560 s after it started, vLLM starts included: two ~80 s warm starts, or two ~240 s cold compiles, which
# leave phase B ~30 s) and writes its output. GM_WATCH_FRESH=1 starts a new run when the last one ended.
# On a host whose vLLM compile cache is cold, GM_WATCH_DEADLINE_S=1100 and two calls of WAIT_S 585 (the
# second only waits and collects) give each phase its full length.
# Blue/green on one GPU: both servers get --kv-cache-memory-bytes and --gpu-memory-utilization 0.05, as the
# race's resident engines do (vLLM's start-up check of free memory against the fraction counts the other
# server's memory, so the default 0.9 refuses the second server).
# Into $OUT (flat, 7 files): summary.json, decisions.jsonl, watch.log, requests.csv.gz, engines.tgz,
# state.json, drive.out.
# Knobs (environment): GM_SITE (/tmp/site-0.33), GM_PYTHON (python3), GM_VLLM_CMD (vLLM's api_server
# module; tests/support/fake_vllm.py for a dry run on a CPU), GM_WATCH_MODEL_DIR (a dir with the 1B's
# config.json, made from models/shapes/llama-3.2-1b.json), GM_WATCH_KV (8G), GM_WATCH_WORK (/tmp/gmw), and
# bench/watch_drive.py's GM_WATCH_* (STRATEGY blue-green, INITIAL: vLLM's default, OBJECTIVE ttft_p50,
# INTERVAL 1, EVALUATE_EVERY 3, CONFIRMATIONS 3, WINDOW_S 15, MIN_DWELL_S 20, COOLDOWN_S 30, A_MAX_S 180,
# A_AFTER_S 20, B_S 60, B_RATE 4, B_INPUT 2048, DEADLINE_S 560, MODEL_ID: the one watch picks, ...),
# GM_WATCH_CACHE_FROM (a race's per-arm compile caches of the 1B, e.g. /tmp/gmr/logs-llama-3.2-1b/vllm-cache).
set -uo pipefail
wait_s="${1:?usage: watch_run.sh WAIT_S [-- vLLM args]}"; shift
[ "${1:-}" = "--" ] && shift
site="${GM_SITE:-/tmp/site-0.33}"
py="${GM_PYTHON:-python3}"
work="${GM_WATCH_WORK:-/tmp/gmw}"
running() { [ -f "$work/drive.pid" ] && kill -0 "$(cat "$work/drive.pid")" 2>/dev/null; }

if ! running && { [ ! -f "$work/drive.pid" ] || [ "${GM_WATCH_FRESH:-0}" = 1 ]; }; then
  rm -rf "$work" && mkdir -p "$work"
  if [ ! -d /tmp/site-gm ] && ls .whl/*.whl >/dev/null 2>&1; then  # skops and its prettytable (as hw_change.sh)
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-gm .whl/*.whl
  fi
  pp="/tmp/site-gm:$site"
  . bench/gpu/preflight.sh && gm_preflight "$pp" "$py" src || exit 3
  # what watch and the driver import beyond the profiler: the model (skops), the proxy, the client
  if ! err=$(PYTHONPATH="$pp:src" "$py" -c 'import graphmode.control.controller, graphmode.selector.recommend, skops.io, uvicorn, aiohttp' 2>&1); then
    echo "preflight: watch does not import: $(printf '%s\n' "$err" | tail -n 1)" >&2; exit 3
  fi
  cp -r src "$work/src" && cp bench/watch_drive.py "$work/" && mkdir -p "$work/models"
  cp -r models/nvidia-* "$work/models/" 2>/dev/null
  model_dir="${GM_WATCH_MODEL_DIR:-$work/model-1b}"
  if [ -z "${GM_WATCH_MODEL_DIR:-}" ]; then mkdir -p "$model_dir" && cp models/shapes/llama-3.2-1b.json "$model_dir/config.json"; fi
  vcmd="${GM_VLLM_CMD:-$py -m vllm.entrypoints.openai.api_server}"
  args=(--load-format dummy --skip-tokenizer-init --max-model-len 4096 --kv-cache-memory-bytes "${GM_WATCH_KV:-8G}"
        --gpu-memory-utilization 0.05 "$@")
  # the site's .env (the CUDA library setup unpack.sh chose) sets PYTHONPATH too: source it first
  if [ -f "$site.env" ]; then . "$site.env"; fi  # the CUDA library setup unpack.sh chose
  export PYTHONPATH="$pp:$work/src" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
  if [ -n "${GM_WATCH_CACHE_FROM:-}" ]; then
    # a race of the same shape left one compile cache per arm: merged, watch's starts skip the cold compile
    mkdir -p "$work/vllm-cache"
    for d in "$GM_WATCH_CACHE_FROM"/*/; do [ -d "$d" ] && cp -rn "$d". "$work/vllm-cache/" 2>/dev/null; done
    export VLLM_CACHE_ROOT="$work/vllm-cache"
  fi
  echo "$(date -u +%FT%TZ) host: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)" \
    > "$work/drive.out"
  setsid nohup "$py" "$work/watch_drive.py" --work "$work" --python "$py" --vllm-cmd "$vcmd" \
    --model-dir "$model_dir" --models-dir "$work/models" -- "${args[@]}" >>"$work/drive.out" 2>&1 < /dev/null &
  echo $! > "$work/drive.pid"
  echo "started the watch run (pid $!), output in $work/out"
fi

end=$((SECONDS + wait_s))
while running && [ $SECONDS -lt $end ]; do sleep 2; done
if running; then
  echo "watch run still running ($(grep -c ' graphmode.watch ' "$work/watch.log" 2>/dev/null) watch log lines so far)"
  grep -E 'STAY|HOLD|SWITCH|switch|starting' "$work/watch.log" 2>/dev/null | tail -n 5 | cut -c1-300
else
  echo "watch run finished"
  if [ -n "${OUT:-}" ]; then
    cp "$work"/out/* "$OUT/" 2>/dev/null
    cp "$work/drive.out" "$OUT/drive.out"
  fi
  cat "$work/drive.out"
fi
