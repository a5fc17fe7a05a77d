#!/usr/bin/env python3
"""Race verdicts of one model shape on two GPUs side by side: per arm and metric, the ratio to vLLM's default
over every round of each GPU's race with its 95% t interval and n, the verdict (α spent over the looks), and
whether the two GPUs agree (the same side of 1 and overlapping intervals). No GPU needed.

    .venv/bin/python bench/gpu_table.py \
        models/profiles/race-h200-vllm0.33-llama-3.2-1b.sqlite models/profiles/race-h100-vllm0.33-llama-3.2-1b.sqlite \
        models/profiles/race-h200-vllm0.33-qwen2.5-0.5b.sqlite models/profiles/race-h100-vllm0.33-qwen2.5-0.5b.sqlite

Datasets come in pairs (first GPU, second GPU) of one shape; the GPU names are the rows' own (NVML's).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
try:
    import graphmode  # noqa: F401
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(BENCH.parent / "src"))

from graphmode.core.dataset import ProfileStore  # noqa: E402
from graphmode.selector.verdicts import SPENDING_RULE, RaceVerdict, race_verdicts  # noqa: E402

ARMS = ("FULL", "FULL_DECODE_ONLY", "PIECEWISE", "NONE", "CONTROL")
METRICS = ("itl_p50", "ttft_p50")


def pooled(path: Path) -> tuple[str, dict[tuple[str, str], RaceVerdict]]:
    """The GPU name the rows recorded and the pooled verdict per (arm, metric) of one race dataset."""
    with ProfileStore(path, readonly=True) as store:
        rows = store.rows(status="ok")
    gpu = next((str(r.get("fp_gpu_name")) for r in rows if r.get("fp_gpu_name")), "?")
    out = {(v.mode, v.metric): v for v in race_verdicts(rows, SPENDING_RULE) if v.workload is None}
    return gpu, out


def cell(v: RaceVerdict | None) -> str:
    if v is None or v.ratio_all is None:
        return "-"
    ci = f" [{v.lo_all:.2f}–{v.hi_all:.2f}]" if v.lo_all is not None and v.hi_all is not None else ""
    return f"{v.ratio_all:.2f}×{ci} n={v.rounds_all} ({v.verdict})"


def agree(a: RaceVerdict | None, b: RaceVerdict | None) -> str:
    if a is None or b is None or a.ratio_all is None or b.ratio_all is None:
        return "-"
    if None in (a.lo_all, a.hi_all, b.lo_all, b.hi_all):
        return "?"
    overlap = a.lo_all <= b.hi_all and b.lo_all <= a.hi_all  # type: ignore[operator]
    same_side = (a.ratio_all - 1) * (b.ratio_all - 1) > 0
    return "agree" if overlap and same_side else ("intervals overlap" if overlap else "differ")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("datasets", nargs="+", type=Path, help="pairs: first GPU's race, second GPU's race (one shape)")
    args = ap.parse_args(argv)
    if len(args.datasets) % 2:
        ap.error("datasets come in pairs")
    print("| shape | arm | metric | GPU A | GPU B | across GPUs |\n|---|---|---|---|---|---|")
    for a_path, b_path in zip(args.datasets[::2], args.datasets[1::2], strict=True):
        gpu_a, va = pooled(a_path)
        gpu_b, vb = pooled(b_path)
        m = re.match(r".*?vllm[0-9.]+-(.+)$", a_path.stem)
        shape = m.group(1) if m else a_path.stem
        for arm in ARMS:
            for m in METRICS:
                a, b = va.get((arm, m)), vb.get((arm, m))
                if a is None and b is None:
                    continue
                print(f"| {shape} | {'A/A' if arm == 'CONTROL' else arm} | {m} | {gpu_a}: {cell(a)} | "
                      f"{gpu_b}: {cell(b)} | {agree(a, b)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
