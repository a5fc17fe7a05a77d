#!/usr/bin/env bash
# Issue 14 on one GPU: vLLM's default capture sizes against the recommended ones, case after case, in the
# background; collects what it wrote. docs/capture-sizes.md has the table this feeds (bench/capture_table.py).
#
# usage (on the GPU host, from the repo root, after unpack.sh put vLLM in $GM_SITE):
#   [CAP_TAG=NAME] bench/gpu/capture_chain.sh WAIT_S CASE [CASE...] [-- race options...]
#   CASE = SHAPE[:KIND[:RACE_BUDGET_MIN]]   SHAPE: models/shapes/SHAPE.json (dummy weights)
#     KIND loads (default): vLLM's default --max-num-seqs; workloads cap-low-r2 and cap-high-r32
#     KIND long: --max-num-seqs 1024 (default list still stops at 512); workload cap-long-c768 (768 running)
#     KIND long-decode: as long (same dataset, profile and list), but the race holds 768 requests in steady
#       decode (cap-long-d768s: all sent at once, 384 output tokens, none ends inside a cell), so every step is 768
#       tokens: graphed in the list, eager above the default list's 512. Lease 11's mixed race (cap-long-c768,
#       48-token outputs) had each 5-s cell catch a different part of a wave of 768 prefills and finishes: batch
#       511-727 per cell, sd of the paired ln ITL 0.19 a round (docs/capture-sizes.md, "Lease 11")
#     KIND fixed: as loads (same dataset, profile and lists), but the race runs the lists at a fixed number in
#       flight, cap-low-c1 and cap-high-c48: open-loop cells let a slower engine hold a larger batch
#       (docs/capture-sizes.md, "Lease 8")
#     KIND low: as loads, but only the low load and its list (cap-low-r2, one challenger arm): the ±3%
#       equivalence target at low load, where the 8B's paired rounds scatter least (sd of ln ITL ratio 0.016)
#     RACE_BUDGET_MIN: the race's --budget-min (default 7; 13 for KIND fixed, whose 8B race took 12.3 for two
#       starts a side),
#       its total over every call and lease: to give a race that spent it one more restart wave, call again with
#       a larger one (lease 10: :7 spent, then :12 ran 5.2 GPU-min more and settled both arms)
#   CAP_VLLM_ARGS="..." (environment): more vLLM args for every engine of every case, e.g. "--stream-interval 16"
#     (SSE chunks every 16 steps: less API server work at > 512 streams), or "--api-server-count 4"
#     with GM_VLLM_CMD="python3 -m vllm.entrypoints.cli.main serve" (only `serve` starts several API servers), to
#     see whether the long case is bound by vLLM's one frontend process. They change the profile key: give such a
#     chain its own CAP_TAG (its own datasets).
#   CAP_KV=BYTES (environment): the race's KV cache per engine (default 8G, long 12G); with replicas, 3 arms x R
#     engines must fit the GPU (the race checks before it starts any): CAP_REPLICAS=4 CAP_KV=4G
#   CAP_REPLICAS=R (environment): race R resident engines per arm (--replicas R) instead of --starts 2; at a
#     start offset the size of δ this is what can settle a small difference (docs/method-racing.md)
#
# Per case (dataset $CAP_TAG-SHAPE[-long].sqlite, logs under /tmp/gmcap/logs-CASE), each step skipped when done;
# a dataset committed under $CAP_SEED (default models/profiles) seeds the case, so a later lease skips a-c:
#   a. profile the default mode alone on the GPU (--gpu-memory-utilization 0.5), each workload once (15 s):
#      the step sizes per workload, and the default list's lone start (start-up s, capture s, graph GiB, KV
#      tokens); its compile cache is the race's default arm's (vllm-cache/FULL_AND_PIECEWISE).
#   b. bench/capture_sizes.py per workload -> rec-CASE-WORKLOAD.json (frozen once written: the race key holds it).
#   c. a lone start of each recommended list (cap-probe, 4 s), into that arm's compile cache.
#   d. race default vs one sizes arm per workload (low=..., high=...; one arm when the lists agree), over
#      the case's workloads, --kv-cache-memory-bytes per engine (8G; 12G for long), --starts 2; long races
#      tpot_p50,itl_p50 with 5 s cells after 8 s of warm-up (> 512 streams coalesce SSE chunks: TPOT holds).
# GPU time, H200, vLLM 0.33 (measured 2026-12-02, 8B loads case with :6): a 3.2 min (cold start, two cells),
# c 2.5 + 2.7 min (each list compiles cold), d 6.1 min = 14.6 min; the long case's a alone took 5 min (238-s
# cold start); the 8B long case (2026-12-03): a 4.9 min (227-s cold start), c 1.75 min (seeded cache: 92-s start).
# Seeded cases run only d, whose budget counts its compile starts: 8B long :7 took 7.9 min in the call (206 s
# compiling), the 1B with CAP_REPLICAS=4 :7 7.7 min (12 engines, 106 s compiling after the 8B had warmed the
# host's kernel caches); on a fresh host the 1B's first wave took 233 s (lease 8, docs/capture-sizes.md).
# Two cases per lease with race budgets of 5-6 (a lease has ~26 min after the bundle calls):
#   GM_SITE=/tmp/site-0.33 CAP_TAG=cap-h200 bench/gpu/capture_chain.sh 540 qwen2.5-0.5b:long:6 llama-3.2-1b:loads:5
# then call it again with the same arguments every <= 10 minutes until "chain finished".
#
# The chain starts once under setsid and outlives the device call; calling again with the same arguments only
# waits (up to WAIT_S) and collects. src, the grid and the shapes are copied when it starts (later device calls
# lay the tree anew). Into $OUT (<= 8 files): one dataset per case (SQLite backup), recs.tgz (the chooser's
# answers), logs.tgz, summary.txt, table.md (bench/capture_table.py --markdown over the datasets), gpu.csv,
# and while there is room kcache.tgz (the host's kernel caches; carried back as .gpu/kcache.tgz, restored first).
# Local smoke test against tests/support/fake_vllm.py: GM_WORK=DIR GM_PYTHON=.venv/bin/python
#   GM_VLLM_CMD="python3 tests/support/fake_vllm.py" GM_SITE=/nonexistent bench/gpu/capture_chain.sh 300 qwen2.5-0.5b
set -uo pipefail
wait_s="$1"; shift
cases=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do cases+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
# not config_chain.sh's /tmp/gmc: both chains may run in one lease
work="${GM_WORK:-/tmp/gmcap}"; mkdir -p "$work"
tag="${CAP_TAG:-cap-h200}"
case "$tag" in *[!A-Za-z0-9._-]*|"") echo "CAP_TAG: letters, digits, . _ - only" >&2; exit 2;; esac
py="${GM_PYTHON:-python3}"
# $OUT takes at most 8 files: a dataset per case plus five others
[ ${#cases[@]} -ge 1 ] && [ ${#cases[@]} -le 3 ] || { echo "give 1 to 3 cases per chain" >&2; exit 2; }
for c in "${cases[@]}"; do
  IFS=: read -r shape kind budget <<< "$c"
  case "${kind:-loads}" in loads|long|long-decode|fixed|low) ;;
    *) echo "case $c: KIND is loads, long, long-decode, fixed or low" >&2; exit 2;; esac
  [ -f "models/shapes/$shape.json" ] || { echo "case $c: no models/shapes/$shape.json" >&2; exit 2; }
done
case_name() { IFS=: read -r s k _ <<< "$1"; case "${k:-loads}" in long|long-decode) echo "$s-long";; *) echo "$s";; esac; }

. bench/gpu/kcache.sh
if ! { [ -f "$work/chain.pid" ] && kill -0 "$(cat "$work/chain.pid")" 2>/dev/null; }; then
  . bench/gpu/preflight.sh && gm_preflight "${GM_SITE:-/tmp/site}" "$py" src || exit 3
  rm -rf "$work/src" && cp -r src "$work/src" && cp -r models/shapes "$work/shapes" 2>/dev/null
  # kernel caches an earlier lease sent back (kcache.tgz, below; bench/gpu/kcache.sh says why)
  gm_kcache_restore "$work"
  # a case measured on an earlier lease goes on from its committed dataset: its profile and lone starts are
  # done (--resume skips them, ~8 GPU-minutes a case), its race resumes when the race key is unchanged
  # (same GM_WORK, since the model's path is in the profile key); the lists it raced are frozen with it:
  # the newest committed rec-CASE-WORKLOAD.json under $CAP_SEED_RECS (default docs/results)
  seed="${CAP_SEED:-models/profiles}"; seed_recs="${CAP_SEED_RECS:-docs/results}"
  for c in "${cases[@]}"; do
    n=$(case_name "$c")
    if [ -f "$seed/$tag-$n.sqlite" ] && [ ! -f "$work/$tag-$n.sqlite" ]; then
      cp "$seed/$tag-$n.sqlite" "$work/$tag-$n.sqlite" && echo "seeded $tag-$n.sqlite from $seed"
      for w in cap-low-r2 cap-high-r32 cap-long-c768; do
        # the newest whose dataset is this tag's: cap-h200 and cap-h200-as4 answers share a file name
        rec=$(find "$seed_recs" -name "rec-$n-$w.json" 2>/dev/null | sort \
          | while read -r f; do grep -qF "/$tag-$n.sqlite\"" "$f" && echo "$f"; done | tail -n 1)
        if [ -n "$rec" ] && [ ! -s "$work/rec-$n-$w.json" ]; then cp "$rec" "$work/rec-$n-$w.json" && echo "seeded $rec"; fi
      done
    fi
  done
  cp bench/capture_sizes.py bench/capture_table.py bench/race_windows.py bench/grids/capture-sizes.yaml "$work/"
  # printf %q of no arguments writes '' (an empty argument after eval): vllm serve then fails on it (exit 2)
  if [ $# -gt 0 ]; then printf '%q ' "$@"; fi > "$work/race-options"
  echo "$tag" > "$work/tag"
  echo "${GM_SITE:-/tmp/site}" > "$work/site"
  echo "$py" > "$work/python"
  echo "${GM_VLLM_CMD:-python3 -m vllm.entrypoints.openai.api_server}" > "$work/vllm-cmd"
  echo "${CAP_VLLM_ARGS:-}" > "$work/vllm-args"
  # shellcheck disable=SC2016
  setsid nohup bash -c '
    work="$1"; shift
    opts=$(cat "$work/race-options"); tag=$(cat "$work/tag"); site=$(cat "$work/site"); py=$(cat "$work/python")
    vcmd=$(cat "$work/vllm-cmd")
    PYTHONPATH="$site"
    if [ -f "$site.env" ]; then . "$site.env"; fi
    export PYTHONPATH="$PYTHONPATH:$work/src" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
    grid="$work/capture-sizes.yaml"
    log() { echo "$(date -u +%FT%TZ) $*" >>"$work/chain.out"; }
    for c in "$@"; do
      IFS=: read -r shape kind budget <<< "$c"; kind="${kind:-loads}"
      name="$shape"; case "$kind" in long|long-decode) name="$shape-long";; esac
      ds="$work/$tag-$name.sqlite"; logs="$work/logs-$name"; out="$work/case-$name.out"
      mkdir -p "$work/model-$shape" "$logs"; cp "$work/shapes/$shape.json" "$work/model-$shape/config.json"
      args=(--model "$work/model-$shape" --load-format dummy --skip-tokenizer-init --max-model-len 4096)
      read -r -a extra < "$work/vllm-args" || true; args+=("${extra[@]}")
      if [ "$kind" = long ]; then
        args+=(--max-num-seqs 1024); seqs=1024; loads=(cap-long-c768); arms=(long); kv=12G
        race=(--cell-s 5 --cell-warmup-s 8 --race-metrics tpot_p50,itl_p50)
      elif [ "$kind" = long-decode ]; then
        # 768 x (64 + 384) tokens = 344,064 must fit each engine s KV cache, or the faster arm preempts and runs a
        # smaller batch (lease 12: 20G held 163,840 tokens on the 8B); 2 x (15 + 44) GiB fits the H200. Four load
        # processes: one was at 0.96 cores at 768 streams and timed gaps of ~0 (ITL p50 0.02 ms)
        args+=(--max-num-seqs 1024); seqs=1024; loads=(cap-long-c768); arms=(long); kv=44G
        race=(--cell-s 4 --cell-warmup-s 3 --race-metrics tpot_p50,itl_p50 --loadgen-processes 4)
      elif [ "$kind" = low ]; then
        seqs=256; loads=(cap-low-r2); arms=(low); kv=8G; race=()
      else
        seqs=256; loads=(cap-low-r2 cap-high-r32); arms=(low high); kv=8G; race=()
      fi
      racew=("${loads[@]}"); [ "$kind" = fixed ] && racew=(cap-low-c1 cap-high-c48)
      [ "$kind" = long-decode ] && racew=(cap-long-d768s)
      # lease 10: the 8B fixed race spent 7.1 GPU-min on its compile wave and first start (8 rounds), then
      # 5.2 on the restart wave and 13 rounds before both arms settled: 12.3 for two starts a side
      [ -z "$budget" ] && case "$kind" in fixed) budget=13;; long-decode) budget=10;; *) budget=7;; esac
      prof=("$py" -m graphmode.profiling profile --grid "$grid" --modes FULL_AND_PIECEWISE --dataset "$ds"
            --resume --port 8300 --log-dir "$logs" --vllm-cmd "$vcmd")
      log "$name: a. profile the default list (${loads[*]})"
      VLLM_CACHE_ROOT="$logs/vllm-cache/FULL_AND_PIECEWISE" "${prof[@]}" --workloads "$(IFS=,; echo "${loads[*]}")" \
        -- "${args[@]}" --gpu-memory-utilization 0.5 >>"$out" 2>&1 < /dev/null || { log "$name: profile failed"; continue; }
      specs=(); i=0; ok=1
      for w in "${loads[@]}"; do
        rec="$work/rec-$name-$w.json"
        if [ ! -s "$rec" ]; then
          log "$name: b. capture sizes for $w"
          "$py" "$work/capture_sizes.py" "$ds" --workload "$w" --max-num-seqs "$seqs" --json >"$rec.tmp" 2>>"$out" \
            && mv "$rec.tmp" "$rec"
        fi
        sizes=$("$py" -c "import json,sys; a=json.load(open(sys.argv[1])); print(\",\".join(map(str, a[0][\"answer\"][\"sizes\"])))" "$rec" 2>>"$out")
        [ -n "$sizes" ] || { log "$name: no recommendation for $w (no step sizes recorded?)"; rm -f "$rec"; ok=0; break; }
        specs+=("${arms[$i]}=$sizes"); i=$((i + 1))
      done
      [ "$ok" = 1 ] || continue
      # one arm per distinct list (the race refuses two arms with one list)
      if [ "${#specs[@]}" = 2 ] && [ "${specs[0]#*=}" = "${specs[1]#*=}" ]; then specs=("both=${specs[0]#*=}"); fi
      for s in "${specs[@]}"; do
        arm="${s%%=*}"; list="${s#*=}"
        cc="{\"cudagraph_capture_sizes\":[$list],\"max_cudagraph_capture_size\":${list##*,}}"
        log "$name: c. lone start of $arm [$list]"
        # seeded from the compile cache of the default list: each list compiled cold on 2026-12-02 (2.5 min a start); if
        # the compile key of vLLM leaves the sizes out, this start is warm, and if not it costs only the copy
        [ -d "$logs/vllm-cache/$arm" ] || cp -r "$logs/vllm-cache/FULL_AND_PIECEWISE" "$logs/vllm-cache/$arm" 2>/dev/null
        VLLM_CACHE_ROOT="$logs/vllm-cache/$arm" "${prof[@]}" --workloads cap-probe \
          -- "${args[@]}" --gpu-memory-utilization 0.5 --compilation-config "$cc" >>"$out" 2>&1 < /dev/null \
          || log "$name: lone start of $arm failed (the race goes on; the table marks its start-up numbers)"
      done
      sa=(); for s in "${specs[@]}"; do sa+=(--sizes-arm "$s"); done
      # CAP_REPLICAS > 1: that many resident engines per arm (--replicas) instead of two restarted starts
      startsopt="--starts 2"; [ "${CAP_REPLICAS:-1}" -gt 1 ] && startsopt="--replicas ${CAP_REPLICAS}"
      log "$name: d. race ${specs[*]} over ${racew[*]}, budget ${budget} min"
      eval "\"\$py\" -m graphmode.profiling profile --race --grid \"\$grid\" --modes FULL_AND_PIECEWISE \
        --workloads \"\$(IFS=,; echo \"\${racew[*]}\")\" --dataset \"\$ds\" --port 8200 --log-dir \"\$logs\" \
        --vllm-cmd \"\$vcmd\" --kv-cache-memory-bytes \${CAP_KV:-\$kv} --budget-min \${budget} \$startsopt \
        \"\${race[@]}\" \"\${sa[@]}\" $opts -- \"\${args[@]}\"" >>"$out" 2>&1 < /dev/null
      log "$name: race exited $?"
    done
    log "chain done"' chain "$work" "${cases[@]}" >>"$work/chain.out" 2>&1 < /dev/null &
  echo $! > "$work/chain.pid"
  echo "started the capture chain (pid $!): ${cases[*]}"
fi

end=$((SECONDS + wait_s))
while kill -0 "$(cat "$work/chain.pid")" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 5; done
kill -0 "$(cat "$work/chain.pid")" 2>/dev/null && echo "chain still running" || echo "chain finished"

datasets=()
for c in "${cases[@]}"; do
  n=$(case_name "$c"); [ -f "$work/$tag-$n.sqlite" ] && datasets+=("$work/$tag-$n.sqlite")
done
summary() {
  cat "$work/chain.out" 2>/dev/null
  for c in "${cases[@]}"; do
    n=$(case_name "$c")
    echo "== $n"; grep -E '^(race race-|round [0-9]+ done|  [A-Za-z_+-]+ +(itl|ttft|tpot)|done in)' \
      "$work/case-$n.out" 2>/dev/null | tail -n 8
  done
}
table() {
  [ ${#datasets[@]} -gt 0 ] || return 0
  # the host python has no pydantic: the bundle's site has it (the GPU run of 2026-12-02 lost its table so)
  PYTHONPATH="$(cat "$work/site" 2>/dev/null):$work/src" "$py" "$work/capture_table.py" "${datasets[@]}" --markdown \
    --latest 2>&1
  # the windows each arm measured against the default's: sd Δwarm-up ≈ 0 since race cells have a fixed warm-up
  echo
  PYTHONPATH="$(cat "$work/site" 2>/dev/null):$work/src" "$py" "$work/race_windows.py" "${datasets[@]}" --markdown \
    --race latest 2>&1
}
if [ -n "${OUT:-}" ]; then
  for d in "${datasets[@]}"; do
    "$py" - "$d" "$OUT/$(basename "$d")" <<'PY'
import sqlite3, sys
src = sqlite3.connect(sys.argv[1]); dst = sqlite3.connect(sys.argv[2]); src.backup(dst); dst.close()
PY
  done
  (cd "$work" && tar -czf "$OUT/recs.tgz" rec-*.json 2>/dev/null)
  (cd "$work" && tar -czf "$OUT/logs.tgz" --exclude='model-*' --exclude='shapes' --exclude='src' \
    --exclude='vllm-cache' --exclude='*.sqlite*' --exclude='*.pid' --exclude='rec-*' .) 2>/dev/null
  # a file over 16 MiB does not come back (lease 8: twelve resident engines' logs), and the host is gone
  # soon after the call: keep each engine log's first and last 400 lines instead
  if [ "$(stat -c %s "$OUT/logs.tgz" 2>/dev/null || echo 0)" -gt 15000000 ]; then
    trim=$(mktemp -d)
    (cd "$work" && find . \( -name vllm-cache -o -name 'model-*' -o -name src -o -name shapes \) -prune -o \
      -type f \( -name '*.log' -o -name '*.out' \) -print) | while read -r f; do
      mkdir -p "$trim/$(dirname "$f")"
      if [ "$(wc -l < "$work/$f")" -gt 800 ]; then
        { head -n 400 "$work/$f"; echo "[... trimmed by capture_chain.sh ...]"; tail -n 400 "$work/$f"; } > "$trim/$f"
      else cp "$work/$f" "$trim/$f"; fi
    done
    (cd "$trim" && tar -czf "$OUT/logs.tgz" .) && rm -rf "$trim"
  fi
  summary > "$OUT/summary.txt"
  table > "$OUT/table.md"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,uuid --format=csv > "$OUT/gpu.csv" 2>/dev/null \
    || rm -f "$OUT/gpu.csv"
  { du -sh "$work"/logs-*/vllm-cache 2>/dev/null; } >> "$OUT/summary.txt" 2>/dev/null
  # the host's kernel caches, for the next lease's first wave (restored above)
  gm_kcache_pack "$OUT" "$OUT/summary.txt"
fi
summary
table
