#!/usr/bin/env bash
# Race the deployment configurations of a campaign file ONE AFTER ANOTHER on one GPU host, in the
# background, and collect what they wrote (race_chain.sh does the same for bare shapes).
#
# usage (on the GPU host, from the repo root, after unpack.sh put vLLM in $GM_SITE):
#   [RACE_TAG=NAME] [GM_SITE=/tmp/site-0.33] bench/gpu/config_chain.sh WAIT_S CAMPAIGN.yaml ITEM [ITEM...]
# ITEM: a configuration name, or @N for lease N of the campaign's plan (at most 5 configurations a call,
# so that $OUT gets <= 8 files). Datasets are $RACE_TAG-CONFIG.sqlite (default tag cfg-h200), resumed from
# models/profiles/ when there. Call again with the same arguments every <= 10 minutes until "chain
# finished"; a configuration with a status line (done or failed) is not raced again, an interrupted one
# resumes its race (the budget counts earlier sessions).
#
# Lease plan of bench/gpu/configs/h200-0.33.yaml (`python bench/campaign.py plan FILE`;
# 25 usable GPU-min per 30-minute lease after the 0.33 bundle transfer):
#   lease 1 (~25 GPU-min): 1b-triton 8b-triton 1b-flashinfer
#   lease 2 (~25 GPU-min): 8b-fp8 olmoe-1b-7b 8b-flashinfer
#   lease 3 (~21.5 GPU-min): 1b-ngram3 1b-ngram5 (1b-ngram5 topped up to 12 GPU-min on 2026-12-03)
#   lease 4 (~17 GPU-min): 8b-ngram3 8b-ngram5
#   lease 5 (~18 GPU-min): 1b-long-prompt 1b-high-concurrency
#   lease 6 (~25 GPU-min): moe30b-full moe30b-piecewise 8b-eagle
#   lease 7 (~9 GPU-min): 1b-mid-prompt (1-4K-token prompts, between the 1B's two pools; added 2026-12-03)
# (as run: 8b-ngram3 went with lease 3; a top-up re-packs the plan after it, so name configurations
# rather than @N once a campaign is under way)
# Lease N, last bundle call (docs/configs-campaign.md has the whole sequence):
#   GM_SITE=/tmp/site-0.33 RACE_TAG=cfg-h200-vllm0.33 bash bench/gpu/config_chain.sh 480 \
#       bench/gpu/configs/h200-0.33.yaml @N
#
# A configuration vLLM refuses (a flag, a FlashInfer JIT, OOM) gets a status line with vLLM's root cause
# from the log ("CONFIG: FAILED (every engine failed): ValueError: ..."), and the chain goes on.
# The source tree, shapes, grids and the campaign file are copied to $work when the chain starts, so later
# device calls (which lay the working tree anew) cannot change them mid-race.
# Into $OUT: $RACE_TAG-CONFIG.sqlite per configuration started (SQLite backups), logs.tgz, summary.txt,
# gpu.csv. Test hooks (tests/unit/test_config_chain.py): GM_CHAIN_WORK (default /tmp/gmc), GM_PYTHON
# (python3), GM_VLLM_CMD (vLLM's OpenAI server), GM_CHAIN_PORT (8200).
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: config_chain.sh WAIT_S CAMPAIGN.yaml CONFIG|@LEASE [...]" >&2; exit 2; }
wait_s="$1"; file="$2"; shift 2
work="${GM_CHAIN_WORK:-/tmp/gmc}"; mkdir -p "$work"
py="${GM_PYTHON:-python3}"
site="${GM_SITE:-/tmp/site}"
tag="${RACE_TAG:-cfg-h200}"
case "$tag" in *[!A-Za-z0-9._-]*|"") echo "RACE_TAG: letters, digits, . _ - only" >&2; exit 2;; esac

. bench/gpu/preflight.sh && gm_preflight "$site" "$py" "$PWD/src" || exit 3
names=$(PYTHONPATH="$site:$PWD/src" "$py" bench/campaign.py names "$file" "$@") || exit 2
read -r -a cfgs <<< "$names"
[ "${#cfgs[@]}" -le 5 ] || { echo "${#cfgs[@]} configurations: at most 5 a call (<= 8 files into \$OUT)" >&2; exit 2; }

if ! { [ -f "$work/chain.pid" ] && kill -0 "$(cat "$work/chain.pid")" 2>/dev/null; }; then
  rm -rf "$work/src" "$work/root" && cp -r src "$work/src" && cp bench/race_windows.py bench/campaign.py "$work/"
  mkdir -p "$work/root/models" "$work/root/bench" && cp -r models/shapes "$work/root/models/" \
    && cp -r bench/grids "$work/root/bench/" && cp "$file" "$work/root/campaign.yaml" || exit 2
  for c in "${cfgs[@]}"; do
    ds="$work/$tag-$c.sqlite"
    [ -f "$ds" ] || { [ -f "models/profiles/$tag-$c.sqlite" ] && cp "models/profiles/$tag-$c.sqlite" "$ds"; }
  done
  printf '%s\n' "$tag" "$site" "$py" "${GM_VLLM_CMD:-python3 -m vllm.entrypoints.openai.api_server}" \
    "${GM_CHAIN_PORT:-8200}" > "$work/chain-options"
  # shellcheck disable=SC2016
  setsid nohup bash -c '
    work="$1"; shift
    { read -r tag; read -r site; read -r py; read -r vllm; read -r port; } < "$work/chain-options"
    PYTHONPATH="$site"
    if [ -f "$site.env" ]; then . "$site.env"; fi
    export PYTHONPATH="$PYTHONPATH:$work/src" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
    echo "$(date -u +%FT%TZ) chain: $*"
    "$py" "$work/campaign.py" run "$work/root/campaign.yaml" --root "$work/root" --work "$work" \
      --tag "$tag" --port "$port" --vllm-cmd "$vllm" --python "$py" "$@" < /dev/null
    echo "$(date -u +%FT%TZ) chain: exited $?"' chain "$work" "${cfgs[@]}" >>"$work/chain.out" 2>&1 < /dev/null &
  echo $! > "$work/chain.pid"
  echo "${cfgs[*]}" > "$work/chain-names"
  echo "started the chain (pid $!): ${cfgs[*]}"
elif [ "$(cat "$work/chain-names" 2>/dev/null)" != "${cfgs[*]}" ]; then
  echo "a chain of other configurations is running: $(cat "$work/chain-names" 2>/dev/null); waiting for it" >&2
fi

end=$((SECONDS + wait_s))
while kill -0 "$(cat "$work/chain.pid")" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 2; done
kill -0 "$(cat "$work/chain.pid")" 2>/dev/null && echo "chain still running" || echo "chain finished"

summary() {
  for c in "${cfgs[@]}"; do
    if [ -f "$work/status-$c.txt" ]; then cat "$work/status-$c.txt"; continue; fi
    last=$(grep -E '^(race race-|round [0-9]+ done|stopped|verdict)' "$work/race-$c.out" 2>/dev/null | tail -n 2 | tr '\n' ' ')
    if [ -f "$work/race-$c.out" ]; then echo "$c: running: ${last:-starting}"; else echo "$c: not started"; fi
  done
  cat "$work/chain.out" 2>/dev/null
  # the windows each arm measured against the default's (sd Δwarm-up ≈ 0: race cells have a fixed warm-up)
  local ds=(); for c in "${cfgs[@]}"; do [ -f "$work/$tag-$c.sqlite" ] && ds+=("$work/$tag-$c.sqlite"); done
  [ ${#ds[@]} -gt 0 ] && PYTHONPATH="$site:$work/src" "$py" "$work/race_windows.py" "${ds[@]}" --race latest 2>&1
}
if [ -n "${OUT:-}" ]; then
  for c in "${cfgs[@]}"; do
    [ -f "$work/$tag-$c.sqlite" ] || continue
    "$py" - "$work/$tag-$c.sqlite" "$OUT/$tag-$c.sqlite" <<'PY'
import sqlite3, sys
src = sqlite3.connect(sys.argv[1]); dst = sqlite3.connect(sys.argv[2]); src.backup(dst); dst.close()
PY
  done
  (cd "$work" && tar -czf "$OUT/logs.tgz" --exclude='model-*' --exclude='./src' --exclude='./root' \
    --exclude='vllm-cache' --exclude='*.sqlite*' --exclude='*.pid' .) 2>/dev/null
  summary > "$OUT/summary.txt"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,uuid --format=csv > "$OUT/gpu.csv" 2>/dev/null
fi
summary
for c in "${cfgs[@]}"; do echo "== $c"; tail -n 12 "$work/race-$c.out" 2>/dev/null; done
