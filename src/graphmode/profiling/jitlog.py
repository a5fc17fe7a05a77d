"""Kernels vLLM JIT-compiled while it served: a measurement taken across one measures the compiler.

vLLM 0.33 watches Triton's compiler once the engine is up (``jit_monitor.py``) and warns when a kernel is
compiled during inference, e.g.::

    (EngineCore pid=2450) WARNING 12-03 13:13:38 [jit_monitor.py:140] Triton kernel JIT compilation during
    inference: fused_moe_kernel. This causes a latency spike; consider extending warmup to cover this ...

On the H200 (2026-12-03) every engine compiled ``_gumbel_sample_kernel`` in its first cell, and the MoE's
``fused_moe_kernel`` was compiled in the first prefill-heavy cell of each arm: FULL's ITL there read 1.90×
the default's where the other six rounds read 0.96–1.05×. vLLM warns once per kernel name, so later
compiles of the same kernel at other sizes pass silently: a warning marks the whole cell it falls in,
warm-up included (in that MoE cell the warning fell in FULL's warm-up and the measured ITL still read
30 ms against the default's 16), and only that cell, as the lower bound it is.

:func:`jit_kernels` reads the kernel names out of a log slice (the runner reads the bytes a cell's engine
wrote during the cell); :func:`jit_events` keeps each line's time stamp, for logs read after the fact.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["jit_events", "jit_kernels"]

# "WARNING 12-03 13:13:38 [jit_monitor.py:140] Triton kernel JIT compilation during inference: NAME."
_JIT: Final = re.compile(
    r"(?:(\d\d-\d\d \d\d:\d\d:\d\d)\s+\[[\w.\-]+\.py:\d+\]\s*)?"
    r"(?:Triton )?kernel JIT compilation during inference:\s*([A-Za-z_]\w*)",
    re.IGNORECASE,
)


def jit_events(text: str) -> list[tuple[str | None, str]]:
    """``(time stamp "MM-DD HH:MM:SS" or None, kernel)`` for every JIT warning in *text*, in order."""
    return [(m.group(1), m.group(2)) for m in _JIT.finditer(text)]


def jit_kernels(text: str) -> list[str]:
    """The kernels *text* says were JIT-compiled during inference, each once, in order of first mention."""
    return list(dict.fromkeys(kernel for _, kernel in jit_events(text)))
