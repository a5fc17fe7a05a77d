#!/usr/bin/env bash
# Build an offline vLLM bundle for the GPU host (CPython 3.12, torch 2.11.0+cu130, no network, at most
# ~60 MiB per transfer) and split it into parts.
#
# usage: build_bundle.sh [--vllm 0.24.0|0.33.0] [--cuda NAME]... [--no-default-cuda] [--host-freeze FILE]
#                        [--wheels DIR] OUT_DIR [extra wheel specs...]
#   --vllm 0.24.0 (default): the release that runs on the host's own torch. OUT_DIR/part00, part01, ...
#       unpack to /tmp/site, exactly as ../shared/gpu-host/build-bundle.sh made them.
#   --vllm 0.33.0: brings torch 2.14.0, triton 3.8 and torchvision 0.29 (vLLM pins them) and the CUDA
#       libraries the host's cannot replace (resolve_deps.py says which and why), as three series:
#         OUT_DIR/core.partNN  torch, triton, torchvision       -> /tmp/site-0.33
#         OUT_DIR/cuda.partNN  CUDA library overrides           -> /tmp/cuda-0.33 (LD_LIBRARY_PATH, on request)
#         OUT_DIR/app.partNN   vLLM and the rest of its tree    -> /tmp/site-0.33
#       core and cuda come first so that probe_torch.py can test torch on the host before vLLM travels.
#   --wheels DIR: reuse (or keep) the downloaded wheels there instead of a temporary directory.
#   --no-xz: stop before compressing; the staged trees stay in OUT_DIR/stage (to measure, or to inspect).
#   Extra specs add wheels the project's own code needs there (pydantic-settings ...).
# Then bench/gpu/prepare_bundle.sh packs the parts into device calls; unpack.sh joins them on the host.
# Needs: pip, packaging, xz. XZ_OPT (default -9 -T0) sets the compression: -6 -T2 on a shared box.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
release=0.24.0; resolve_args=(); wheels=""; no_xz=0
while [ $# -gt 0 ]; do
  case "$1" in
    --vllm) release="$2"; shift 2 ;;
    --cuda|--host-freeze) resolve_args+=("$1" "$2"); shift 2 ;;
    --no-default-cuda) resolve_args+=("$1"); shift ;;
    --wheels) wheels="$2"; shift 2 ;;
    --no-xz) no_xz=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
case "$release" in 0.24.0|0.33.0) ;; *) echo "unknown --vllm $release (0.24.0 or 0.33.0)" >&2; exit 2 ;; esac
[ $# -ge 1 ] || { echo "usage: $0 [--vllm 0.24.0|0.33.0] OUT_DIR [extra specs...]" >&2; exit 2; }
out="$(mkdir -p "$1" && cd "$1" && pwd)"; shift
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
wheels="${wheels:-$work/wheels}"
export XZ_OPT="${XZ_OPT:--9 -T0}"
platforms=(); for n in $(seq 5 39); do platforms+=("--platform=manylinux_2_${n}_x86_64"); done
platforms+=(--platform=manylinux2014_x86_64 --platform=manylinux2010_x86_64 --platform=manylinux1_x86_64)
install() {  # install() TARGET WHEEL...: unpack wheels into a site directory for CPython 3.12
  local target="$1"; shift
  python3 -m pip install -q --no-deps --no-compile --target "$target" --python-version=3.12 \
    --implementation=cp --only-binary=:all: "${platforms[@]}" "$@" 2>&1 | { grep -v "Running pip as the 'root'" || true; }
}
pack() {  # pack() NAME DIR: DIR (relative to $work) -> $out/NAME.part00.. (or part00.. for NAME="")
  local prefix="$out/${1:+$1.}part"
  echo "compressing $2 ($(du -sh "$work/$2" | cut -f1), xz $XZ_OPT)..."
  tar -C "$work" -cf - "$2" | xz | split -b 60m -d - "$prefix"
}

if [ -z "$(ls "$wheels"/site/*.whl 2>/dev/null)" ]; then
  echo "resolving vllm==$release and what the host lacks..."
  python3 "$here/resolve_deps.py" "$wheels" --vllm "$release" "${resolve_args[@]}" "$@"
fi

if [ "$release" = 0.24.0 ]; then
  site="$work/site"
  echo "installing into a site directory..."
  install "$site" "$wheels"/site/*.whl
else
  site="$work/site-0.33"
  echo "installing into $(basename "$site")..."
  install "$site" "$wheels"/site/*.whl
  # torch's wheel puts the CUDA libraries' RPATH at ../../nvidia/*/lib, i.e. $site/nvidia: nothing may land
  # there, so that the host's libraries (or the override unpack.sh puts first) are the ones found.
  [ ! -e "$site/nvidia" ] || { echo "$site/nvidia exists: a CUDA wheel slipped into the site dir" >&2; exit 1; }
  echo "stripping what a Hopper GPU and a server never load from torch and triton..."
  t="$site/triton"
  rm -rf "$t/backends/nvidia/lib/cupti-blackwell" "$t/backends/nvidia/bin/ptxas-blackwell"  # sm_100+ only
  find "$t/backends/nvidia/lib" -name '*.a' -delete     # static archives, never loaded
  rm -f "$t/instrumentation/libGPUInstrumentationTestLib.so" "$site/torch/bin/protoc" "$site/torch/bin/protoc-"*
  if ls "$wheels"/cuda/*.whl >/dev/null 2>&1; then
    echo "installing the CUDA library overrides into cuda-0.33..."
    install "$work/cuda-0.33" "$wheels"/cuda/*.whl
    # Only the shared libraries are loaded; headers and device bitcode are for building NCCL kernels.
    find "$work/cuda-0.33" -depth \( -name include -o -name '*.bc' -o -name '*.a' -o -name '__pycache__' \) \
      -exec rm -rf {} +
  fi
  # Debug sections are never read at run time: libtriton.so carries 267 of its 506 MB, libnccl.so.2 48 MB,
  # deep_gemm's extension 27 of 29 MB.
  echo "stripping debug sections..."
  find "$site" "$work/cuda-0.33" -type f -name '*.so*' -size +1M 2>/dev/null | while read -r f; do
    if readelf -S "$f" 2>/dev/null | grep -q '\.debug_'; then strip --strip-debug "$f"; fi
  done
fi

echo "stripping parts a Hopper GPU never loads from vLLM..."
v="$site/vllm"
rm -f "$v/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$v/vllm-rs"   # FA2 (pre-Hopper), opt-in Rust frontend
find "$v/third_party" -type f \( -name '*.hpp' -o -name '*.h' -o -name '*.cuh' -o -name '*.cu' -o -name '*.cpp' \) -delete 2>/dev/null || true
rm -f "$v"/third_party/deep_gemm/_C.cpython-31[34]-*.so

rm -f "$out"/part* "$out"/core.part* "$out"/cuda.part* "$out"/app.part*
if [ "$release" = 0.33.0 ]; then
  # core: torch's family, which probe_torch.py needs; app: everything else in the same site dir.
  mkdir -p "$work/core/site-0.33"
  for p in torch torchgen functorch triton torchvision torchvision.libs; do
    if [ -e "$site/$p" ]; then mv "$site/$p" "$work/core/site-0.33/"; fi
  done
  mv "$site"/torch-*.dist-info "$site"/triton-*.dist-info "$site"/torchvision-*.dist-info "$work/core/site-0.33/"
  # The NCCL compatibility shim (nccl_compat.c): torch 2.14 on the host's NCCL, if the probe says it works.
  mkdir -p "$work/core/site-0.33/graphmode_compat"
  gcc -shared -fPIC -O2 -o "$work/core/site-0.33/graphmode_compat/libnccl_compat.so" "$here/nccl_compat.c"
fi
if [ "$no_xz" = 1 ]; then
  rm -rf "$out/stage"; mkdir -p "$out/stage"
  for d in site core cuda-0.33 site-0.33; do if [ -d "$work/$d" ]; then mv "$work/$d" "$out/stage/"; fi; done
  du -sm "$out"/stage/* | awk '{printf "%6d MiB uncompressed  %s\n", $1, $2}'
  exit 0
fi
if [ "$release" = 0.24.0 ]; then
  pack "" site
else
  (cd "$work/core" && tar -cf - site-0.33) | xz | split -b 60m -d - "$out/core.part"
  echo "compressed core ($(du -sh "$work/core" | cut -f1))"
  if [ -d "$work/cuda-0.33" ]; then pack cuda cuda-0.33; fi
  pack app site-0.33
fi
ls -la "$out"
echo "bundle for vLLM $release: $(cat "$out"/*part* | wc -c | awk '{printf "%.1f MiB", $1 / 1048576}') in $(ls "$out" | grep -c part) parts"
