"""Host and engine CPU counters: psutil (and /proc) read from fake trees, and from the real ones."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from graphmode.profiling import hostload as hl

TICKS = 100  # the fakes' clock ticks per second (psutil divides by the real one)


@pytest.fixture(autouse=True)
def _clock_ticks(monkeypatch: pytest.MonkeyPatch) -> None:
    from psutil import _pslinux

    monkeypatch.setattr(_pslinux, "CLOCK_TICKS", TICKS)


def use(monkeypatch: pytest.MonkeyPatch, proc: Path) -> None:
    """Point psutil (and the hand reads beside it) at a fake /proc tree."""
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(proc))


def proc_stat(user: int, idle: int, steal: int) -> str:
    # user nice system idle iowait irq softirq steal guest guest_nice
    return f"cpu  {user} 0 0 {idle} 0 0 0 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nctxt 5\nbtime 1000\n"


def pid_stat(pid: int, ppid: int, utime: int, stime: int) -> str:
    # fields 3.. : state, ppid, pgrp, session, tty, tpgid, flags, minflt, cminflt, majflt, cmajflt, utime, stime
    rest = ["S", str(ppid)] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 36
    return f"{pid} (VLLM::Engine (core)) " + " ".join(rest) + "\n"


def fake_proc(root: Path, host: tuple[int, int, int], procs: dict[int, tuple[int, int, int, list[int]]]) -> Path:
    """procs: {pid: (ppid, utime, stime, [nonvoluntary switches per thread])}"""
    proc = root / "proc"
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "stat").write_text(proc_stat(*host))
    (proc / "cpuinfo").write_text("processor\t: 0\nmodel name\t: Test CPU 9000\n\n"
                                  "processor\t: 1\nmodel name\t: Test CPU 9000\n")
    for pid, (ppid, ut, st, switches) in procs.items():
        d = proc / str(pid)
        d.mkdir(exist_ok=True)
        (d / "stat").write_text(pid_stat(pid, ppid, ut, st))
        for i, n in enumerate(switches):
            task = d / "task" / str(pid + i)
            task.mkdir(parents=True, exist_ok=True)
            (task / "status").write_text(f"Name:\tx\nvoluntary_ctxt_switches:\t99\nnonvoluntary_ctxt_switches:\t{n}\n")
    return proc


def test_usage_between_two_snapshots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = fake_proc(tmp_path / "a", (1000, 9000, 0), {100: (1, 50, 10, [3]), 101: (100, 200, 40, [5, 7]),
                                                   300: (1, 999, 999, [999])})
    b = fake_proc(tmp_path / "b", (1600, 9300, 100), {100: (1, 60, 10, [4]), 101: (100, 400, 40, [25, 7]),
                                                     300: (1, 5000, 999, [5000])})
    use(monkeypatch, a)
    before = hl.counters(100, clock=10.0)
    use(monkeypatch, b)
    after = hl.counters(100, clock=12.0)
    assert before.engine_cpu_s == 300 / TICKS and before.engine_nivcsw == 15  # pid 300 is not in the tree
    got = hl.usage(before, after)
    # host: 1000 ticks passed, 300 idle, 100 stolen
    assert got["host_busy_pct"] == 70.0 and got["host_steal_pct"] == 10.0
    # engine: 210 ticks at 100 Hz over 2 s; 21 involuntary switches over 2 s
    assert got["engine_cpu_cores"] == 1.05 and got["engine_nivcsw_per_s"] == 10.5
    # the busiest process: pid 101, 200 ticks over 2 s; vLLM's own title when it set one
    assert got["engine_busiest_cores"] == 1.0 and isinstance(got["engine_busiest_process"], str)
    (b / "101" / "cmdline").write_bytes(b"VLLM::EngineCore\x00")
    after = hl.counters(100, clock=12.0)
    assert hl.usage(before, after)["engine_busiest_process"] == "VLLM::EngineCore"
    # a process that joined between the snapshots does not count its whole life
    joined = hl.Counters(12.0, None, None, None, ((101, "VLLM::EngineCore", 4.4), (555, "VLLM::APIServer_0", 50.0)))
    assert hl.usage(before, joined)["engine_busiest_process"] == "VLLM::EngineCore"


def test_unreadable_or_inconsistent_counters_give_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    use(monkeypatch, empty)
    snap = hl.counters(100, clock=1.0)
    assert snap == hl.Counters(1.0, None, None, None)
    assert set(hl.usage(snap, hl.Counters(2.0, None, None, None)).values()) == {None}
    assert hl.cpu_model() is None
    # a tree that lost a process between snapshots: a negative delta is not a number to report
    got = hl.usage(hl.Counters(0.0, (5,) * 8, 5.0, 50), hl.Counters(1.0, (4,) * 8, 1.0, 10))
    assert set(got.values()) == {None}
    # no time passed: rates are undefined
    assert hl.usage(hl.Counters(1.0, None, 1.0, 1), hl.Counters(1.0, None, 2.0, 2))["engine_cpu_cores"] is None
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "stat").write_text("intr 1 2 3\n")
    use(monkeypatch, bad)
    assert hl.counters(None).host_cpu_s is None


def test_cpu_model_names_the_model_and_counts_cpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, fake_proc(tmp_path, (1, 1, 0), {}))
    assert hl.cpu_model() == "Test CPU 9000 × 2"


def test_real_proc_sees_this_process_use_cpu() -> None:
    before = hl.counters(os.getpid())
    x = 0
    for i in range(3_000_000):
        x += i & 3
    after = hl.counters(os.getpid())
    got = hl.usage(before, after)
    assert got["engine_cpu_cores"] is not None and got["engine_cpu_cores"] > 0.1
    busiest = got["engine_busiest_cores"]
    assert isinstance(busiest, float) and busiest > 0.1 and got["engine_busiest_process"]
    assert got["host_busy_pct"] is not None and got["host_busy_pct"] > 0
    assert hl.python_probe_ms(repeats=1) > 0
