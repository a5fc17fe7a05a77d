#!/usr/bin/env bash
# Profile several shapes one after another on one GPU (run_slice.sh starts one chain per GPU).
#
# usage: bench/gpu/profile_chain.sh GRID GPU SHAPE[:REPEATS[:MODES]] [...] [-- profile options...]
# Each shape keeps its own dataset, log dir and output under /tmp/gm; the datasets are resumable and
# seeded from models/profiles/h200-SHAPE.sqlite, so a chain cut short by the host going away loses
# at most the cell in flight.
set -uo pipefail
grid="$1"; gpu="$2"; shift 2
shapes=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do shapes+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
work=/tmp/gm; mkdir -p "$work"
for s in "${shapes[@]}"; do
  IFS=: read -r shape reps modes <<< "$s"
  per=(); [ -n "${reps:-}" ] && per=(--repeats "$reps")
  [ -n "${modes:-}" ] && per+=(--modes "$modes")
  mkdir -p "$work/model-$shape"
  cp "models/shapes/$shape.json" "$work/model-$shape/config.json"
  ds="$work/$shape.sqlite"
  [ -f "$ds" ] || { [ -f "models/profiles/h200-$shape.sqlite" ] && cp "models/profiles/h200-$shape.sqlite" "$ds"; }
  echo "$(date -u +%FT%TZ) profiling $shape on GPU $gpu ${per[*]}" >>"$work/profile-$shape.out"
  CUDA_VISIBLE_DEVICES="$gpu" python3 -m graphmode.profiling profile --grid "$grid" \
    --dataset "$ds" --resume --port $((8100 + gpu)) --log-dir "$work/logs-$shape" \
    --vllm-cmd "python3 -m vllm.entrypoints.openai.api_server" "${per[@]}" "$@" \
    -- --model "$work/model-$shape" --load-format dummy --skip-tokenizer-init --max-model-len 4096 \
    --gpu-memory-utilization 0.5 >>"$work/profile-$shape.out" 2>&1 < /dev/null
done
