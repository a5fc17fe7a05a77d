#!/usr/bin/env bash
# On the GPU host, after unpack.sh: does the load client read ITL right where lease 12's did not?
#
# usage: GM_SITE=/tmp/site-0.33 bash bench/gpu/client_check.sh WAIT_S [SHAPE]
#
# Lease 12's condition (docs/capture-sizes.md): SHAPE (default the Qwen2.5-0.5B shape) in vLLM's default mode and
# list, --max-num-seqs 1024, four API servers, cap-long-d768s (768 requests in flight, 384 output tokens; as
# bench/grids/client-check.yaml's window cell) and one
# load process, which ran at 0.96 cores and read ITL p50 0.017 ms with TPOT ~20 ms. One engine start per run of
# the profiler: first with one load process, then (if WAIT_S leaves room) with four. Each cell records the
# client's ITL (timed per network read since session 28), tokens a read, TPOT and vLLM's own mean ITL
# (server_itl_mean). $OUT gets client-check.sqlite, client-check.out and a table (client-check.txt).
# Dry run here against the fake server (seconds, not a measurement):
#   GM_VLLM_CMD="python3 tests/support/fake_vllm.py" GM_SITE=/nonexistent bash bench/gpu/client_check.sh 120
set -uo pipefail
wait_s="$1"; shape="${2:-qwen2.5-0.5b}"
site="${GM_SITE:-/tmp/site-0.33}"
. bench/gpu/preflight.sh && gm_preflight "$site" python3 "$PWD/src" || exit 3
PYTHONPATH="$site"
if [ -f "$site.env" ]; then . "$site.env"; fi
export PYTHONPATH="$PYTHONPATH:$PWD/src" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
work=/tmp/gm-client; mkdir -p "$work/model"
cp "models/shapes/$shape.json" "$work/model/config.json"
for kc in .gpu/kcache.tgz /tmp/stage/kcache.tgz; do
  if [ -z "${GM_VLLM_CMD:-}" ] && [ -f "$kc" ]; then tar -xzf "$kc" -C / 2>/dev/null && echo "restored kernel caches from $kc"; break; fi
done
ds="$work/client-check.sqlite"; out="$work/client-check.out"
# vLLM 0.33 starts several API servers only from `vllm serve` (docs/capture-sizes.md)
vcmd="${GM_VLLM_CMD:-python3 -m vllm.entrypoints.cli.main serve}"
end=$((SECONDS + wait_s))
for procs in 1 4; do
  # the first run has the cold start (~200 s on a fresh host); a later one ~90 s, then a ~20-s cell
  if [ "$procs" -gt 1 ] && [ $((end - SECONDS)) -lt 150 ]; then echo "no room for $procs load processes" >>"$out"; break; fi
  echo "$(date -u +%FT%TZ) $procs load process(es)" >>"$out"
  timeout $((end - SECONDS)) python3 -m graphmode.profiling profile --grid bench/grids/client-check.yaml \
    --modes FULL_AND_PIECEWISE --dataset "$ds" --port 8300 --log-dir "$work/logs" \
    --loadgen-processes "$procs" --vllm-cmd "$vcmd" \
    -- --model "$work/model" --load-format dummy --skip-tokenizer-init --max-model-len 4096 \
    --max-num-seqs 1024 --api-server-count 4 --gpu-memory-utilization 0.5 >>"$out" 2>&1 < /dev/null
  echo "$(date -u +%FT%TZ) exit $?" >>"$out"
done
python3 - "$ds" >"$work/client-check.txt" 2>&1 <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1]); db.row_factory = sqlite3.Row
cols = ("loadgen_cpu_cores", "chunk_tokens_mean", "itl_p50", "itl_mean", "server_itl_mean", "tpot_p50",
        "ttft_p50", "server_ttft_mean", "obs_batch_mean", "n_ok", "n_sent")
print("status " + " ".join(cols))
for r in db.execute("SELECT * FROM cells ORDER BY started_at"):
    print(r["status"], *(f"{r[c]:.5g}" if isinstance(r[c], float) else r[c] for c in cols))
PY
if [ -n "${OUT:-}" ]; then
  python3 -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); d=sqlite3.connect(sys.argv[2]); s.backup(d)" \
    "$ds" "$OUT/client-check.sqlite" 2>/dev/null
  cp "$out" "$work/client-check.txt" "$OUT/" 2>/dev/null
  tail -c 200000 "$(ls -t "$work"/logs/*.log 2>/dev/null | head -n 1)" > "$OUT/engine-last.log" 2>/dev/null
fi
cat "$work/client-check.txt"; tail -n 8 "$out"
