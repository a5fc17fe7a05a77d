"""Do a race's resident engines fit the GPU? Checked before any engine starts.

A race keeps every arm's engine (× ``replicas``) resident on one GPU. When they do not fit, the last
engines to allocate fail at start-up with CUDA out-of-memory or a negative KV cache, minutes into the GPU
time: a clear refusal up front, naming how many would fit, costs nothing. The estimate per engine is the
weights (parameters from config.json × bytes per parameter: 1 for FP8 checkpoints or ``--quantization
fp8``, else 2), the KV cache the race gives each engine (``--kv-cache-memory-bytes``), and an overhead
for the CUDA context, activations and graphs: 4 GiB. Measured per engine by NVML in race cells on the H200
(``engine_gpu_gib`` less weights and KV cache, vLLM 0.33): 1.69 GiB (Llama-3.2-1B, twelve engines
resident), 1.99 (Llama-3.1-8B, 1024-size list), 1.93 (8B FP8); twice that covers the start-up peak, when
engines that start side by side run their dummy forward at the full token budget together. A larger
overhead refuses races that fit: 6 GiB would refuse twelve 1B engines at 4 GiB of KV each (148 GiB against
140) that use ~105. With ``--gpu-memory-utilization`` shares instead, the shares must add up to at most 1.
Without a GPU (no NVML) or without a readable config.json there is nothing to check.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from graphmode.core.errors import ConfigError
from graphmode.core.fingerprint import estimate_params

ENGINE_OVERHEAD_GIB = 4.0
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B?)?\s*$", re.IGNORECASE)


def size_gib(text: str) -> float | None:
    """``8G``, ``4096M``, ``16GiB`` or a byte count → GiB (vLLM reads K/M/G/T as binary units here)."""
    m = _SIZE.match(str(text))
    if not m:
        return None
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2).upper()]
    value = float(m.group(1)) * scale / 2**30
    return value if math.isfinite(value) and value > 0 else None


def _arg(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _config(model: str | None) -> dict[str, Any] | None:
    if not model:
        return None
    path = Path(model)
    path = path if path.is_file() else path / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # a hub id or an unreadable file: vLLM will say what is wrong with it
    return cfg if isinstance(cfg, dict) else None


def weights_gib(cfg: dict[str, Any], quantization: str | None) -> float | None:
    params = estimate_params(cfg)
    if params is None:
        return None
    quant = quantization or str((cfg.get("quantization_config") or {}).get("quant_method") or "")
    per_param = 1.0 if quant.lower().startswith("fp8") else 2.0
    return params * 1e9 * per_param / 2**30


def fit_problem(engines: int, vllm_args: Sequence[str], gpu_gib: float | None, kv_cache_memory_bytes: str | None,
                gpu_memory_utilization: float | None, what: str) -> str | None:
    """Why *engines* engines of the model in *vllm_args* do not fit a GPU of *gpu_gib*, or None (they fit, or
    nothing is known to check). *what* says what to cut ("fewer modes or fewer replicas")."""
    if gpu_gib is None or engines < 1:
        return None
    if kv_cache_memory_bytes is None:
        if gpu_memory_utilization is not None and engines * gpu_memory_utilization > 1.0 + 1e-9:
            return (f"{engines} engines × --gpu-memory-utilization {gpu_memory_utilization:g} = "
                    f"{engines * gpu_memory_utilization:.2f} of the GPU; race {what}")
        return None
    kv = size_gib(kv_cache_memory_bytes)
    cfg = _config(_arg(vllm_args, "--model"))
    w = weights_gib(cfg, _arg(vllm_args, "--quantization")) if cfg is not None else None
    if kv is None or w is None:
        return None
    per_engine = w + kv + ENGINE_OVERHEAD_GIB
    total = per_engine * engines
    if total <= gpu_gib:
        return None
    fit = int(gpu_gib // per_engine)
    # the largest whole GiB of KV cache with which all of them fit, named so that a refused race is not
    # retried on a guess (on the H200, 4G per engine was refused and a guessed 3G was retried)
    kv_max = math.floor(gpu_gib / engines - w - ENGINE_OVERHEAD_GIB)
    less = (f"or give each engine at most {kv_max}G of KV cache (--kv-cache-memory-bytes)" if kv_max >= 1
            else "and the weights alone leave no GiB of KV cache for that many")
    return (f"{engines} engines × {per_engine:.1f} GiB (weights {w:.1f} + KV {kv:g} + overhead "
            f"{ENGINE_OVERHEAD_GIB:g}) = {total:.0f} GiB, more than the GPU's {gpu_gib:.0f} GiB; {fit} fit: "
            f"race {what}, {less}")


def check_fit(engines: int, vllm_args: Sequence[str], gpu_gib: float | None, kv_cache_memory_bytes: str | None,
              gpu_memory_utilization: float | None, what: str = "fewer modes or fewer replicas") -> None:
    problem = fit_problem(engines, vllm_args, gpu_gib, kv_cache_memory_bytes, gpu_memory_utilization, what)
    if problem is not None:
        raise ConfigError(f"the race's engines do not fit the GPU: {problem}")


__all__ = ["ENGINE_OVERHEAD_GIB", "check_fit", "fit_problem", "size_gib", "weights_gib"]
