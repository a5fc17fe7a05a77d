#!/usr/bin/env bash
# Build the offline vLLM bundle for the GPU host (bench/gpu/build_bundle.sh) and pack its parts into device
# calls: each call carries the working tree plus at most 64 MiB in all, so the parts are cut to fill the
# room the tree leaves, in .gpu/ (ignored by git). Prints the device calls to make, back to back.
#
# usage (here, from the repo root):
#   bench/gpu/prepare_bundle.sh [--vllm 0.24.0|0.33.0] [--with-cuda] [BUNDLE_DIR] [-- build_bundle options]
# BUNDLE_DIR defaults to /tmp/bundle (0.24.0) or /tmp/bundle-0.33 (0.33.0); an existing build there is reused.
# 0.33.0: the calls carry core (torch, triton) first and run probe_torch.py on the call that completes it;
#   the CUDA overrides (cuda.part*, NCCL 2.30.7) travel with --with-cuda; else they are cut into calls of
#   their own, printed as the fallback for when the probe finds that the NCCL shim does not do.
# The calls are also written to .gpu/calls.txt.
# Run bench/gpu/slim_tree.sh on first when the tree is large. Runbook: docs/operations.md,
# "Air-gapped GPU-host runbook"; for 0.33: docs/results/vllm-0.33-prep.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
release=0.24.0; with_cuda=0; bundle=""
while [ $# -gt 0 ]; do
  case "$1" in
    --vllm) release="$2"; shift 2 ;;
    --with-cuda) with_cuda=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) bundle="$1"; shift ;;
  esac
done
case "$release" in
  0.24.0) bundle="${bundle:-/tmp/bundle}"; series=("") ;;
  0.33.0) bundle="${bundle:-/tmp/bundle-0.33}"; series=(core app) ;;
  *) echo "unknown --vllm $release (0.24.0 or 0.33.0)" >&2; exit 2 ;;
esac
if ! ls "$bundle"/*part* >/dev/null 2>&1 && ls .gpu/*part* >/dev/null 2>&1; then
  # no build here (a new machine keeps .gpu/ but not /tmp): re-cut the parts an earlier run left in .gpu/, e.g.
  # when the tree has grown and a call is refused as larger than 64 MiB
  bundle="$(mktemp -d /tmp/gm-rejoin.XXXXXX)"
  trap 'rm -rf "$bundle"' EXIT
  for s in "" core app cuda; do
    name="${s:+$s.}part"
    if ls .gpu/"$name"[0-9]* >/dev/null 2>&1; then cat .gpu/"$name"[0-9]* > "$bundle/${name}00"; fi
  done
  echo "re-cutting the parts in .gpu/ (no build in the bundle dir)"
fi
if ! ls "$bundle"/*part* >/dev/null 2>&1; then
  # pydantic-settings is the one graphmode dependency the GPU image lacks.
  bash bench/gpu/build_bundle.sh --vllm "$release" "$@" "$bundle" pydantic-settings python-dotenv
fi
if [ "$release" = 0.33.0 ] && [ "$with_cuda" = 1 ]; then
  ls "$bundle"/cuda.part* >/dev/null 2>&1 || { echo "no cuda.part* in $bundle" >&2; exit 2; }
  series=(core cuda app)
fi
exclude="$(git rev-parse --git-path info/exclude)"  # .git is a file in a worktree
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || grep -qx '.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 stat -c %s 2>/dev/null \
  | awk '{s += $1} END {print s + 0}')
limit=$((64 * 1024 * 1024))
margin=$((4 * 1024 * 1024))  # the tree grows between cutting and the calls (datasets, results)
room=$((limit - tree - margin))
if [ "$room" -lt $((8 * 1024 * 1024)) ]; then
  echo "the working tree is $((tree / 1048576)) MiB: too little room for bundle parts; run bench/gpu/slim_tree.sh on" >&2
  exit 2
fi
mkdir -p .gpu
rm -f .gpu/part* .gpu/core.part* .gpu/cuda.part* .gpu/app.part* .gpu/calls.txt
cp bench/gpu/unpack.sh .gpu/unpack.sh  # older runbooks (NOTES.md) carry .gpu/unpack.sh; the calls below use bench/gpu/

# Fill calls in order, series after series: a call may end one series and start the next. calls[i] holds
# the .gpu files call i carries; a file is one series' bytes [offset, offset + size).
calls=(); used=0; call=0; probe_call=-1
# Kernel caches an earlier lease sent back (capture_chain.sh's kcache.tgz, kept as .gpu/kcache.tgz) ride in
# the first call; the chain restores /tmp/stage/kcache.tgz before its first engine.
if [ -f .gpu/kcache.tgz ] && [ "$(stat -c %s .gpu/kcache.tgz)" -lt "$room" ]; then
  calls[0]=" .gpu/kcache.tgz"; used=$(stat -c %s .gpu/kcache.tgz)
fi
for s in "${series[@]}"; do
  name="${s:+$s.}part"
  cat "$bundle/$name"* > .gpu/whole
  total=$(stat -c %s .gpu/whole)
  offset=0; piece=0
  while [ "$offset" -lt "$total" ]; do
    [ "$used" -lt "$room" ] || { call=$((call + 1)); used=0; }
    take=$(( total - offset < room - used ? total - offset : room - used ))
    file=$(printf '.gpu/%s%02d' "$name" "$piece")
    dd if=.gpu/whole of="$file" iflag=skip_bytes,count_bytes skip="$offset" count="$take" bs=1M status=none
    calls[call]="${calls[call]:-} $file"
    offset=$((offset + take)); used=$((used + take)); piece=$((piece + 1))
  done
  rm -f .gpu/whole
  if [ "$s" = core ] || [ "$s" = cuda ]; then probe_call=$call; fi
done
# Without --with-cuda the CUDA overrides are cut into calls of their own, ready as the fallback.
fallback=()
if [ "$release" = 0.33.0 ] && [ "$with_cuda" = 0 ] && ls "$bundle"/cuda.part* >/dev/null 2>&1; then
  cat "$bundle"/cuda.part* | split -b "$room" -d -a 2 - .gpu/cuda.part
  fallback=(.gpu/cuda.part*)
fi
n=${#calls[@]}
# shellcheck disable=SC2086
total=$(cat ${calls[*]} | wc -c)  # what the calls carry (not the fallback)
echo "vLLM $release: tree $((tree / 1048576)) MiB, bundle $((total / 1048576)) MiB in $n device calls (room $((room / 1048576)) MiB each):"
ls -l .gpu/
echo
libs=--nccl-shim; if [ "$with_cuda" = 1 ]; then libs=--cuda-override; fi
json() { local out="" f; for f in "$@"; do out+="${out:+, }\"$f\""; done; echo "[$out]"; }
{
echo "device calls, back to back (kind nvidia-h200, or nvidia-h200-x2 for two shapes at once):"
for i in $(seq 0 $((n - 1))); do
  # shellcheck disable=SC2086
  set -- ${calls[i]}
  cmd="mkdir -p /tmp/stage && cp $* /tmp/stage/"
  if [ "$release" = 0.24.0 ] && [ "$i" = $((n - 1)) ]; then
    cmd+=" && bash bench/gpu/unpack.sh /tmp/stage && bash bench/gpu/run_slice.sh 500 GRID SHAPE:0 SHAPE:1 -- [profile options]"
  elif [ "$release" = 0.33.0 ] && [ "$i" = "$probe_call" ] && [ "$i" != $((n - 1)) ]; then
    cmd+=" && bash bench/gpu/unpack.sh --vllm 0.33.0 --only core --probe /tmp/stage"
  elif [ "$release" = 0.33.0 ] && [ "$i" = $((n - 1)) ]; then
    probe=""; if [ "$probe_call" = "$i" ]; then probe=" --probe"; fi
    cmd+=" && bash bench/gpu/unpack.sh --vllm 0.33.0 $libs$probe /tmp/stage && GM_SITE=/tmp/site-0.33 bash bench/gpu/run_slice.sh 500 GRID SHAPE:0 -- [profile options]"
  fi
  echo "  $((i + 1)). carry $(json "$@"): $cmd"
done
if [ "${#fallback[@]}" -gt 0 ]; then
  echo "fallback, only if the probe's host+nccl_shim setup failed (NCCL 2.30.7 travels instead, its own calls;"
  echo "the parts already on the host stay valid), then the last call above with --cuda-override for --nccl-shim:"
  for i in "${!fallback[@]}"; do
    cmd="mkdir -p /tmp/stage && cp ${fallback[i]} /tmp/stage/"
    if [ "$i" = $((${#fallback[@]} - 1)) ]; then cmd+=" && bash bench/gpu/unpack.sh --vllm 0.33.0 --only core --probe /tmp/stage"; fi
    echo "  F$((i + 1)). carry $(json "${fallback[i]}"): $cmd"
  done
fi
} | tee .gpu/calls.txt
