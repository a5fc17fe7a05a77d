#!/usr/bin/env bash
# Estimate what a directory tree compresses to with xz, without compressing all of it: its tar stream is
# cut into 8-MiB blocks and every EVERY-th block is compressed on its own; the ratio scales to the whole.
# A block as large as xz -6's dictionary loses little against one long stream (-9's 64-MiB dictionary
# finds a few per cent more), so the estimate errs high. CPU cost: 1/EVERY of a full run, in one pass.
#
# usage: estimate_xz.sh DIR [EVERY=8] [LEVEL=-6]
# prints: DIR, raw MiB, estimated xz MiB, ratio, and how many 60-MiB parts that is
set -euo pipefail
dir="${1:?usage: estimate_xz.sh DIR [EVERY] [LEVEL]}"; every="${2:-8}"; level="${3:--6}"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
export E="$every" L="$level" T="$tmp"
# split hands each block to the filter as stdin, its index in $FILE (x000000, x000001, ...).
{ tar -C "$(dirname "$dir")" -cf - "$(basename "$dir")" || true; } | tee >(wc -c > "$tmp/raw") \
  | split -b 8M -d -a 6 --filter='n=$((10#${FILE#x}))
      if [ $((n % E)) -eq 0 ]; then
        cat > "$T/block"; echo "$(stat -c %s "$T/block") $(xz $L -T2 -c < "$T/block" | wc -c)" >> "$T/log"
      else cat > /dev/null; fi' - x
sleep 1  # let the tee'd byte count land
awk -v d="$dir" -v r="$(cat "$tmp/raw")" '{ s += $1; p += $2 } END {
  e = r * p / s; printf "%s  raw %.0f MiB  est. xz %.1f MiB  ratio %.3f  (%d parts of 60 MiB; sampled %.0f MiB)\n",
  d, r / 1048576, e / 1048576, p / s, int((e + 62914559) / 62914560), s / 1048576 }' "$tmp/log"
