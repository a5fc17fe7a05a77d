#!/usr/bin/env bash
# "Retrain after a hardware change", on a GPU host that graphmode has no model for: a service that holds
# only the bundled models (another GPU's) answers for the served shape, the shape is raced on this GPU,
# a model is trained from the race, the service reloads and answers again. Each phase writes what the
# service said and when into $OUT, so the docs can quote the run.
#
# usage (on the GPU host, from the repo root, after unpack.sh put vLLM in $GM_SITE):
#   bench/gpu/hw_change.sh before SHAPE          # start `graphmode serve` (setsid), ask /v1/recommend
#   bench/gpu/hw_change.sh after SHAPE DATASET   # train on DATASET into the served registry, reload, ask again
# Python packages graphmode needs beyond the host's and vLLM's site (skops and its prettytable) travel as
# wheels in .whl/ and go to /tmp/site-gm. The service listens on 127.0.0.1:$GM_HW_PORT (8300).
# Runbook: docs/lab/operations.md, "Air-gapped GPU-host runbook"; the run on an H100: docs/results/h100-vllm0.33.md.
set -uo pipefail
phase="$1"; shape="$2"
site="${GM_SITE:-/tmp/site-0.33}"
port="${GM_HW_PORT:-8300}"
work=/tmp/gmhw; mkdir -p "$work"
out="${OUT:-$work/out}"; mkdir -p "$out"
token=hw-change-token
now() { date -u +%FT%TZ; }
stamp() { echo "$(now) $*" | tee -a "$work/timeline.txt"; }

if [ ! -d /tmp/site-gm ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-gm .whl/*.whl
fi
[ -d /tmp/gmhw/src ] || cp -r src /tmp/gmhw/src  # code fixed for the run, as the chains do
if [ -f "$site.env" ]; then . "$site.env"; fi  # the CUDA library setup unpack.sh chose; it sets PYTHONPATH
export PYTHONPATH="/tmp/site-gm:$site:/tmp/gmhw/src" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export GRAPHMODE_MODELS_DIR="$work/models" GRAPHMODE_SERVICE__TOKEN="$token"
gm() { python3 -m graphmode.cli "$@"; }

body() {  # the 1B's served config.json, a concurrency-1 short-prompt workload, TTFT objective
  python3 - "$shape" <<'EOF'
import json, sys
cfg = json.load(open(f"models/shapes/{sys.argv[1]}.json"))
print(json.dumps({"workload": {"rate": 1, "input_tokens": 64, "output_tokens": 256, "concurrency": 1},
                  "objective": {"metric": "ttft_p50"}, "vllm_version": "0.33.0",
                  "served_model_config": cfg}))
EOF
}

ask() {  # $1: file name under $OUT
  local t0 t1
  t0=$(date +%s.%N)
  curl -sS -m 30 -H 'content-type: application/json' -d "$(body)" "http://127.0.0.1:$port/v1/recommend" \
    > "$out/$1" 2>&1
  t1=$(date +%s.%N)
  stamp "asked /v1/recommend -> $1 ($(python3 -c "print(f'{($t1 - $t0) * 1000:.0f} ms')"))"
  python3 - "$out/$1" <<'EOF' | tee -a "$work/timeline.txt"
import json, sys
try:
    a = json.load(open(sys.argv[1]))
except ValueError:
    print("  (not JSON)", open(sys.argv[1]).read()[:400]); raise SystemExit
print("  mode:", a.get("mode"), "| model:", a.get("model_id"), "| confidence:", (a.get("confidence") or {}).get("level"))
for w in a.get("warnings", []) + [n if isinstance(n, str) else n.get("text", n) for n in a.get("notes", [])]:
    print("  note:", str(w)[:300])
EOF
}

case "$phase" in
  before)
    rm -rf "$work/models" && mkdir -p "$work/models"
    cp -r models/nvidia-* "$work/models/"  # the bundled models: none is this GPU's
    cp -r models/profiles models/shapes "$work/models/"
    stamp "host: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
    stamp "registry: $(ls "$work/models" | tr '\n' ' ')"
    setsid nohup python3 -m graphmode.cli serve --port "$port" --models-dir "$work/models" \
      >"$work/serve.log" 2>&1 < /dev/null &
    for _ in $(seq 120); do
      curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.5
    done
    stamp "serve healthy: $(curl -sS "http://127.0.0.1:$port/healthz")"
    ask hwchange-before.json
    ;;
  after)
    dataset="$3"
    stamp "training on $dataset"
    gm train --dataset "$dataset" --models-dir "$work/models" > "$out/hwchange-train.txt" 2>&1
    stamp "train exit $? ($(tail -1 "$out/hwchange-train.txt"))"
    curl -sS -m 60 -X POST -H "authorization: Bearer $token" "http://127.0.0.1:$port/v1/reload" \
      > "$out/hwchange-reload.json" 2>&1
    stamp "reload: $(head -c 300 "$out/hwchange-reload.json")"
    ask hwchange-after.json
    ;;
  *) echo "phase: before | after" >&2; exit 2 ;;
esac
cp "$work/timeline.txt" "$out/hwchange-timeline.txt"
tail -40 "$work/serve.log" > "$out/hwchange-serve.log" 2>/dev/null || true
