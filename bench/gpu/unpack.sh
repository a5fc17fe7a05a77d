#!/usr/bin/env bash
# On the GPU host: join the bundle parts gathered in STAGE_DIR and unpack them, then check them.
#
# usage: unpack.sh [--vllm 0.24.0|0.33.0] [--cuda-override | --nccl-shim] [--probe] [--only core] STAGE_DIR
#   --vllm 0.24.0 (default): STAGE_DIR/part* -> /tmp/site, then `import vllm`, as before.
#   --vllm 0.33.0: STAGE_DIR/core.part* (torch, triton) and app.part* (vLLM) -> /tmp/site-0.33,
#       cuda.part* (if there) -> /tmp/cuda-0.33. Writes /tmp/site-0.33.env, which run_slice.sh reads
#       with GM_SITE=/tmp/site-0.33 (or `. /tmp/site-0.33.env` by hand): PYTHONPATH and, only when asked,
#       --cuda-override: the carried CUDA libraries first (PYTHONPATH, where torch looks, and LD_LIBRARY_PATH), or
#       --nccl-shim: libnccl_compat.so on LD_PRELOAD (torch 2.14 on the host's NCCL 2.28.9).
#   --probe: run probe_torch.py (every library setup there is; writes $OUT/probe.json and
#       $OUT/host-freeze.txt) before anything else is checked.
#   --only core: unpack core (and cuda) only, e.g. to probe before vLLM's parts have travelled.
# A series already unpacked (its marker file in the target is newer than its parts) is not unpacked again,
# so the call that carries the last part can repeat this safely.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
release=0.24.0; mode=""; probe=0; only=""
while [ $# -gt 1 ]; do
  case "$1" in
    --vllm) release="$2"; shift 2 ;;
    --cuda-override) mode=override; shift ;;
    --nccl-shim) mode=shim; shift ;;
    --probe) probe=1; shift ;;
    --only) only="$2"; shift 2 ;;
    *) break ;;
  esac
done
stage="${1:?usage: unpack.sh [--vllm 0.24.0|0.33.0] [--cuda-override|--nccl-shim] [--probe] STAGE_DIR}"

if [ "$release" = 0.24.0 ]; then
  rm -rf /tmp/site
  cat "$stage"/part* | xz -d -T0 | tar -x -C /tmp
  PYTHONPATH=/tmp/site python3 -c "import vllm; print('vllm', vllm.__version__, 'ready in /tmp/site')"
  exit 0
fi
[ "$release" = 0.33.0 ] || { echo "unknown --vllm $release" >&2; exit 2; }

site=/tmp/site-0.33; cuda=/tmp/cuda-0.33
unpack() {  # unpack() SERIES: join STAGE_DIR/SERIES.part* and untar into /tmp, once
  local series="$1" marker="/tmp/.unpacked-0.33-$1"
  ls "$stage/$series".part* >/dev/null 2>&1 || { echo "no $series parts in $stage"; return 1; }
  if [ -f "$marker" ] && [ -z "$(find "$stage" -name "$series.part*" -newer "$marker")" ]; then
    echo "$series: already unpacked"; return 0
  fi
  cat "$stage/$series".part* | xz -d -T0 | tar -x -C /tmp
  touch "$marker"
  echo "$series: unpacked ($(cat "$stage/$series".part* | wc -c | awk '{printf "%.0f MiB", $1 / 1048576}'))"
}
unpack core
unpack cuda || true
[ "$only" = core ] || unpack app

shim="$site/graphmode_compat/libnccl_compat.so"
if [ "$probe" = 1 ]; then
  python3 "$here/probe_torch.py" "$site" --cuda-dir "$cuda" --shim "$shim" --out "${OUT:-/tmp}" || true
fi

# torch 2.14 was built against cuDNN 9.24 and refuses the host's 9.19 in torch.backends.cudnn.version()
# unless told not to check; a dense model on Hopper makes no cuDNN call (the probe's conv step says
# whether cuDNN itself works).
{
  case "$mode" in
    override)
      dirs=$(find "$cuda" -path '*/nvidia/*/lib' -type d | sort | paste -sd: -)
      [ -n "$dirs" ] || { echo "--cuda-override: nothing under $cuda" >&2; exit 2; }
      # torch preloads its CUDA libraries from the first sys.path entry holding nvidia/*/lib, before the
      # dynamic loader looks at LD_LIBRARY_PATH: the override has to come before the host's site-packages.
      echo "export PYTHONPATH=$site:$cuda HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1"
      echo "export LD_LIBRARY_PATH=$dirs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" ;;
    shim)
      echo "export PYTHONPATH=$site HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1"
      echo "export LD_PRELOAD=$shim\${LD_PRELOAD:+:\$LD_PRELOAD}" ;;
    *) echo "export PYTHONPATH=$site HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1" ;;
  esac
  echo "export PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1"
} > "$site.env"
echo "environment ($site.env):"; cat "$site.env"
[ "$only" = core ] && exit 0
# shellcheck disable=SC1090
(. "$site.env"; python3 -c "import torch, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__, 'ready in $site')")
