#!/usr/bin/env python3
"""Issue 17, step 1: does latency move with the engine start or with the clock, and does pinning, a warm
compile cache or synchronous scheduling take the spread away?

Design (one GPU, one model shape, vLLM's default mode on every engine)
    Six engines resident side by side (``--kv-cache-memory-bytes`` each), two slots per arm:

    * ``base``: unpinned, async scheduling on (vLLM 0.24's default);
    * ``pinned``: the whole process tree (API server and engine core) on two cores of its own (taskset);
    * ``sync``: ``--no-async-scheduling``.

    Every slot has its own compile caches (``VLLM_CACHE_ROOT``, ``TORCHINDUCTOR_CACHE_DIR``), empty at the
    first start. Rounds: the same two cells on every live engine, in an order shuffled per round (seeded).
    Restart waves at round boundaries:

    * wave 0: all six start together, cold; a block of ``rounds[0]`` rounds;
    * wave 1: slots 0, 2, 4 restart (warm caches); ``rounds[1]`` rounds;
    * wave 2: slots 1, 3, 5 restart (warm caches); ``rounds[2]`` rounds.

    So every round has engines whose start also spans a neighbouring block: round effects (the clock,
    common to every engine) and start effects (constant within a start) are separable in one additive fit
    (bench/start_effect_stats.py): 12 starts, 4 per arm, 6 cold and 6 warm (paired by slot).

Cells (closed loop, token-id prompts, ``ignore_eos``, fixed lengths):

* ``c1``: one warm-up request, then 6 requests one after the other, 64-token prompts, 128 tokens out
  (concurrency 1: the probe's most start-sensitive cell);
* ``c8``: 24 requests at concurrency 8, 256-token prompts, 128 tokens out (a decode batch of 8).

Between cells the GPU's SM clock, power and temperature are sampled (NVML), with the host's mean CPU MHz and
the engine tree's CPUs.

usage (GPU host, vLLM importable): python3 bench/gpu/start_effect.py --model DIR --out DIR
    [--kv 4G] [--rounds 8,6,6] [--vllm-cmd "python3 -m vllm.entrypoints.openai.api_server"]
Writes OUT/cells.jsonl (one line per cell), OUT/starts.jsonl (one per engine start, with vLLM's start-up
facts) and OUT/logs/slot-N.log; every line is flushed as it is measured, so a lease that ends early leaves
what was measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from graphmode.core.modes import DEFAULT_MODE
from graphmode.profiling.arrivals import PlannedRequest
from graphmode.profiling.engine import VllmServer
from graphmode.profiling.gpu import MemorySampler
from graphmode.profiling.loadgen import run_load
from graphmode.profiling.placement import process_tree


@dataclass
class Slot:
    index: int
    arm: str
    cpus: str | None
    extra: list[str]
    port: int
    start_no: int = 0
    server: VllmServer | None = None
    start_info: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Cell:
    name: str
    requests: int
    concurrency: int
    input_tokens: int
    output_tokens: int
    warmup: int


CELLS = (Cell("c1", 6, 1, 64, 128, 1), Cell("c8", 24, 8, 256, 128, 0))


def host_mhz() -> float | None:
    try:
        values = [float(line.split(":")[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("cpu MHz")]
    except (OSError, ValueError, IndexError):
        return None
    return round(statistics.fmean(values), 1) if values else None


def plans(cell: Cell, seed: int, vocab: int) -> list[PlannedRequest]:
    rng = random.Random(seed)
    return [PlannedRequest(at_s=0.0, prompt=[rng.randrange(1, vocab) for _ in range(cell.input_tokens)],
                           max_tokens=cell.output_tokens) for _ in range(cell.requests)]


def measure(slot: Slot, cell: Cell, seed: int, vocab: int) -> dict[str, object]:
    assert slot.server is not None
    model = slot.server.served_model_name() or ""
    if cell.warmup:
        asyncio.run(run_load(slot.server.base_url, model, plans(Cell("w", cell.warmup, 1, cell.input_tokens,
                                                                     cell.output_tokens, 0), seed + 1, vocab),
                             max_concurrency=1, deadline_s=60))
    sampler = MemorySampler(interval_s=0.25).start()
    t0 = time.time()
    try:
        results = asyncio.run(run_load(slot.server.base_url, model, plans(cell, seed, vocab),
                                       max_concurrency=cell.concurrency, deadline_s=120))
    finally:
        sampler.stop()
    ok = [r for r in results if r.ok]
    itls = [g for r in ok for g in r.itls]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    e2es = [r.e2e for r in ok if r.e2e is not None]
    cpus = sorted(set(process_tree(slot.server.pid).values())) if slot.server.pid else []
    return {
        "t": round(t0, 3), "wall_s": round(time.time() - t0, 3), "n_ok": len(ok), "n": len(results),
        "error": next((r.error for r in results if not r.ok), None),
        "itl_p50_ms": round(statistics.median(itls) * 1e3, 4) if itls else None,
        "itl_mean_ms": round(statistics.fmean(itls) * 1e3, 4) if itls else None,
        "ttft_p50_ms": round(statistics.median(ttfts) * 1e3, 3) if ttfts else None,
        "e2e_mean_ms": round(statistics.fmean(e2es) * 1e3, 2) if e2es else None,
        "engine_cpus": ",".join(map(str, cpus)), "host_mhz": host_mhz(),
        **sampler.conditions(),
    }


def start(slots: list[Slot], args: argparse.Namespace, wave: int, out: Path) -> None:
    """Start *slots* overlapped; each gets one line in starts.jsonl (failed or not)."""
    for s in slots:
        if s.server is not None:
            s.server.stop()
            s.server = None
    t0 = time.monotonic()
    servers: list[tuple[Slot, VllmServer]] = []
    for s in slots:
        s.start_no += 1
        cache = out / "cache" / f"slot-{s.index}"
        env = {"VLLM_CACHE_ROOT": str(cache / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
               "TRITON_CACHE_DIR": str(cache / "triton")}
        command = shlex.split(args.vllm_cmd)
        if s.cpus:
            command = ["taskset", "-c", s.cpus, *command]
        vllm_args = ["--model", args.model, "--load-format", "dummy", "--skip-tokenizer-init",
                     "--max-model-len", "4096", "--kv-cache-memory-bytes", args.kv,
                     "--gpu-memory-utilization", "0.05", *s.extra]
        server = VllmServer(command, vllm_args, mode=DEFAULT_MODE, port=s.port,
                            log_path=out / "logs" / f"slot-{s.index}.log", env=env, startup_timeout_s=900)
        servers.append((s, server))
    errors: dict[int, str] = {}

    def one(s: Slot, server: VllmServer) -> None:
        try:
            info = server.start()
        except Exception as exc:  # a failed start is data: record it and go on with the others
            errors[s.index] = f"{type(exc).__name__}: {exc}"[:2000]
            return
        s.server = server
        s.start_info = info.model_dump()

    threads = [threading.Thread(target=one, args=pair) for pair in servers]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    with (out / "starts.jsonl").open("a") as f:
        for s, _ in servers:
            f.write(json.dumps({"slot": s.index, "arm": s.arm, "start_no": s.start_no, "wave": wave,
                                "cold": s.start_no == 1, "ok": s.index not in errors,
                                "error": errors.get(s.index), "wall_s": round(time.monotonic() - t0, 1),
                                **{k: v for k, v in s.start_info.items() if k in (
                                    "startup_s", "vllm_version", "compile_s", "capture_s", "graph_gib",
                                    "kv_cache_tokens", "model_runner", "attention_backend", "effective_mode")}})
                    + "\n")
    print(f"{time.strftime('%H:%M:%S')} wave {wave}: started {[s.index for s, _ in servers]} in "
          f"{time.monotonic() - t0:.0f} s, failed {sorted(errors)}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--kv", default="4G")
    ap.add_argument("--rounds", default="8,6,6")
    ap.add_argument("--port", type=int, default=8300)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--vllm-cmd", default="python3 -m vllm.entrypoints.openai.api_server")
    args = ap.parse_args()
    rounds = [int(x) for x in args.rounds.split(",")]
    if len(rounds) != 3 or min(rounds) < 1:
        ap.error("--rounds takes three positive counts: R0,R1,R2")
    args.out.mkdir(parents=True, exist_ok=True)
    n = os.cpu_count() or 2
    pins = [f"{n - 2},{n - 1}", f"{n - 4},{n - 3}"] if n >= 8 else [None, None]
    arms = [("base", None, []), ("base", None, []), ("pinned", pins[0], []), ("pinned", pins[1], []),
            ("sync", None, ["--no-async-scheduling"]), ("sync", None, ["--no-async-scheduling"])]
    # Interleave arms over slot numbers so that waves 1 (even slots) and 2 (odd) each restart one per arm.
    slots = [Slot(i, arm, cpus, extra, args.port + i) for i, (arm, cpus, extra) in
             enumerate(arms[j] for j in (0, 2, 4, 1, 3, 5))]
    print("slots:", [(s.index, s.arm, s.cpus) for s in slots], flush=True)
    rng = random.Random(args.seed)
    round_no = 0
    try:
        for wave, block in enumerate(rounds):
            start([s for s in slots if wave == 0 or s.index % 2 == wave - 1], args, wave, args.out)
            for _ in range(block):
                for s in slots:
                    if s.server is not None and not s.server.alive():
                        print(f"slot {s.index} died: {s.server.log_tail(5)}", flush=True)
                        s.server.stop()
                        s.server = None
                live = [s for s in slots if s.server is not None]
                rng.shuffle(live)
                for pos, s in enumerate(live):
                    for cell in CELLS:
                        try:
                            row = measure(s, cell, args.seed * 1000 + round_no, args.vocab)
                        except Exception as exc:
                            row = {"t": round(time.time(), 3), "error": f"{type(exc).__name__}: {exc}"[:500]}
                        row = {"round": round_no, "wave": wave, "pos": pos, "slot": s.index, "arm": s.arm,
                               "start_no": s.start_no, "cell": cell.name, **row}
                        with (args.out / "cells.jsonl").open("a") as f:
                            f.write(json.dumps(row) + "\n")
                print(f"{time.strftime('%H:%M:%S')} round {round_no} done ({len(live)} engines)", flush=True)
                round_no += 1
    finally:
        for s in slots:
            if s.server is not None:
                s.server.stop()
    print("experiment finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
