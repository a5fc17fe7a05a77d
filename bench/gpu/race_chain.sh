#!/usr/bin/env bash
# Race several model shapes ONE AFTER ANOTHER on one GPU host (each shape's engines have the GPU and the
# host's CPUs to themselves), in the background, and collect what they wrote.
#
# usage (on the GPU host, from the repo root, after unpack.sh put vLLM in /tmp/site):
#   [RACE_TAG=NAME] bench/gpu/race_chain.sh WAIT_S SHAPE[:KV_BYTES[:control[:BUDGET_MIN[:MODES]]]] [SHAPE...] \
#       [-- race options...]
# (KV_BYTES: each engine --kv-cache-memory-bytes, default 8G; BUDGET_MIN: that shape --budget-min; MODES: that
# race's --modes, comma-separated (vLLM's default always races), so that one shape can race in groups that fit
# the GPU one after another, e.g. llama-3.1-8b:4G::10:FULL,FULL_DECODE_ONLY llama-3.1-8b:4G::6:PIECEWISE,NONE
# on 80 GB (each group its own race in the same dataset); datasets
# are $RACE_TAG-SHAPE.sqlite, default race-h200-SHAPE.sqlite, resumed from models/profiles/ when there)
#
# Next lease (two starts per arm, docs/method-racing.md; about 9.5 + 9 GPU-minutes, so two shapes per
# 30-minute lease; call it again with the same arguments every <= 10 minutes until "chain finished"):
#   RACE_TAG=race-h200-s2 bench/gpu/race_chain.sh 560 qwen2.5-0.5b:8G:control:10 llama-3.2-1b:8G:control:9 \
#       -- --starts 2
#   later lease: RACE_TAG=race-h200-s2 bench/gpu/race_chain.sh 560 llama-3.1-8b:4G::9 -- --starts 2
# The first races (one start per arm, 2026-12-01) were:
#   bench/gpu/race_chain.sh 560 qwen2.5-0.5b:8G:control:8 llama-3.2-1b:8G::7 llama-3.1-8b:4G::5.5
#
# run_race.sh races its shapes at the same time; this chain is for a single-GPU lease where shapes must not
# disturb each other. The chain starts once under setsid and outlives the device call; calling again with
# the same arguments only waits (up to WAIT_S) and collects. The source tree is copied to $work/src when
# the chain starts, so later device calls (which lay the working tree anew) cannot change code mid-race.
# Into $OUT: $RACE_TAG-SHAPE.sqlite per shape started so far (SQLite backups), logs.tgz, summary.txt.
# GM_CHAIN_END_S (seconds from the chain's start, e.g. the lease's device time left minus the collection
# margin): a race that would start with less than GM_CHAIN_MIN_RACE_S (default 420) of that left is skipped
# and the chain goes on to the next, since a race started late spends what is left on its compile and engine
# starts and measures nothing (an 8B group given 5 minutes on a fresh H100 host, 2026-12-06). Kernel caches:
# bench/gpu/kcache.sh (restored before the first race, sent back as kcache.tgz while $OUT has room).
# GM_SITE picks the release's site dir (/tmp/site: vLLM 0.24; /tmp/site-0.33); its .env, written by
# unpack.sh, adds the CUDA library setup the probe chose (LD_PRELOAD or LD_LIBRARY_PATH).
set -uo pipefail
wait_s="$1"; shift
assign=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do assign+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
# GM_CHAIN_WORK, GM_PYTHON, GM_VLLM_CMD, GM_CHAIN_PORT: the work dir, graphmode's and vLLM's commands and the first
# port (a CPU run against tests/support/fake_vllm.py: tests/unit/test_race_chain.py)
work="${GM_CHAIN_WORK:-/tmp/gmr}"; mkdir -p "$work"
py="${GM_PYTHON:-python3}"
tag="${RACE_TAG:-race-h200}"
case "$tag" in *[!A-Za-z0-9._-]*|"") echo "RACE_TAG: letters, digits, . _ - only" >&2; exit 2;; esac

. bench/gpu/kcache.sh
if ! { [ -f "$work/chain.pid" ] && kill -0 "$(cat "$work/chain.pid")" 2>/dev/null; }; then
  . bench/gpu/preflight.sh && gm_preflight "${GM_SITE:-/tmp/site}" "$py" src || exit 3
  gm_kcache_restore "$work"
  case "${GM_CHAIN_END_S:-}${GM_CHAIN_MIN_RACE_S:-}" in *[!0-9]*) echo "GM_CHAIN_END_S, GM_CHAIN_MIN_RACE_S: seconds" >&2; exit 2;; esac
  if [ -n "${GM_CHAIN_END_S:-}" ]; then echo $(( $(date +%s) + GM_CHAIN_END_S )) > "$work/chain-end"; else rm -f "$work/chain-end"; fi
  echo "${GM_CHAIN_MIN_RACE_S:-420}" > "$work/chain-min-race"
  rm -rf "$work/src" "$work/shapes" && cp -r src "$work/src" && cp -r models/shapes "$work/shapes" && cp bench/race_windows.py "$work/"
  for a in "${assign[@]}"; do
    shape="${a%%:*}"
    ds="$work/$tag-$shape.sqlite"
    [ -f "$ds" ] || { [ -f "models/profiles/$tag-$shape.sqlite" ] && cp "models/profiles/$tag-$shape.sqlite" "$ds"; }
  done
  # printf %q of no arguments writes '' (an empty argument after eval): vllm serve then fails on it (exit 2)
  if [ $# -gt 0 ]; then printf '%q ' "$@"; fi > "$work/race-options"
  echo "$tag" > "$work/race-tag"
  echo "${GM_SITE:-/tmp/site}" > "$work/race-site"
  echo "$py" > "$work/python"
  echo "${GM_VLLM_CMD:-python3 -m vllm.entrypoints.openai.api_server}" > "$work/vllm-cmd"
  echo "${GM_CHAIN_PORT:-8200}" > "$work/port"
  # shellcheck disable=SC2016
  setsid nohup bash -c '
    work="$1"; shift
    opts=$(cat "$work/race-options"); tag=$(cat "$work/race-tag"); site=$(cat "$work/race-site")
    py=$(cat "$work/python"); vcmd=$(cat "$work/vllm-cmd"); port=$(cat "$work/port")
    PYTHONPATH="$site"
    if [ -f "$site.env" ]; then . "$site.env"; fi
    export PYTHONPATH="$PYTHONPATH:$work/src" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
    for a in "$@"; do
      IFS=: read -r shape kv flag budget modes <<< "$a"
      if [ -f "$work/chain-end" ]; then
        left=$(( $(cat "$work/chain-end") - $(date +%s) )); need=$(cat "$work/chain-min-race")
        if [ "$left" -lt "$need" ]; then
          echo "$(date -u +%FT%TZ) chain: $a skipped: ${left} s left before GM_CHAIN_END_S, a race needs ${need}" >>"$work/chain.out"
          continue
        fi
      fi
      mkdir -p "$work/model-$shape"; cp "$work/shapes/$shape.json" "$work/model-$shape/config.json"
      extra=(); [ "${flag:-}" = control ] && extra=(--control)
      [ -n "${budget:-}" ] && extra+=(--budget-min "$budget")
      [ -n "${modes:-}" ] && extra+=(--modes "$modes")  # after the chain-wide options: this one wins
      echo "$(date -u +%FT%TZ) racing $shape kv ${kv:-8G} $opts ${extra[*]}" >>"$work/race-$shape.out"
      eval "\"\$py\" -m graphmode.profiling profile --race --dataset $work/$tag-$shape.sqlite --port $port \
        --log-dir $work/logs-$shape --vllm-cmd \"\$vcmd\" \
        --kv-cache-memory-bytes ${kv:-8G} $opts ${extra[*]} \
        -- --model $work/model-$shape --load-format dummy --skip-tokenizer-init --max-model-len 4096" \
        >>"$work/race-$shape.out" 2>&1 < /dev/null
      echo "$(date -u +%FT%TZ) chain: $shape exited $?" >>"$work/chain.out"
    done' chain "$work" "${assign[@]}" >>"$work/chain.out" 2>&1 < /dev/null &
  echo $! > "$work/chain.pid"
  echo "started the chain (pid $!): ${assign[*]}"
fi

end=$((SECONDS + wait_s))
while kill -0 "$(cat "$work/chain.pid")" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 5; done
kill -0 "$(cat "$work/chain.pid")" 2>/dev/null && echo "chain still running" || echo "chain finished"

summary() {
  for a in "${assign[@]}"; do
    shape="${a%%:*}"
    last=$(grep -E '^(race race-|round [0-9]+ done|stopped|verdict)' "$work/race-$shape.out" 2>/dev/null | tail -n 2 | tr '\n' ' ')
    echo "$shape: ${last:-not started}"
  done
  cat "$work/chain.out" 2>/dev/null
  # how big the compile caches are: whether a later lease could carry them in and skip the compile start
  du -sh "$work"/logs-*/vllm-cache/* 2>/dev/null | sed 's/^/compile cache: /'
  # the windows each arm measured against the default's (the host python has no pydantic: the bundle's site)
  local ds=(); for a in "${assign[@]}"; do [ -f "$work/$tag-${a%%:*}.sqlite" ] && ds+=("$work/$tag-${a%%:*}.sqlite"); done
  [ ${#ds[@]} -gt 0 ] && PYTHONPATH="$(cat "$work/race-site" 2>/dev/null):$work/src" "$py" "$work/race_windows.py" \
    "${ds[@]}" --race latest 2>&1
}
if [ -n "${OUT:-}" ]; then
  for a in "${assign[@]}"; do
    shape="${a%%:*}"
    [ -f "$work/$tag-$shape.sqlite" ] || continue
    "$py" - "$work/$tag-$shape.sqlite" "$OUT/$tag-$shape.sqlite" <<'PY'
import sqlite3, sys
src = sqlite3.connect(sys.argv[1]); dst = sqlite3.connect(sys.argv[2]); src.backup(dst); dst.close()
PY
  done
  (cd "$work" && tar -czf "$OUT/logs.tgz" --exclude='model-*' --exclude='shapes' --exclude='src' --exclude='vllm-cache' \
    --exclude='*.sqlite*' --exclude='*.pid' .) 2>/dev/null
  summary > "$OUT/summary.txt"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,uuid --format=csv > "$OUT/gpu.csv" 2>/dev/null
  gm_kcache_pack "$OUT" "$OUT/summary.txt"
fi
summary
for a in "${assign[@]}"; do echo "== ${a%%:*}"; tail -n 12 "$work/race-${a%%:*}.out" 2>/dev/null; done
