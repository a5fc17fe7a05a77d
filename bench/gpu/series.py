#!/usr/bin/env python3
"""Issue 17, step 1, the time pattern: does latency inside one long engine start follow the clock?

Design (one GPU, one model shape, vLLM's default mode FULL_AND_PIECEWISE on every engine)
    Two engines, A (slot 0) and B (slot 1), resident side by side, each on its own port with its own compile
    caches (``VLLM_CACHE_ROOT``, ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``, empty at first) and
    ``--kv-cache-memory-bytes`` (so neither one's memory profiling counts its neighbour). Both start once
    on cold caches and are stopped as soon as they are healthy (the compile start, as the race's
    ``warm_compile`` does), then start again: both measured starts are warm.

    Then, for ``--series-min`` minutes, loops of the same cells as bench/gpu/start_effect.py (``c1`` then
    ``c8``) on both engines, in the order A B, B A, A B, ... (ABBA: a linear drift inside a loop biases
    neither engine's side of a pair). A loop's prompts are seeded by the loop number and are the same on A
    and B (start_effect.py's rounds do the same): fresh token ids every loop, so no cell finds its prompts in
    the prefix cache of an earlier one (the seed steps by 2: c1's warm-up request draws from seed + 1).

Why two engines: if latency follows the clock (host or GPU state that changes over minutes), A's and B's
per-minute means move together; if it is fixed per start, they do not, and A/B is a constant ratio: the
distance between two warm starts of one mode (what the race's A/A arm estimates).
bench/start_effect_stats.py --series analyses the result.

usage (GPU host, vLLM importable): python3 bench/gpu/series.py --model DIR --out DIR
    [--series-min 20] [--kv 8G] [--port 8400] [--vllm-cmd "python3 -m vllm.entrypoints.openai.api_server"]
Writes OUT/cells.jsonl (one line per cell: loop, engine, slot, cell, ``t`` (epoch s at the cell's start),
``elapsed_s`` since the first measured cell, the latencies, NVML SM clock/power/temperature over the cell,
host CPU MHz), OUT/starts.jsonl (one per engine start; ``start_no`` 1 is the compile start) and
OUT/logs/slot-N.log; every line is flushed as it is measured, so a lease that ends early leaves what was
measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from start_effect import CELLS, Slot, measure, start

ENGINES = ("A", "B")


def order(loop: int) -> tuple[int, ...]:
    """Slots in the order of *loop*: A B, then B A, and so on."""
    return (0, 1) if loop % 2 == 0 else (1, 0)


def run_series(slots: list[Slot], args: argparse.Namespace) -> int:
    """Loops of every cell on every live engine until ``series_min`` minutes have passed; the loop count."""
    t0 = time.time()
    loop = 0
    while time.time() - t0 < args.series_min * 60:
        for s in slots:
            if s.server is not None and not s.server.alive():
                print(f"engine {s.arm} died: {s.server.log_tail(5)}", flush=True)
                s.server.stop()
                s.server = None
        live = [slots[i] for i in order(loop) if slots[i].server is not None]
        if not live:
            print("no engine left", flush=True)
            break
        for pos, s in enumerate(live):
            for cell in CELLS:
                try:
                    row = measure(s, cell, args.seed * 1000 + 2 * loop, args.vocab)
                except Exception as exc:  # one failed cell is a row, not the end of the series
                    row = {"t": round(time.time(), 3), "error": f"{type(exc).__name__}: {exc}"[:500]}
                row = {"loop": loop, "pos": pos, "engine": s.arm, "slot": s.index, "start_no": s.start_no,
                       "cell": cell.name, "elapsed_s": round(float(row["t"]) - t0, 3), **row}  # type: ignore[arg-type]
                with (args.out / "cells.jsonl").open("a") as f:
                    f.write(json.dumps(row) + "\n")
        loop += 1
        if loop % 10 == 0:
            print(f"{time.strftime('%H:%M:%S')} loop {loop} done, {(time.time() - t0) / 60:.1f} min", flush=True)
    return loop


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--series-min", type=float, default=20.0)
    ap.add_argument("--kv", default="8G")
    ap.add_argument("--port", type=int, default=8400)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--no-compile-start", dest="compile_start", action="store_false",
                    help="measure the first (cold) starts; default: a compile start first, so both are warm")
    ap.add_argument("--vllm-cmd", default="python3 -m vllm.entrypoints.openai.api_server")
    args = ap.parse_args()
    if not args.series_min > 0:
        ap.error("--series-min must be positive")
    args.out.mkdir(parents=True, exist_ok=True)
    slots = [Slot(i, name, None, [], args.port + i) for i, name in enumerate(ENGINES)]
    loops = 0
    try:
        if args.compile_start:
            start(slots, args, 0, args.out)
        start(slots, args, 1, args.out)
        if any(s.server is None for s in slots):
            print(f"failed to start: {[s.arm for s in slots if s.server is None]}", flush=True)
        loops = run_series(slots, args)
    finally:
        for s in slots:
            if s.server is not None:
                s.server.stop()
    print(f"experiment finished: {loops} loops", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
