#!/usr/bin/env bash
# Prepare the offline vLLM bundle for an air-gapped GPU host. Run on the workstation, from the repo root,
# after bench/gpu/slim_tree.sh on (the part size depends on what travels with each call).
#
# usage: bench/gpu/prepare_bundle.sh [BUNDLE_DIR]        BUNDLE_DIR defaults to /tmp/bundle
#
# The GPU host has no network, so vLLM, torch and the graphmode dependencies its image lacks reach it as a
# bundle. Each device call carries the working tree plus the files named in carry, 64 MiB in all, so the
# bundle travels in parts that each fit beside the tree. This script builds the bundle with
# shared/gpu-host/build-bundle.sh (beside the checkout; ~5 min), or reuses a build already in BUNDLE_DIR,
# splits it evenly into the fewest parts that fit (2 MiB margin), puts the parts and unpack.sh in .gpu/
# (ignored by git and kept between leases, so a later lease can skip the build) and prints the device calls
# to make. Runbook: docs/operations.md, "Air-gapped GPU-host runbook".
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle="${1:-/tmp/bundle}"
builder=../shared/gpu-host/build-bundle.sh
if ! ls "$bundle"/part* >/dev/null 2>&1; then
  [ -x "$builder" ] || [ -f "$builder" ] || { echo "no $builder here: build the bundle by hand" >&2; exit 2; }
  # pydantic-settings is the one graphmode dependency the GPU image lacks.
  bash "$builder" "$bundle" vllm==0.24.0 pydantic-settings python-dotenv
fi
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || grep -qx '.gpu/' .git/info/exclude 2>/dev/null \
  || echo '/.gpu/' >> .git/info/exclude
mkdir -p .gpu
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 stat -c %s 2>/dev/null \
  | awk '{s += $1} END {print s + 0}')
limit=$((64 * 1024 * 1024))
margin=$((2 * 1024 * 1024))
part=$((limit - tree - margin))
total=$(cat "$bundle"/part* | wc -c)
if [ "$part" -lt $((8 * 1024 * 1024)) ]; then
  echo "the working tree is $((tree / 1048576)) MiB: too little room for bundle parts; move large files aside" >&2
  exit 2
fi
# Fewest parts that fit, sized evenly so none is a sliver.
n=$(( (total + part - 1) / part ))
size=$(( (total + n - 1) / n ))
rm -f .gpu/part*
cat "$bundle"/part* | split -b "$size" -d -a 2 - .gpu/part
cp ../shared/gpu-host/unpack.sh .gpu/unpack.sh 2>/dev/null || [ -f .gpu/unpack.sh ]
echo "tree $((tree / 1048576)) MiB, bundle $((total / 1048576)) MiB in $n parts of $((size / 1048576)) MiB:"
ls -l .gpu/
last=$(printf 'part%02d' $((n - 1)))
echo
echo "device calls, back to back (kind nvidia-h200-x2 for two shapes at once):"
for i in $(seq 0 $((n - 2))); do
  p=$(printf 'part%02d' "$i")
  echo "  carry [\".gpu/$p\"]: mkdir -p /tmp/stage && cp .gpu/$p /tmp/stage/"
done
echo "  carry [\".gpu/$last\", \".gpu/unpack.sh\"]: cp .gpu/$last /tmp/stage/ && bash .gpu/unpack.sh /tmp/stage && bash bench/gpu/run_slice.sh 500 GRID SHAPE:0 SHAPE:1 -- [profile options]"
