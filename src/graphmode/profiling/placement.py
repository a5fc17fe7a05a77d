"""Where vLLM's processes ran, read from /proc and /sys: their CPUs, those CPUs' NUMA nodes, the GPU's node.

Small models on a fast GPU are bound by the CPU side of each step (1.5–2 ms), and the same mode measured in
two engine starts differed by 15–20% (docs/results). One suspect is placement: an engine core that
the kernel put on the NUMA node away from its GPU. Recording it per cell lets the data say. Linux only;
anything unreadable gives None, never an error, because this is a diagnostic, not a measurement.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PROC = Path("/proc")
SYS = Path("/sys")


def _ppid_and_cpu(pid: int, proc: Path) -> tuple[int, int] | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after its closing parenthesis.
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[1]), int(fields[36])  # ppid (field 4), processor (field 39)
    except (IndexError, ValueError):
        return None


def process_tree(root: int, proc: Path = PROC) -> dict[int, int]:
    """{pid: CPU it last ran on} for ``root`` and every descendant (the API server and its engine core)."""
    parents: dict[int, tuple[int, int]] = {}
    try:
        entries = [int(e.name) for e in proc.iterdir() if e.name.isdigit()]
    except OSError:
        return {}
    for pid in entries:
        got = _ppid_and_cpu(pid, proc)
        if got is not None:
            parents[pid] = got
    tree: dict[int, int] = {}
    frontier = [root] if root in parents else []
    while frontier:
        pid = frontier.pop()
        tree[pid] = parents[pid][1]
        frontier += [child for child, (ppid, _) in parents.items() if ppid == pid and child not in tree]
    return tree


def cpu_node(cpu: int, sys: Path = SYS) -> int | None:
    try:
        nodes = [p.name for p in (sys / "devices" / "system" / "cpu" / f"cpu{cpu}").iterdir()
                 if p.name.startswith("node") and p.name[4:].isdigit()]
    except OSError:
        return None
    return int(nodes[0][4:]) if nodes else None


def pci_node(bus_id: str | None, sys: Path = SYS) -> int | None:
    if not bus_id:
        return None
    try:
        node = int((sys / "bus" / "pci" / "devices" / bus_id / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None  # -1: the platform reports no NUMA affinity


def placement(pid: int | None, gpu_bus_id: str | None, *, proc: Path = PROC, sys: Path = SYS
              ) -> dict[str, str | int | float | None]:
    """The CPUs and NUMA nodes the process tree of ``pid`` last ran on, the GPU's node and the 1-min load."""
    out: dict[str, str | int | float | None] = {
        "engine_cpus": None, "engine_numa_nodes": None, "gpu_numa_node": pci_node(gpu_bus_id, sys),
        "host_load_1m": None,
    }
    with contextlib.suppress(OSError):
        out["host_load_1m"] = round(os.getloadavg()[0], 2)
    if pid is None:
        return out
    cpus = sorted(set(process_tree(pid, proc).values()))
    if cpus:
        out["engine_cpus"] = ",".join(map(str, cpus))
        nodes = sorted({n for c in cpus if (n := cpu_node(c, sys)) is not None})
        out["engine_numa_nodes"] = ",".join(map(str, nodes)) if nodes else None
    return out
