"""A race of two resident real vLLM servers (CPU build): rows per round, an engine killed mid-race, resume.

Two sessions, five engine starts: the first races NONE against the default (two starts at once, after a
compile start of both on their empty compile caches, which measures nothing and adds ~70 s) and
has NONE's engine killed with SIGKILL after its round-1 row; the race records the failure with vLLM's
reason and ends (no challenger left). The second session resumes with ``--starts 3``: it reuses the rounds
measured, starts NONE again next to the default (each arm's second start, counted from the first
session's rows; its caches are warm, so no compile start), numbers its rounds after the first session's, and
after two rounds restarts the default alone on its port (its third start) for one more round.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import DatasetError
from tests.integration.vllm_cpu import FIXTURES, graphmode_cli, vllm_args, vllm_command
from tests.support.net import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]
GRID = FIXTURES / "race-cpu.yaml"


def race_argv(dataset: Path, logs: Path, port: int, *extra: str) -> list[str]:
    return [*graphmode_cli(), "profile", "--race", "--grid", str(GRID), "--vllm-cmd", vllm_command(),
            "--dataset", str(dataset), "--modes", "NONE", "--port", str(port), "--log-dir", str(logs),
            "--startup-timeout", "600", "--cell-s", "2", "--cell-warmup-s", "1", *extra, "--",
            *vllm_args(max_model_len=512)]


def rows(dataset: Path) -> list[dict[str, object]]:
    if not dataset.exists():
        return []
    with ProfileStore(dataset, readonly=True) as store:
        return store.rows()


def rows_so_far(dataset: Path) -> list[dict[str, object]]:
    """The rows while the race runs: its file can exist a moment before its tables (a slow box widens it)."""
    try:
        return rows(dataset)
    except DatasetError:
        return []


def _vllm_pid(port: int) -> int | None:
    out = subprocess.run(["pgrep", "-f", f"api_server --model .*--port {port}$"], capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    return min(pids) if pids else None


def test_race_two_real_engines_kill_one_and_resume(tmp_path: Path) -> None:
    if not os.environ.get("GRAPHMODE_TEST_VLLM_PYTHON"):
        pytest.skip("GRAPHMODE_TEST_VLLM_PYTHON is not set")
    dataset, logs, port = tmp_path / "race.sqlite", tmp_path / "logs", free_port()
    proc = subprocess.Popen(race_argv(dataset, logs, port, "--max-rounds", "4"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600  # the compile start, then the measured start, then two rounds
        while not any(r["race_arm"] == "NONE" and r["race_round"] == 1 for r in rows_so_far(dataset)):
            assert proc.poll() is None, f"race ended before the kill: {proc.stdout.read() if proc.stdout else ''}"
            assert time.monotonic() < deadline, "no round-1 row of NONE within 600 s"
            time.sleep(0.5)
        pid = _vllm_pid(port + 1)  # the default races on --port, NONE on the next one
        assert pid is not None, "could not find NONE's vLLM process"
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, out  # an arm failed
    assert "2 compile starts" in out, out  # both caches were empty: compiled once, unmeasured
    first = rows(dataset)
    ok = [r for r in first if r["status"] == "ok"]
    failed = [r for r in first if r["status"] == "failed"]
    assert {r["race_arm"] for r in ok} == {"FULL_AND_PIECEWISE", "NONE"}
    assert len(failed) == 1 and failed[0]["race_arm"] == "NONE"
    assert "SIGKILL" in str(failed[0]["reason"]) and "last log lines" in str(failed[0]["reason"])
    for r in ok:
        assert r["race_id"] and r["repeat"] == r["race_round"] and r["race_requested_mode"] == r["mode"]
        # ITL can be absent where a starved load generator read each stream at once (test_profile_vllm)
        assert r["ttft_p50"] is not None and 0 < float(r["ttft_p50"]) <= float(r["e2e_p50"])  # type: ignore[arg-type]
        assert r["itl_p50"] is None or 0 < float(r["itl_p50"]) <= float(r["e2e_p50"])  # type: ignore[arg-type]
        assert r["race_starts_wall_s"] is not None and r["race_live_engines"] == 2
    # both engines came up side by side: the session's start took about one start, not two
    starts = [float(r["startup_s"]) for r in ok if r["race_round"] == 0]  # type: ignore[arg-type]
    assert float(ok[0]["race_starts_wall_s"]) < 0.9 * sum(starts)  # type: ignore[arg-type]
    first_rounds = {int(r["race_round"]) for r in ok}  # type: ignore[call-overload]

    # a budget that pays for the restart wave however slow this box starts vLLM (a wave the budget left
    # cannot pay for is skipped)
    resumed = subprocess.run(race_argv(dataset, logs, free_port(), "--max-rounds", "3", "--starts", "3",
                                       "--budget-min", "30"),
                             capture_output=True, text=True, timeout=800, check=False)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"{len(first_rounds)} rounds already measured" in resumed.stderr
    after = [r for r in rows(dataset) if r["status"] == "ok"]
    new = [r for r in after if r["run_id"] != ok[0]["run_id"]]
    assert {r["race_arm"] for r in new} == {"FULL_AND_PIECEWISE", "NONE"}
    assert min(int(r["race_round"]) for r in new) > max(first_rounds)  # type: ignore[call-overload]
    assert len({r["race_id"] for r in after}) == 1, "the resumed session is not the same race"
    assert "itl_p50" in resumed.stderr and "rounds this session" in resumed.stderr
    # on CPU the modes run alike: NONE stays open, so the default is restarted once, alone
    assert "3 engine starts (1 restarts" in resumed.stderr, resumed.stderr
    assert "0 compile starts" in resumed.stderr, "the caches the first session wrote were not found warm"
    starts: dict[str, set[str]] = {}
    for r in after:
        starts.setdefault(str(r["race_arm"]), set()).add(str(r["race_start_id"]))
    assert {a: len(s) for a, s in starts.items()} == {"FULL_AND_PIECEWISE": 3, "NONE": 2}
    last = max(int(r["race_round"]) for r in new)  # type: ignore[call-overload]
    assert {r["race_arm"] for r in new if r["race_round"] == last} == {"FULL_AND_PIECEWISE", "NONE"}
