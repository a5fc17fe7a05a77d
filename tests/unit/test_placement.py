"""Where vLLM's processes ran: /proc and /sys read from fake trees, and from the real ones."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from graphmode.profiling import placement as pl


def stat_line(pid: int, comm: str, ppid: int, cpu: int) -> str:
    # fields 3.. of /proc/PID/stat: state, ppid, then 34 more up to field 38; field 39 is the CPU
    rest = ["S", str(ppid)] + ["0"] * 34 + [str(cpu)] + ["0"] * 13
    return f"{pid} ({comm}) " + " ".join(rest) + "\n"


def fake_proc(tmp_path: Path, procs: list[tuple[int, str, int, int]]) -> Path:
    proc = tmp_path / "proc"
    for pid, comm, ppid, cpu in procs:
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(stat_line(pid, comm, ppid, cpu))
    (proc / "self").mkdir()  # non-numeric entries are skipped
    return proc


def fake_sys(tmp_path: Path, cpu_nodes: dict[int, int], gpus: dict[str, str]) -> Path:
    sys = tmp_path / "sys"
    for cpu, node in cpu_nodes.items():
        d = sys / "devices" / "system" / "cpu" / f"cpu{cpu}"
        (d / f"node{node}").mkdir(parents=True)
        (d / "topology").mkdir()
    for bus, node in gpus.items():
        d = sys / "bus" / "pci" / "devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text(node + "\n")
    return sys


def test_process_tree_follows_children_and_reads_their_cpus(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, [
        (1, "init", 0, 0),
        (100, "python3", 1, 3),  # API server
        (101, "VLLM::EngineCore (x) y", 100, 17),  # comm with spaces and a parenthesis
        (102, "pt_main_thread", 101, 18),
        (200, "other", 1, 5),
    ])
    assert pl.process_tree(100, proc) == {100: 3, 101: 17, 102: 18}
    assert pl.process_tree(999, proc) == {}


def test_placement_names_cpus_nodes_and_the_gpu_node(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, [(100, "python3", 1, 3), (101, "EngineCore", 100, 40)])
    sys = fake_sys(tmp_path, {3: 0, 40: 1}, {"0000:1b:00.0": "0", "0000:9a:00.0": "-1"})
    got = pl.placement(100, "0000:1b:00.0", proc=proc, sys=sys)
    assert got["engine_cpus"] == "3,40" and got["engine_numa_nodes"] == "0,1" and got["gpu_numa_node"] == 0
    assert isinstance(got["host_load_1m"], float)
    # -1 is "no NUMA affinity", an unknown bus or none at all gives None
    assert pl.placement(None, "0000:9a:00.0", proc=proc, sys=sys)["gpu_numa_node"] is None
    assert pl.placement(100, "0000:ff:00.0", proc=proc, sys=sys)["gpu_numa_node"] is None
    assert pl.placement(100, None, proc=tmp_path / "nope", sys=tmp_path / "nope")["engine_cpus"] is None


def test_garbage_stat_files_are_skipped(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, [(100, "python3", 1, 3)])
    (proc / "101").mkdir()
    (proc / "101" / "stat").write_text("101 (broken")
    assert pl.process_tree(100, proc) == {100: 3}


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux /proc")
def test_real_proc_finds_this_process() -> None:
    tree = pl.process_tree(os.getpid())
    assert os.getpid() in tree and tree[os.getpid()] >= 0
