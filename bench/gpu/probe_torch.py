#!/usr/bin/env python3
"""Does the bundle's torch run on the GPU host's CUDA libraries? Answer it before vLLM travels.

Runs one child Python per library setup (the host's own libraries; those plus the NCCL compatibility
shim on LD_PRELOAD; the carried overrides on LD_LIBRARY_PATH, when unpacked) and in each checks, step by
step so that one failure does not hide the rest: ``import torch``, ``torch.cuda.is_available()``,
``torch.backends.cudnn.version()`` (also with PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1, since torch
refuses an older cuDNN minor than it was built with), ``torch.cuda.nccl.version()``, a bf16 matmul, an
fp16 conv2d (cuDNN), and a one-rank NCCL all-reduce (what a single-GPU vLLM engine does with NCCL).
Also writes the host's installed distributions (NAME==VERSION) for resolve_deps.py --host-freeze, and
whether the host has nvcc (FlashInfer's JIT needs it) and which driver.

usage (on the host): python3 probe_torch.py SITE_DIR [--cuda-dir DIR] [--shim FILE] [--out DIR]
  SITE_DIR: the unpacked site directory holding torch (/tmp/site-0.33)
Prints one JSON line per setup and a verdict; writes OUT/probe.json and OUT/host-freeze.txt.
Exit status 0 when some setup passes every step vLLM needs (import, CUDA, matmul, NCCL).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata

# The child: each step prints one JSON object; a failure is recorded and the next step still runs.
CHILD = r"""
import json, os, sys, traceback
def step(name, fn):
    try:
        value = fn()
        print(json.dumps({"step": name, "ok": True, "value": value}), flush=True)
        return True
    except BaseException as e:
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        print(json.dumps({"step": name, "ok": False, "error": last[:400]}), flush=True)
        return False
if not step("import", lambda: __import__("torch").__version__ + " from " + __import__("torch").__file__):
    sys.exit(0)
import torch
def libs():
    # torch.cuda.nccl.version() answers the NCCL torch was built with; what runs is what got loaded.
    import ctypes, re
    maps = open("/proc/self/maps").read()
    names = "nccl|cudnn|cusparseLt|cublasLt|nvshmem_host|cudart|nccl_compat"
    loaded = sorted(set(re.findall(r"\s(/\S*/lib(?:" + names + r")\S*)", maps)))
    v = ctypes.c_int()
    ctypes.CDLL("libnccl.so.2").ncclGetVersion(ctypes.byref(v))
    return {"nccl_runtime": v.value, "loaded": loaded}
step("libs", libs)
step("cuda", lambda: [torch.cuda.is_available(), torch.version.cuda, torch.cuda.get_device_name(0)])
step("cudnn", lambda: torch.backends.cudnn.version())
def cudnn_skip_check():
    os.environ["PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK"] = "1"
    import torch.backends.cudnn as c
    c.__cudnn_version = None
    return [c.version(), list(torch._C._cudnn.getCompileVersion()), list(torch._C._cudnn.getRuntimeVersion())]
step("cudnn_skip_check", cudnn_skip_check)
step("nccl", lambda: list(torch.cuda.nccl.version()))
def matmul():
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    return float((a @ a).float().abs().sum().item())
step("matmul", matmul)
def conv():
    x = torch.randn(2, 8, 32, 32, device="cuda", dtype=torch.float16)
    w = torch.randn(16, 8, 3, 3, device="cuda", dtype=torch.float16)
    return list(torch.nn.functional.conv2d(x, w).shape)
step("conv", conv)
def allreduce():
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    return t.tolist()
step("nccl_allreduce", allreduce)
def triton_kernel():
    import triton, triton.language as tl
    @triton.jit
    def add(x, y, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + i, tl.load(x + i, mask=i < n) + 1, mask=i < n)
    x = torch.zeros(100, device="cuda")
    y = torch.empty_like(x)
    add[(1,)](x, y, 100, BLOCK=128)
    return [triton.__version__, float(y.sum().item())]
step("triton", triton_kernel)
"""
NEEDED = ("import", "cuda", "matmul", "nccl_allreduce")


def lib_dirs(root: str) -> list[str]:
    return sorted(os.path.dirname(p) for p in glob.glob(os.path.join(root, "nvidia", "*", "lib", "*.so*")))


def run_setup(name: str, site: str, env_extra: dict[str, str], child: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": site, **env_extra}  # env_extra may put more on PYTHONPATH
    env.pop("PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK", None)
    try:
        done = subprocess.run([sys.executable, child], env=env, capture_output=True, text=True, timeout=300)
        out, err, code = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as e:
        out, err, code = str(e.stdout or ""), "timed out after 300 s", -1
    steps: dict[str, object] = {}
    for line in out.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        steps[record.pop("step")] = record
    passed = all(isinstance(steps.get(s), dict) and steps[s].get("ok") for s in NEEDED)  # type: ignore[union-attr]
    result = {"setup": name, "env": env_extra, "passed": passed, "exit": code, "steps": steps,
              "stderr_tail": err[-1500:]}
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("site")
    parser.add_argument("--cuda-dir", default="", help="unpacked CUDA overrides (/tmp/cuda-0.33)")
    parser.add_argument("--shim", default="", help="libnccl_compat.so to try on LD_PRELOAD")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()

    setups: list[tuple[str, dict[str, str]]] = [("host", {})]
    if args.shim and os.path.exists(args.shim):
        setups.append(("host+nccl_shim", {"LD_PRELOAD": args.shim}))
    overrides = lib_dirs(args.cuda_dir) if args.cuda_dir else []
    if overrides:
        path = ":".join([*overrides, os.environ.get("LD_LIBRARY_PATH", "")]).rstrip(":")
        # torch preloads CUDA libraries from sys.path (nvidia/*/lib) before the loader reads LD_LIBRARY_PATH.
        setups.append(("cuda_override", {"LD_LIBRARY_PATH": path, "PYTHONPATH": f"{args.site}:{args.cuda_dir}"}))
    os.makedirs(args.out, exist_ok=True)
    # FlashInfer compiles kernels it has no cubin for with nvcc: is there one on this host?
    nvcc = shutil.which("nvcc") or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/nvcc"))), None)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False) if shutil.which("nvidia-smi") else None
    host = {"python": sys.version.split()[0], "glibc": " ".join(platform.libc_ver()), "nvcc": nvcc,
            "gpu": smi.stdout.strip() if smi else None}
    print(json.dumps({"host": host}), flush=True)
    child = os.path.join(args.out, "probe_child.py")  # a file: triton.jit reads its kernel's source
    with open(child, "w") as f:
        f.write(CHILD)
    results = [run_setup(name, args.site, extra, child) for name, extra in setups]

    freeze = sorted({f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions() if d.metadata["Name"]},
                    key=str.lower)
    with open(os.path.join(args.out, "host-freeze.txt"), "w") as f:
        f.write("\n".join(freeze) + "\n")
    with open(os.path.join(args.out, "probe.json"), "w") as f:
        json.dump({"host": host, "setups": results}, f, indent=1)
    good = [r["setup"] for r in results if r["passed"]]
    print(f"verdict: {'use ' + str(good[0]) if good else 'no setup runs torch here'} (passing: {good})")
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
