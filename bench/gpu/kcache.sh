# Kernel caches a GPU host builds on its first vLLM start, carried from one lease to the next (sourced by the
# chains: race_chain.sh, capture_chain.sh).
#
# Why: a fresh host's first start of vLLM 0.33 JIT-builds FlashInfer's sampling module ("Building JIT module
# sampling; this can take several minutes on first use": 113 s of the 8B's 245-s compile start on the H100,
# 2026-12-06) and fills Triton's and Inductor's caches. The bundle ships no prebuilt FlashInfer kernels
# (flashinfer-cubin / flashinfer-jit-cache), so every lease paid it again. H100 and H200 are both sm_90: a
# cache from either serves the other.
#
# gm_kcache_restore WORK: unpack the first of .gpu/kcache.tgz, /tmp/stage/kcache.tgz (or the archives
#   GM_KCACHE_FROM names, space-separated) under /, once per WORK.
# gm_kcache_pack OUT SUMMARY: while OUT holds fewer than 8 files, write OUT/kcache.tgz of the host's caches
#   that fit the 16 MB a returned file may have (dropping the largest-risk cache, Inductor's, first), and say
#   what it holds in SUMMARY. GM_KCACHE_DIRS (space-separated absolute paths) replaces the list of caches. Copy it to .gpu/kcache.tgz after the lease: prepare_bundle.sh puts it in the
#   first bundle call.

gm_kcache_restore() {
  local work="$1" src
  for src in ${GM_KCACHE_FROM:-.gpu/kcache.tgz /tmp/stage/kcache.tgz}; do
    if [ -f "$src" ] && [ ! -f "$work/kcache-restored" ]; then
      tar -xzf "$src" -C / 2>/dev/null && date -u +%FT%TZ > "$work/kcache-restored" \
        && echo "restored kernel caches from $src"
    fi
  done
}

gm_kcache_pack() {
  local out="$1" summary="$2" d kc=()
  for d in ${GM_KCACHE_DIRS:-"$HOME/.cache/flashinfer" "$HOME/.triton/cache" "/tmp/torchinductor_$(id -un)"}; do
    [ -d "$d" ] && kc+=("${d#/}")
  done
  { echo "== kernel caches (du -sh)"; for d in "${kc[@]}"; do du -sh "/$d"; done; } >> "$summary" 2>/dev/null
  while [ ${#kc[@]} -gt 0 ] && [ "$(find "$out" -maxdepth 1 -type f ! -name kcache.tgz | wc -l)" -lt 8 ]; do
    tar -czf "$out/kcache.tgz" -C / "${kc[@]}" 2>/dev/null
    if [ "$(stat -c %s "$out/kcache.tgz" 2>/dev/null || echo 0)" -le 16000000 ]; then
      echo "kcache.tgz: ${kc[*]}" >> "$summary"; return 0
    fi
    rm -f "$out/kcache.tgz"; echo "kcache.tgz over 16 MB with ${kc[-1]}: left out" >> "$summary"
    unset 'kc[-1]'
  done
  return 0
}
