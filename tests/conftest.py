"""Shared test setup: markers for tests that need a GPU or a real vLLM."""

from __future__ import annotations

import os
import shutil

import pytest


def _has_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return bool(n)
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu = _has_gpu()
    vllm_python = os.environ.get("GRAPHMODE_TEST_VLLM_PYTHON")
    vllm_ok = bool(vllm_python) and (os.path.isfile(vllm_python) or shutil.which(vllm_python) is not None)
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU"))
        if "vllm" in item.keywords and not vllm_ok:
            item.add_marker(pytest.mark.skip(
                reason="needs a real vLLM: set GRAPHMODE_TEST_VLLM_PYTHON to its interpreter (.ci/run does)"))
