"""bench/gpu/watch_run.sh and bench/watch_drive.py: a managed ``graphmode watch`` driven through a traffic
shift on the CPU against tests/support/fake_vllm.py (short phases), and the driver's bookkeeping on
hand-made requests. Counts and structure are asserted, never how fast anything ran."""

from __future__ import annotations

import gzip
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from graphmode.profiling.stats import RequestResult
from tests.support.bench import load_bench
from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu" / "watch_run.sh"
FAKE_VLLM = ROOT / "tests" / "support" / "fake_vllm.py"
H200_033 = "nvidia-h200-vllm0.33.0-3375a87d3889"

pytestmark = pytest.mark.timeout(240)


def run(tmp_path: Path, wait_s: int = 200) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    # what unpack.sh writes beside a site (it sets PYTHONPATH to the site alone)
    (tmp_path / "no-site.env").write_text(f"export PYTHONPATH={tmp_path / 'no-site'}\n")
    cache = tmp_path / "race-cache"  # a race's compile caches, one per arm
    for arm, name in (("FULL", "a"), ("PIECEWISE", "b")):
        (cache / arm / "torch_compile_cache" / name).mkdir(parents=True, exist_ok=True)
        (cache / arm / "torch_compile_cache" / name / "artifact").write_text(arm)
    env = {**os.environ, "GM_WATCH_WORK": str(tmp_path / "work"), "GM_PYTHON": sys.executable,
           "GM_SITE": str(tmp_path / "no-site"), "GM_VLLM_CMD": shlex.join([sys.executable, str(FAKE_VLLM)]),
           "GM_WATCH_MODEL_ID": H200_033, "GM_WATCH_INITIAL": "PIECEWISE",
           "GM_WATCH_PORT": str(free_port()), "GM_WATCH_API_PORT": str(free_port()),
           "GM_WATCH_INTERVAL": "0.3", "GM_WATCH_EVALUATE_EVERY": "0.6", "GM_WATCH_WINDOW_S": "3",
           "GM_WATCH_MIN_DWELL_S": "1", "GM_WATCH_COOLDOWN_S": "1", "GM_WATCH_A_MAX_S": "6",
           "GM_WATCH_A_AFTER_S": "2", "GM_WATCH_B_S": "3", "GM_WATCH_B_RATE": "4", "GM_WATCH_B_INPUT": "256",
           "GM_WATCH_DEADLINE_S": "120", "GM_WATCH_CACHE_FROM": str(cache), "OUT": str(out), "PYTHONPATH": ""}
    return subprocess.run(["bash", str(SCRIPT), str(wait_s)], cwd=ROOT, env=env, text=True, capture_output=True,
                          timeout=wait_s + 30)


def test_the_run_counts_every_request_and_records_the_decisions(tmp_path: Path) -> None:
    r = run(tmp_path)
    assert r.returncode == 0, r.stderr
    assert "started the watch run" in r.stdout and "watch run finished" in r.stdout
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} == {"summary.json", "decisions.jsonl", "watch.log", "requests.csv.gz",
                                               "engines.tgz", "state.json", "drive.out"}
    s = json.loads((out / "summary.json").read_text())
    assert s["first_server_ready_s"] is not None and "error" not in s
    assert s["advisor_model"]["model_id"] == H200_033
    assert [p["name"] for p in s["phases"]] == ["A", "B"]
    total = s["requests"]
    assert total["sent"] > 0 and total["sent"] == total["ok"] + total["lost"] + total["cut"]
    assert total["lost"] == 0  # blue-green: no request is lost, switch or not
    for ph in s["phases"]:
        assert ph["sent"] == ph["ok"] + ph["lost"] + ph["cut"] and ph["ok"] > 0
        assert sum(m["sent"] for m in ph["by_mode_at_send"].values()) == ph["sent"]
    with gzip.open(out / "requests.csv.gz", "rt") as f:
        rows = f.read().splitlines()
    assert len(rows) == 1 + total["sent"]
    decisions = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    judged = [d for d in decisions if d["action"] in ("stay", "hold", "switch")]
    assert judged and s["decisions"] == [{k: d.get(k) for k in ("t", "action", "current", "target", "reason",
                                                                 "numbers")} for d in judged]
    assert any("gain" in d["numbers"] for d in judged)  # the model answered with numbers
    for sw in s["switches"]:  # each attempt: its decision, its result, what the client saw while it ran
        assert sw["decision_numbers"]["gain"] >= sw["decision_numbers"]["min_gain"]
        assert sw["ok"] is (sw["downtime_s"] == 0.0) and sw["client"]["lost_during"] == 0
    log = (out / "watch.log").read_text()
    assert " HTTP Request: " not in log and "graphmode.watch" in log
    assert s["final_mode"] in {"PIECEWISE", "FULL", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "NONE"}

    merged = tmp_path / "work" / "vllm-cache" / "torch_compile_cache"  # both arms' caches, for watch's starts
    assert (merged / "a" / "artifact").read_text() == "FULL" and (merged / "b" / "artifact").read_text() == "PIECEWISE"

    again = run(tmp_path, wait_s=5)  # collect again: no new run
    assert "started" not in again.stdout and "watch run finished" in again.stdout
    assert json.loads((out / "summary.json").read_text()) == s


def result(sent: float, done: float | None, ok: bool = True, cut: bool = False) -> RequestResult:
    r = RequestResult(sent_at=0.0, input_tokens=64, max_tokens=128, ok=ok, cut=cut, started_at=sent,
                      done_at=done, ttft=0.01 if ok else None, e2e=None if done is None else done - sent)
    r.itls = [0.002] * 3 if ok else []
    r.error = None if ok else ("cut: the phase ended" if cut else "HTTP 503: restarting")
    return r


def test_a_switch_is_paired_with_its_decision_and_the_requests_around_it() -> None:
    wd = load_bench("watch_drive")
    decisions = [
        {"t": 100.0, "action": "hold", "current": "PIECEWISE", "target": "FULL", "numbers": {"gain": 0.5}},
        {"t": 101.0, "action": "switch", "current": "PIECEWISE", "target": "FULL", "numbers": {"gain": 0.5}},
        {"t": 111.0, "action": "switched", "target": "FULL", "reason": "stop-then-start", "downtime_s": 9.5,
         "startup_s": 9.0},
        {"t": 112.0, "action": "stay", "current": "FULL", "target": None, "numbers": {}},
    ]
    (sw,) = wd.switch_events(decisions)
    assert (sw["from"], sw["to"], sw["ok"], sw["switch_s"], sw["downtime_s"]) == ("PIECEWISE", "FULL", True, 10.0,
                                                                                    9.5)
    # perf_counter 0 is wall 100: two answered before, a 503 and a cut one during, one answered after
    rs = [result(0.0, 0.5), result(0.5, 0.9), result(2.0, 2.0, ok=False), result(3.0, None, ok=False, cut=True),
          result(12.0, 12.4)]
    ph = wd.Phase("A", rs, t0_wall=100.0, t0_perf=0.0, end_wall=113.0)
    seen = wd.Watched(modes=[(99.0, "PIECEWISE"), (110.5, "FULL")], gpu_mem=[(99.0, 10.0), (105.0, 20.0)])
    b = wd.Phase("B", [result(20.0, 20.5)], t0_wall=119.0, t0_perf=19.0, end_wall=125.0)  # other traffic
    c = wd.around_switch([ph, b], sw, seen)
    assert c["phase"] == "A" and (c["sent_during"], c["lost_during"]) == (2, 1)
    assert c["before"]["ok"] == 2 and c["after"]["ok"] == 1
    assert c["longest_gap_between_answers_s"] == pytest.approx(11.5)
    assert (c["gpu_mem_mib_before"], c["gpu_mem_mib_max_during"]) == (10.0, 20.0)
    assert wd.counts(rs) == {"sent": 5, "ok": 3, "cut": 1, "lost": 1, "planned_not_sent": 0}
    summary = wd.phase_summary(ph, seen)
    assert summary["by_mode_at_send"]["PIECEWISE"]["sent"] == 4 and summary["by_mode_at_send"]["FULL"]["sent"] == 1


def test_the_fake_vllm_answers_without_nagle_delays() -> None:
    """Its TTFT through a kept-alive connection is its own, not a delayed ACK's (vLLM's server sets
    TCP_NODELAY): the handler turns Nagle off on every connection it serves."""
    from tests.support import fake_vllm

    assert fake_vllm.Handler.disable_nagle_algorithm is True
