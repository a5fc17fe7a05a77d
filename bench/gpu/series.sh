#!/usr/bin/env bash
# Run bench/gpu/series.py (issue 17, step 1: the time pattern) on the GPU host in the background, and collect it.
#
# usage (GPU host, repo root):
#   [GM_SITE=/tmp/site-0.33] bench/gpu/series.sh WAIT_S [SHAPE [KV [MINUTES]]]   (qwen2.5-0.5b 8G 20)
# Device commands (one lease, 30 device-minutes; the series holds the GPU about MINUTES + 4 minutes: a cold
# compile start of both engines at once, a warm restart of both, then MINUTES of loops):
#   vLLM 0.24 (after the 4 calls of `bash bench/gpu/prepare_bundle.sh` put it in /tmp/site):
#     bash bench/gpu/series.sh 560 qwen2.5-0.5b 8G 20      # starts it; then the same line again until
#                                                           # "experiment finished" (3 calls in all)
#   vLLM 0.33 (after `bash bench/gpu/prepare_bundle.sh --vllm 0.33.0` put it in /tmp/site-0.33):
#     GM_SITE=/tmp/site-0.33 bash bench/gpu/series.sh 560 qwen2.5-0.5b 8G 20
# Here, on what came back: .venv/bin/python bench/start_effect_stats.py --series DIR --markdown
#
# The experiment starts once under setsid and outlives the device call; calling again only waits up to
# WAIT_S and collects. The source is copied to $GM_WORK when it starts, so later calls (which lay the
# working tree anew) cannot change code mid-series. GM_SITE picks the release's site dir (default
# /tmp/site: vLLM 0.24); its .env, written by unpack.sh, adds the CUDA library setup the probe chose.
# Into $OUT (at most 6 files): cells.jsonl, starts.jsonl, out.txt, logs.tgz, gpu.csv, summary.txt.
# GM_PYTHON / GM_VLLM_CMD / GM_PORT / GM_WORK: a local smoke test against tests/support/fake_vllm.py.
set -uo pipefail
wait_s="$1"; shape="${2:-qwen2.5-0.5b}"; kv="${3:-8G}"; minutes="${4:-20}"
work="${GM_WORK:-/tmp/gseries}"; mkdir -p "$work"
py="${GM_PYTHON:-python3}"
site="${GM_SITE:-/tmp/site}"
[ -f "models/shapes/$shape.json" ] || { echo "unknown shape $shape (models/shapes/)" >&2; exit 2; }
if ! { [ -f "$work/pid" ] && kill -0 "$(cat "$work/pid")" 2>/dev/null; }; then
  if [ -f "$work/out.txt" ] && grep -q "experiment finished" "$work/out.txt"; then
    echo "already finished"
  elif [ -s "$work/data/cells.jsonl" ]; then
    # Never start over on top of a series that ended early: its cells are the data (rm -rf $work to redo).
    echo "the series ended without finishing; collecting what it measured"
  else
    rm -rf "$work/src" "$work/data" "$work/pid" && cp -r src "$work/src" \
      && cp bench/gpu/start_effect.py bench/gpu/series.py "$work/"
    mkdir -p "$work/model" && cp "models/shapes/$shape.json" "$work/model/config.json"
    echo "$(date -u +%FT%TZ) series: $shape kv $kv $minutes min, site $site" >> "$work/out.txt"
    # The child records its own pid (setsid may fork), then becomes the experiment (exec keeps the pid).
    # shellcheck disable=SC2016
    GM_S_WORK="$work" GM_S_SITE="$site" GM_S_PY="$py" GM_S_ARGS="--kv $kv --series-min $minutes --port ${GM_PORT:-8400}" \
      setsid nohup bash -c '
        echo $$ > "$GM_S_WORK/pid"
        site="$GM_S_SITE"; export PYTHONPATH="$site"
        if [ -f "$site.env" ]; then . "$site.env"; fi
        export PYTHONPATH="$PYTHONPATH:$GM_S_WORK/src" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
        # shellcheck disable=SC2086
        exec "$GM_S_PY" "$GM_S_WORK/series.py" --model "$GM_S_WORK/model" --out "$GM_S_WORK/data" $GM_S_ARGS \
          ${GM_VLLM_CMD:+--vllm-cmd "$GM_VLLM_CMD"}' >>"$work/out.txt" 2>&1 < /dev/null &
    for _ in $(seq 50); do [ -s "$work/pid" ] && break; sleep 0.2; done
    echo "started (pid $(cat "$work/pid" 2>/dev/null)): $shape kv $kv, $minutes minutes of loops"
  fi
fi
end=$((SECONDS + wait_s))
while kill -0 "$(cat "$work/pid" 2>/dev/null)" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 2; done
kill -0 "$(cat "$work/pid" 2>/dev/null)" 2>/dev/null && echo "experiment still running" || echo "experiment process ended"
if [ -n "${OUT:-}" ]; then
  cp "$work/data/cells.jsonl" "$work/data/starts.jsonl" "$work/out.txt" "$OUT/" 2>/dev/null
  (cd "$work/data" && tar -czf "$OUT/logs.tgz" logs) 2>/dev/null
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,uuid --format=csv > "$OUT/gpu.csv" 2>/dev/null \
    || rm -f "$OUT/gpu.csv"
  if [ -f "$work/data/cells.jsonl" ]; then
    # A first look without the stats script (the GPU host has no pandas in its site for sure).
    "$py" - "$work/data/cells.jsonl" > "$OUT/summary.txt" 2>&1 <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
ok = [r for r in rows if r.get("itl_p50_ms") is not None]
last = max((r["elapsed_s"] for r in rows), default=0.0)
print(f"{len(rows)} cells ({len(rows) - len(ok)} failed), {max((r['loop'] for r in rows), default=-1) + 1} loops, "
      f"{last / 60:.1f} min")
for eng in ("A", "B"):
    for cell in ("c1", "c8"):
        xs = sorted(r["itl_p50_ms"] for r in ok if r["engine"] == eng and r["cell"] == cell)
        if xs:
            print(f"{eng} {cell}: itl p50 median {xs[len(xs) // 2]:.3f} ms over {len(xs)} cells")
EOF
  fi
fi
tail -n 8 "$work/out.txt"
