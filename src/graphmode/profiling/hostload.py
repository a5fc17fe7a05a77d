"""How busy the host and vLLM's processes were during a cell, and how fast the host ran Python.

The H200 campaign found that the same mode measured in two engine starts can differ by 15–40% on the
small shapes, where each 1.5–2 ms step is bound by vLLM's Python scheduler, while the 8B shape with CUDA
graphs (a GPU-bound step) repeated within 1% (NOTES.md, "Noise"). NUMA placement was ruled out (the lent
hosts have one node). What is left is the CPU: a slower core, a noisy neighbour taking time from the VM
(steal), or contention with the other GPU's chain. These counters separate them:

* ``host_steal_pct``, ``host_busy_pct``: the whole host over the cell, from the first line of /proc/stat;
* ``engine_cpu_cores``: CPU seconds the vLLM process tree used per second of the cell (utime + stime);
* ``engine_nivcsw_per_s``: involuntary context switches of its threads per second (preempted by others);
* ``host_probe_ms``: a fixed pure-Python loop timed just before the cell (best of three), the kind of
  work the scheduler does, so a start on a slower or busier host shows as a larger number.

Linux only; anything unreadable gives None, never an error: these are diagnostics, not measurements.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from graphmode.profiling.placement import PROC, process_tree

_PROBE_N = 200_000


@dataclass(frozen=True)
class Counters:
    at: float
    host_ticks: tuple[int, ...] | None  # user nice system idle iowait irq softirq steal
    engine_ticks: int | None
    engine_nivcsw: int | None


def _host_ticks(proc: Path) -> tuple[int, ...] | None:
    try:
        first = (proc / "stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not first or first[0] != "cpu":
        return None
    try:
        ticks = tuple(int(x) for x in first[1:9])
    except ValueError:
        return None
    return ticks + (0,) * (8 - len(ticks))  # kernels before 2.6.11 have no steal column


def _process_ticks(pid: int, proc: Path) -> int | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
        fields = stat[stat.rfind(")") + 2:].split()
        return int(fields[11]) + int(fields[12])  # utime (field 14) + stime (field 15), all threads
    except (OSError, IndexError, ValueError):
        return None


def _process_nivcsw(pid: int, proc: Path) -> int | None:
    # /proc/PID/status counts the leader thread only; the engine's work is spread over its threads.
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return None
    total, seen = 0, False
    for task in tasks:
        with contextlib.suppress(OSError, ValueError):
            for line in (task / "status").read_text().splitlines():
                if line.startswith("nonvoluntary_ctxt_switches:"):
                    total += int(line.split(":", 1)[1])
                    seen = True
    return total if seen else None


def counters(pid: int | None, *, proc: Path = PROC, clock: float | None = None) -> Counters:
    """A snapshot of the host's CPU ticks and of the process tree of ``pid`` (vLLM's API server)."""
    at = time.monotonic() if clock is None else clock
    engine_ticks = engine_nivcsw = None
    if pid is not None:
        pids = list(process_tree(pid, proc))
        ticks = [t for p in pids if (t := _process_ticks(p, proc)) is not None]
        switches = [s for p in pids if (s := _process_nivcsw(p, proc)) is not None]
        engine_ticks = sum(ticks) if ticks else None
        engine_nivcsw = sum(switches) if switches else None
    return Counters(at, _host_ticks(proc), engine_ticks, engine_nivcsw)


def usage(before: Counters, after: Counters, *, hz: int | None = None) -> dict[str, float | None]:
    """What changed between two snapshots, as the four ``RunConditions`` fields named in the module doc.

    A process that left or joined the tree in between makes its deltas meaningless; a negative delta is
    reported as None rather than as a number that looks plausible.
    """
    out: dict[str, float | None] = {
        "host_busy_pct": None, "host_steal_pct": None, "engine_cpu_cores": None, "engine_nivcsw_per_s": None,
    }
    wall = after.at - before.at
    if before.host_ticks and after.host_ticks:
        d = [a - b for a, b in zip(after.host_ticks, before.host_ticks, strict=True)]
        total = sum(d)
        if total > 0 and min(d) >= 0:
            idle = d[3] + d[4]
            out["host_busy_pct"] = round(100 * (total - idle) / total, 1)
            out["host_steal_pct"] = round(100 * d[7] / total, 2)
    if wall <= 0:
        return out
    if before.engine_ticks is not None and after.engine_ticks is not None:
        dt = after.engine_ticks - before.engine_ticks
        tick_hz = hz or _clock_ticks()
        if dt >= 0 and tick_hz:
            out["engine_cpu_cores"] = round(dt / tick_hz / wall, 2)
    if before.engine_nivcsw is not None and after.engine_nivcsw is not None:
        ds = after.engine_nivcsw - before.engine_nivcsw
        if ds >= 0:
            out["engine_nivcsw_per_s"] = round(ds / wall, 1)
    return out


def _clock_ticks() -> int | None:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (AttributeError, OSError, ValueError):
        return None


def python_probe_ms(repeats: int = 3) -> float:
    """Best of ``repeats`` timings of a fixed pure-Python loop (~10 ms on a 2024 server core)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        acc = 0
        for i in range(_PROBE_N):
            acc += i & 7
        best = min(best, time.perf_counter() - t0)
    return round(best * 1e3, 3)


def cpu_model(proc: Path = PROC) -> str | None:
    """The host CPU's model name and logical CPU count, e.g. ``Intel(R) Xeon(R) Platinum 8480C × 32``."""
    try:
        text = (proc / "cpuinfo").read_text()
    except OSError:
        return None
    names = [line.split(":", 1)[1].strip() for line in text.splitlines()
             if line.lower().startswith("model name") and ":" in line]
    if not names:
        return None
    return f"{names[0]} × {len(names)}"
