"""bench/gpu/series.sh end to end on the CPU against tests/support/fake_vllm.py, with a series of a few seconds:
a compile start and a warm start of both engines, ABBA loops of c1 and c8, the files collected into $OUT, a
second call that does not start over, and bench/start_effect_stats.py --series reading what came back."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu" / "series.sh"
FAKE_VLLM = ROOT / "tests" / "support" / "fake_vllm.py"

pytestmark = pytest.mark.timeout(240)


def call(tmp_path: Path, port: int) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = {**os.environ, "GM_WORK": str(tmp_path / "work"), "GM_PYTHON": sys.executable,
           "GM_SITE": str(tmp_path / "no-site"), "GM_VLLM_CMD": shlex.join([sys.executable, str(FAKE_VLLM)]),
           "GM_PORT": str(port), "OUT": str(out), "PYTHONPATH": ""}
    return subprocess.run(["bash", str(SCRIPT), "120", "qwen2.5-0.5b", "1G", "0.15"], cwd=ROOT, env=env,
                          text=True, capture_output=True, timeout=200)


def test_a_short_series_runs_collects_and_is_analysed(tmp_path: Path) -> None:
    port = free_port()
    r = call(tmp_path, port)
    assert r.returncode == 0, r.stderr
    assert "started (pid " in r.stdout and "experiment process ended" in r.stdout
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} <= {"cells.jsonl", "starts.jsonl", "out.txt", "logs.tgz", "gpu.csv",
                                                "summary.txt"}
    assert "experiment finished" in (out / "out.txt").read_text()

    starts = [json.loads(line) for line in (out / "starts.jsonl").read_text().splitlines()]
    # a compile start (wave 0, cold) then the measured warm start, for A and for B, each on its own port
    assert [(s["arm"], s["start_no"], s["wave"], s["cold"], s["ok"]) for s in starts] == [
        ("A", 1, 0, True, True), ("B", 1, 0, True, True), ("A", 2, 1, False, True), ("B", 2, 1, False, True)]
    assert all(s["effective_mode"] == "FULL_AND_PIECEWISE" for s in starts)
    caches = {p.name for p in (tmp_path / "work" / "data" / "cache").iterdir()}
    assert caches == {"slot-0", "slot-1"}

    cells = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    loops = max(c["loop"] for c in cells) + 1
    assert loops >= 2 and len(cells) == 4 * loops
    assert all(c["error"] is None and c["itl_p50_ms"] > 0 and c["start_no"] == 2 for c in cells)
    order = [(c["loop"], c["engine"], c["cell"]) for c in cells[:8]]
    assert order == [(0, "A", "c1"), (0, "A", "c8"), (0, "B", "c1"), (0, "B", "c8"),
                     (1, "B", "c1"), (1, "B", "c8"), (1, "A", "c1"), (1, "A", "c8")]  # ABBA
    elapsed = [c["elapsed_s"] for c in cells]
    assert elapsed == sorted(elapsed) and elapsed[-1] < 0.15 * 60 + 30
    assert all("host_mhz" in c and "gpu_sm_clock_mhz_mean" in c for c in cells)
    assert "loops" in (out / "summary.txt").read_text()

    again = call(tmp_path, port)
    assert again.returncode == 0, again.stderr
    assert "already finished" in again.stdout and "started (pid" not in again.stdout
    # a series that ended early (a lease cut it off) is collected, never started over on top of its cells
    work_out = tmp_path / "work" / "out.txt"
    work_out.write_text(work_out.read_text().replace("experiment finished", "killed"))
    early = call(tmp_path, port)
    assert early.returncode == 0, early.stderr
    assert "ended without finishing" in early.stdout and "started (pid" not in early.stdout
    assert len((out / "cells.jsonl").read_text().splitlines()) == len(cells)

    stats = subprocess.run([sys.executable, str(ROOT / "bench" / "start_effect_stats.py"), "--series", str(out),
                            "--window-min", "0.05"], text=True, capture_output=True, timeout=60)
    assert stats.returncode == 0, stats.stderr
    assert "A  c1  itl_p50_ms" in stats.stdout and "measured, warm" in stats.stdout
