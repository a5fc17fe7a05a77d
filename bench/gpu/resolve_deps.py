#!/usr/bin/env python3
"""Download the wheels that one vLLM release needs on the GPU host and that the host lacks.

Walks vLLM's Requires-Dist tree for CPython 3.12 on x86-64 Linux. A package the host already has
(host-packages.txt) is skipped when its version there satisfies the requirement, or is unknown and the
release does not list it under ``raised``; the heavy optional kernel libraries that a dense bf16 model on
Hopper never imports (SKIP) are left out. What is left goes to WHEEL_DIR/site (installed into the release's
site directory). CUDA libraries (nvidia-*, cuda-toolkit) are never put there: where the host's version does
not match a pin, the mismatch is reported, and the wheel goes to WHEEL_DIR/cuda only when asked for with
--cuda (or by the release's default), to be put on LD_LIBRARY_PATH by unpack.sh --cuda-override.

usage: resolve_deps.py WHEEL_DIR [--vllm 0.24.0|0.33.0] [--cuda NAME]... [--no-default-cuda]
                       [--host-freeze FILE] [extra specs...]
--host-freeze: a `pip list --format=freeze` (or NAME==VERSION lines) taken on the host, e.g. by
probe_torch.py; its versions take the place of host-packages.txt's and of the `raised` guesses.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

HERE = os.path.dirname(os.path.abspath(__file__))
MARKER_ENV = {
    "python_version": "3.12", "python_full_version": "3.12.3", "platform_machine": "x86_64",
    "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
    "implementation_name": "cpython", "platform_python_implementation": "CPython",
}
# Optional kernel stacks and CLI extras: hundreds of MB, not imported for a dense model. torch's family is
# here because the host's serves 0.24; a release that needs its own lists it under `bring`.
SKIP = {
    "torch", "torchaudio", "torchvision", "triton", "flashinfer-cubin", "tokenspeed-mla",
    "tokenspeed-triton", "nvidia-nvvm", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base",
    "nvidia-cutlass-dsl-libs-cu13", "nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-cuda-cccl",
    "tilelang", "z3-solver", "cuda-tile", "quack-kernels", "humming-kernels",
    "nvidia-cudnn-frontend", "sentry-sdk", "fastapi-cloud-cli", "rignore", "fastar",
}
# The meta package whose extras pin the CUDA toolkit's component wheels.
CUDA_META = "cuda-toolkit"


@dataclass(frozen=True)
class Release:
    """What one vLLM release needs beyond the host's packages."""

    # Host packages this release replaces with its own (torch's ABI moves with the release).
    bring: frozenset[str] = frozenset()
    # Exact specs used instead of what the tree asks for.
    pins: dict[str, str] = field(default_factory=dict)
    # Host packages of unknown version whose lower bound this release raised over 0.24.0 (the release
    # proven on the host): brought, since the host's may be older, unless --host-freeze says otherwise.
    raised: frozenset[str] = frozenset()
    # CUDA libraries carried by default because the host's cannot serve this release's torch.
    cuda: frozenset[str] = frozenset()
    # More optional packages to leave out, beyond SKIP.
    skip: frozenset[str] = frozenset()


RELEASES = {
    # vLLM 0.24.0 pins apache-tvm-ffi==0.1.9; newer xgrammar releases need a newer one.
    "0.24.0": Release(pins={"xgrammar": "xgrammar==0.2.5.post1"}),
    "0.33.0": Release(
        bring=frozenset({"torch", "triton", "torchvision"}),
        raised=frozenset({
            "transformers", "tokenizers", "huggingface-hub", "pillow", "aiohttp", "multidict", "requests",
            "certifi", "filelock", "setuptools",
        }),
        # torch 2.14.0's libtorch_cuda.so needs 11 functions that NCCL 2.28.9 lacks (ncclCommGrow,
        # ncclCommSuspend, ncclSignal, ...): `import torch` fails with "undefined symbol" on the host's.
        # cudnn, cusparselt and cublas: every symbol torch 2.14.0 needs is in the host's versions.
        cuda=frozenset({"nvidia-nccl-cu13"}),
        # Video decoding and another weight loader, imported only for video models or when asked for;
        # flashinfer-python asks for NCCL's Python bindings (25 MB) but none of its modules imports them.
        skip=frozenset({"torchcodec", "pynvvideocodec", "instanttensor", "nccl4py", "nccl-extensions"}),
    ),
}
# The host runs glibc 2.39 (Ubuntu 24.04); build_bundle.sh installs with the same list.
PLATFORMS = [f"--platform=manylinux_2_{n}_x86_64" for n in range(5, 40)] + [
    "--platform=manylinux2014_x86_64", "--platform=manylinux2010_x86_64", "--platform=manylinux1_x86_64"]


def is_cuda_lib(name: str) -> bool:
    return name.startswith("nvidia-") or name == CUDA_META


def read_versions(path: str) -> dict[str, str | None]:
    """NAME or NAME==VERSION lines (comments and blank lines ignored) → {canonical name: version or None}."""
    versions: dict[str, str | None] = {}
    with open(path) as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            name, _, version = line.partition("==")
            versions[canonicalize_name(name.strip())] = version.strip().split("+", 1)[0] or None
    return versions


def download(spec: str, dest: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version=3.12", "--implementation=cp", *PLATFORMS, "-d", dest, spec]
    done = subprocess.run(cmd, capture_output=True, text=True)
    # pip warns once per package about this machine's unused local index folders; keep only what matters.
    noise = ("is ignored: it is neither a file nor a directory", "Running pip as the 'root' user")
    for line in done.stderr.splitlines():
        if not any(n in line for n in noise):
            print(line, file=sys.stderr)
    done.check_returncode()


def wheel_version(wheel: str) -> str:
    return os.path.basename(wheel).split("-")[1]


def wheel_of(name: str, dest: str) -> str:
    for wheel in glob.glob(os.path.join(dest, "*.whl")):
        if canonicalize_name(os.path.basename(wheel).split("-")[0]) == name:
            return wheel
    raise FileNotFoundError(f"no wheel for {name} in {dest}")


def requirements_of(wheel: str, extras: set[str]) -> Iterator[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or any(req.marker.evaluate({**MARKER_ENV, "extra": e})
                                     for e in (sorted(extras) or [""])):
            yield req


def satisfied(req: Requirement, version: str) -> bool:
    try:
        return req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def host_verdict(req: Requirement, host: dict[str, str | None], release: Release) -> str | None:
    """Why the host's copy serves ``req`` (skip it), or None when the release must bring its own."""
    name = canonicalize_name(req.name)
    if name in release.bring or name not in host:
        return None
    version = host[name]
    if version is None:
        return None if name in release.raised and req.specifier else "on the host"
    return f"host has {version}" if satisfied(req, version) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("wheel_dir")
    parser.add_argument("extra", nargs="*", help="more wheel specs for the site dir (the profiler's own needs)")
    parser.add_argument("--vllm", default="0.24.0", choices=sorted(RELEASES))
    parser.add_argument("--cuda", action="append", default=[], help="carry this CUDA library (repeatable)")
    parser.add_argument("--no-default-cuda", action="store_true", help="carry no CUDA library unless --cuda")
    parser.add_argument("--host-freeze", help="NAME==VERSION lines from the host (overrides host-packages.txt)")
    args = parser.parse_intermixed_args()  # extra specs may follow the options

    release = RELEASES[args.vllm]
    host = read_versions(os.path.join(HERE, "host-packages.txt"))
    if args.host_freeze:
        host.update(read_versions(args.host_freeze))
        release = Release(bring=release.bring, pins=release.pins, cuda=release.cuda, skip=release.skip)
    carry = {canonicalize_name(n) for n in args.cuda} | (set() if args.no_default_cuda else set(release.cuda))
    skip = {canonicalize_name(s) for s in SKIP | release.skip} - release.bring
    site_dir = os.path.join(args.wheel_dir, "site")
    cuda_dir = os.path.join(args.wheel_dir, "cuda")
    meta_dir = tempfile.mkdtemp(prefix="cuda-meta-")
    os.makedirs(site_dir, exist_ok=True)

    root = Requirement(f"vllm=={args.vllm}")
    queue = [root, *(Requirement(spec) for spec in args.extra)]
    wanted: dict[str, SpecifierSet] = {}  # what every requirement met so far asks of each package
    while queue:
        req = queue.pop(0)
        name = canonicalize_name(req.name)
        if name in wanted:
            # A later, stricter requirement (xgrammar asks for any triton, torch for ~=3.8.0): fetch again.
            wanted[name] &= req.specifier
            if name in release.pins or not os.path.isdir(site_dir):
                continue
            try:
                have = wheel_of(name, site_dir)
            except FileNotFoundError:
                continue
            if wanted[name].contains(Version(wheel_version(have)), prereleases=True):
                continue
            os.remove(have)
            download(f"{name}{wanted[name]}", site_dir)
            print(f"   {name}{wanted[name]} (again, for {req})", flush=True)
            continue
        wanted[name] = req.specifier
        if name in skip and req is not root:
            continue
        spec = release.pins.get(name, str(req).split(";")[0])
        if is_cuda_lib(name):
            verdict = host_verdict(req, host, release)
            if verdict is not None:
                continue
            if name == CUDA_META:  # walk its extras to the component wheels
                download(spec, meta_dir)
                queue.extend(requirements_of(wheel_of(name, meta_dir), set(req.extras)))
                continue
            print(f"   CUDA {spec}: host has {host.get(name) or 'none'}", end="", flush=True)
            if name in carry:
                os.makedirs(cuda_dir, exist_ok=True)
                download(spec, cuda_dir)
                print(" -> carried (cuda/)", flush=True)
            else:
                print(" -> host's kept", flush=True)
            continue
        if req is not root and host_verdict(req, host, release) is not None:
            continue
        download(spec, site_dir)
        queue.extend(requirements_of(wheel_of(name, site_dir), set(req.extras)))
        why = ""
        if name in release.bring:
            why = f" (instead of the host's {host.get(name) or 'copy'})"
        elif name in host:
            why = " (the host's may be older)"
        print(f"   {spec}{why}", flush=True)


if __name__ == "__main__":
    main()
