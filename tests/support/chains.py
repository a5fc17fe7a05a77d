"""What the CPU runs of the GPU-host chains (bench/gpu/*_chain.sh) share: the fake vLLM they start and the
environment that points a chain at it instead of the host's site and vLLM."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
FAKE_VLLM = ROOT / "tests" / "support" / "fake_vllm.py"


def chain_env(tmp_path: Path, work: Path, out: Path, **extra: str) -> dict[str, str]:
    """A chain's environment on this machine: its work dir and $OUT, this interpreter, no site, the fake vLLM
    (steps 3x slower, so cells see batches) on a free port."""
    return {**os.environ, "GM_CHAIN_WORK": str(work), "GM_PYTHON": sys.executable,
            "GM_SITE": str(tmp_path / "no-site"), "GM_VLLM_CMD": shlex.join([sys.executable, str(FAKE_VLLM)]),
            "GM_CHAIN_PORT": str(free_port()), "RACE_TAG": "t", "OUT": str(out), "FAKE_VLLM_STEP_S": "3",
            "PYTHONPATH": "", **extra}
