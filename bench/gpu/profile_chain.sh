#!/usr/bin/env bash
# One GPU's profiling chain, on the GPU host: profile several model shapes one after another on one GPU.
# bench/gpu/run_slice.sh starts one chain per GPU; run this by hand only to debug a chain.
#
# usage: bench/gpu/profile_chain.sh GRID GPU SHAPE[:REPEATS[:MODES]] [...] [-- profile options...]
#
# SHAPE is models/shapes/SHAPE.json (vLLM runs it with dummy weights). Each shape gets its own dataset
# /tmp/gm/SHAPE.sqlite (seeded from models/profiles/h200-SHAPE.sqlite on first use, then resumed), log dir
# /tmp/gm/logs-SHAPE and output /tmp/gm/profile-SHAPE.out; vLLM listens on port 8100 + GPU. REPEATS becomes
# --repeats (the total wanted; done repeats are skipped) and MODES (comma-separated) --modes. A chain cut
# short by the end of a lease loses at most the cell in flight; the next lease resumes it.
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
