"""How busy the host and vLLM's processes were during a cell, and how fast the host ran Python.

The H200 campaign found that the same mode measured in two engine starts can differ by 15–40% on the
small shapes, where each 1.5–2 ms step is bound by vLLM's Python scheduler, while the 8B shape with CUDA
graphs (a GPU-bound step) repeated within 1% (docs/results). NUMA placement was ruled out (the lent
hosts have one node). What is left is the CPU: a slower core, a noisy neighbour taking time from the VM
(steal), or contention with the other GPU's chain. These counters separate them:

* ``host_steal_pct``, ``host_busy_pct``: the whole host over the cell (psutil's CPU times);
* ``engine_cpu_cores``: CPU seconds the vLLM process tree used per second of the cell (user + system);
* ``engine_busiest_cores``, ``engine_busiest_process``: the one process of that tree that used the most
  CPU per second, and its title (vLLM names them: ``VLLM::EngineCore``, ``VLLM::APIServer_0``...). A
  Python process holds its GIL on one core, so near 1 that process sets the pace: with
  ``--api-server-count 4`` the H200 race (2026-12-03) served 1.6x the tokens of one API server, with the
  tree at 2.8-3.3 cores, and this says which process is the next limit;
* ``engine_nivcsw_per_s``: involuntary context switches of its threads per second (preempted by others);
* ``host_probe_ms``: a fixed pure-Python loop timed just before the cell (best of three), the kind of
  work the scheduler does, so a start on a slower or busier host shows as a larger number.

Linux only; anything unreadable gives None, never an error: these are diagnostics, not measurements.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

_PROBE_N = 200_000
_READ_ERRORS = (psutil.Error, OSError, ValueError, IndexError, TypeError, RuntimeError)


@dataclass(frozen=True)
class Counters:
    at: float
    host_cpu_s: tuple[float, ...] | None  # user nice system idle iowait irq softirq steal
    engine_cpu_s: float | None
    engine_nivcsw: int | None
    # (pid, title, CPU seconds) of each process of the tree: the busiest one's share
    processes: tuple[tuple[int, str, float], ...] = ()


def _host_cpu_s() -> tuple[float, ...] | None:
    try:
        t = psutil.cpu_times()
        return (t.user, t.nice, t.system, t.idle, t.iowait, t.irq, t.softirq, t.steal)
    except _READ_ERRORS:
        return None


def _process_nivcsw(pid: int) -> int | None:
    # psutil counts the leader thread only (/proc/PID/status); the engine's work is spread over its threads.
    try:
        tasks = list((Path(psutil.PROCFS_PATH) / str(pid) / "task").iterdir())
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


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except _READ_ERRORS:
        return []


def tree_pids(pid: int | None) -> set[int]:
    """``pid`` and its descendants (vLLM's API server and the engine core that holds the GPU memory)."""
    return {p.pid for p in _tree(pid)} if pid is not None else set()


def _title(p: psutil.Process) -> str:
    """The process's title as vLLM set it (``VLLM::EngineCore``), else its executable's name."""
    try:
        argv = p.cmdline()
        if argv and argv[0].startswith("VLLM"):
            return argv[0].split()[0][:60]
        return str(p.name())[:60]
    except _READ_ERRORS:
        return "?"


def _cpu_s(p: psutil.Process) -> float | None:
    try:
        t = p.cpu_times()
        return float(t.user + t.system)
    except _READ_ERRORS:
        return None


def counters(pid: int | None, *, clock: float | None = None) -> Counters:
    """A snapshot of the host's CPU times and of the process tree of ``pid`` (vLLM's API server)."""
    at = time.monotonic() if clock is None else clock
    engine_cpu_s = engine_nivcsw = None
    processes: list[tuple[int, str, float]] = []
    if pid is not None:
        procs = _tree(pid)
        for p in procs:
            if (t := _cpu_s(p)) is not None:
                processes.append((p.pid, _title(p), t))
        switches = [s for p in procs if (s := _process_nivcsw(p.pid)) is not None]
        engine_cpu_s = sum(t for _, _, t in processes) if processes else None
        engine_nivcsw = sum(switches) if switches else None
    return Counters(at, _host_cpu_s(), engine_cpu_s, engine_nivcsw, tuple(processes))


def engine_cores(before: Counters, after: Counters) -> float | None:
    """CPU seconds per second of vLLM's process tree between two snapshots (``usage``'s engine_cpu_cores)."""
    cores = usage(before, after)["engine_cpu_cores"]
    return cores if isinstance(cores, float) else None


def usage(before: Counters, after: Counters) -> dict[str, float | str | None]:
    """What changed between two snapshots, as the ``RunConditions`` fields named in the module doc.

    A process that left or joined the tree in between makes its deltas meaningless; a negative delta is
    reported as None rather than as a number that looks plausible.
    """
    out: dict[str, float | str | None] = {
        "host_busy_pct": None, "host_steal_pct": None, "engine_cpu_cores": None, "engine_nivcsw_per_s": None,
        "engine_busiest_cores": None, "engine_busiest_process": None,
    }
    wall = after.at - before.at
    if before.host_cpu_s and after.host_cpu_s:
        d = [a - b for a, b in zip(after.host_cpu_s, before.host_cpu_s, strict=True)]
        total = sum(d)
        if total > 0 and min(d) >= 0:
            idle = d[3] + d[4]
            out["host_busy_pct"] = round(100 * (total - idle) / total, 1)
            out["host_steal_pct"] = round(100 * d[7] / total, 2)
    if wall <= 0:
        return out
    if before.engine_cpu_s is not None and after.engine_cpu_s is not None:
        dt = after.engine_cpu_s - before.engine_cpu_s
        if dt >= 0:
            out["engine_cpu_cores"] = round(dt / wall, 2)
    if before.engine_nivcsw is not None and after.engine_nivcsw is not None:
        ds = after.engine_nivcsw - before.engine_nivcsw
        if ds >= 0:
            out["engine_nivcsw_per_s"] = round(ds / wall, 1)
    # only processes in both snapshots (a pid's CPU time never falls; a new pid would count its whole life)
    start = {pid: t for pid, _, t in before.processes}
    deltas = [(t - start[pid], title) for pid, title, t in after.processes if pid in start and t >= start[pid]]
    if deltas:
        busiest, title = max(deltas)
        out["engine_busiest_cores"] = round(busiest / wall, 2)
        out["engine_busiest_process"] = title
    return out


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


def cpu_model() -> str | None:
    """The host CPU's model name and logical CPU count, e.g. ``Intel(R) Xeon(R) Platinum 8480C × 32``."""
    try:  # psutil has the count but not the name
        text = (Path(psutil.PROCFS_PATH) / "cpuinfo").read_text()
    except OSError:
        return None
    names = [line.split(":", 1)[1].strip() for line in text.splitlines()
             if line.lower().startswith("model name") and ":" in line]
    if not names:
        return None
    return f"{names[0]} × {len(names)}"
