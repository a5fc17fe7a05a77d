#!/usr/bin/env bash
# Keep the large committed files that the GPU host does not need out of the working tree that travels with
# each device call, then put them back. Run on the workstation, in the repo root.
#
# usage: bench/gpu/slim_tree.sh on    # before bench/gpu/prepare_bundle.sh and the first device call
#        bench/gpu/slim_tree.sh off   # right after the lease, before any commit
#
# A device call carries the working tree (tracked and untracked-not-ignored files) plus its carried paths,
# 64 MiB in all; a 50-MiB bundle part does not fit beside a tree that holds trained models and images. The
# profiler needs src/, the grid, models/shapes/ and models/profiles/ only. "on" untracks every file over
# 1 MiB under models/ and docs/ except models/profiles/ and models/shapes/ (git rm --cached) and ignores
# them in .git/info/exclude, so they stay on disk but do not travel; "off" undoes both. Do not commit in
# between: the commit would delete them.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
marker="# graphmode slim_tree"
exclude="$(git rev-parse --git-path info/exclude)"  # .git is a file in a worktree

case "${1:-}" in
  on)
    if grep -q "^$marker" "$exclude" 2>/dev/null; then echo "already slim"; exit 0; fi
    mapfile -t big < <(git ls-files -z models docs | xargs -0 -r ls -l 2>/dev/null \
      | awk '$5 > 1048576 && $9 !~ /^models\/profiles\// && $9 !~ /^models\/shapes\// {print $9}')
    [ ${#big[@]} -gt 0 ] || { echo "nothing large to leave behind"; exit 0; }
    git rm -q --cached -- "${big[@]}"
    { echo "$marker"; printf '/%s\n' "${big[@]}"; echo "$marker end"; } >> "$exclude"
    printf 'left behind: %s\n' "${big[@]}"
    ;;
  off)
    grep -q "^$marker" "$exclude" 2>/dev/null || { echo "not slim"; exit 0; }
    mapfile -t big < <(sed -n "/^$marker\$/,/^$marker end\$/p" "$exclude" | grep -v "^#" | sed 's|^/||')
    sed -i "/^$marker\$/,/^$marker end\$/d" "$exclude"
    git reset -q -- "${big[@]}"
    git status --short -- "${big[@]}"
    printf 'tracked again: %s\n' "${big[@]}"
    ;;
  *) echo "usage: $0 on|off" >&2; exit 2 ;;
esac
git ls-files -co --exclude-standard -z | du -ch --files0-from=- 2>/dev/null | tail -1 | sed 's/total/travels with each call/'
