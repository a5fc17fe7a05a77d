"""The CUDA Graph modes vLLM accepts in ``--compilation-config '{"cudagraph_mode": ...}'``."""

from __future__ import annotations

import json
from enum import StrEnum


class CudaGraphMode(StrEnum):
    NONE = "NONE"
    PIECEWISE = "PIECEWISE"
    FULL = "FULL"
    FULL_DECODE_ONLY = "FULL_DECODE_ONLY"
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"


ALL_MODES: tuple[CudaGraphMode, ...] = tuple(CudaGraphMode)
# vLLM's own default since V1 made FULL_AND_PIECEWISE the default for most models.
DEFAULT_MODE = CudaGraphMode.FULL_AND_PIECEWISE


def parse_mode(value: str) -> CudaGraphMode:
    """Accept any case and vLLM's enum spelling (``CUDAGraphMode.FULL``)."""
    key = value.strip().rsplit(".", 1)[-1].upper()
    try:
        return CudaGraphMode(key)
    except ValueError:
        allowed = ", ".join(m.value for m in CudaGraphMode)
        raise ValueError(f"unknown cudagraph_mode {value!r}; expected one of {allowed}") from None


def compilation_config(mode: CudaGraphMode, base: dict[str, object] | None = None) -> str:
    """The JSON for ``--compilation-config`` with *mode* set and every other key of *base* kept."""
    merged = dict(base or {})
    merged["cudagraph_mode"] = mode.value
    return json.dumps(merged, separators=(",", ":"))
