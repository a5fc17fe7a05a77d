"""A whole profile run against ``tests/support/fake_vllm.py``, a stand-in for vLLM's OpenAI-compatible server.

The Profiler starts the fake exactly as it would start vLLM (``ProfileConfig.command``), once per mode,
drives streaming /v1/completions load at it while scraping its /metrics, and appends one row per cell.
Environment variables make the fake fail at start-up or die mid-run for chosen modes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from graphmode.core.dataset import ProfileStore
from graphmode.core.modes import CudaGraphMode
from graphmode.core.records import CellRecord, StartupInfo
from graphmode.profiling.grid import AdaptiveWindow, LengthDist, Workload
from graphmode.profiling.runner import ProfileConfig, Profiler, ProfileSummary, _Drive
from graphmode.profiling.stats import RequestResult
from tests.support.net import free_port

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]
FAKE_VLLM = ROOT / "tests" / "support" / "fake_vllm.py"
TINY_LLAMA = ROOT / "tests" / "fixtures" / "tiny-llama"

NONE, PIECEWISE, FULL = CudaGraphMode.NONE, CudaGraphMode.PIECEWISE, CudaGraphMode.FULL

PREFILL = Workload(name="tiny-prefill", rate=10, burstiness=1.0, input=LengthDist(mean=256, spread=0.2),
                   output=LengthDist(mean=4), duration_s=2, warmup_s=0.5)
DECODE = Workload(name="tiny-decode", rate=4, burstiness=0.5, input=LengthDist(mean=8),
                  output=LengthDist(mean=16, spread=0.25), duration_s=2, warmup_s=0.5)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def mode_starting(self, mode: CudaGraphMode, pending: int) -> None:
        self.events.append(("mode_starting", f"{mode.value}:{pending}"))

    def mode_started(self, mode: CudaGraphMode, startup: StartupInfo) -> None:
        self.events.append(("mode_started", mode.value))

    def cell_starting(self, mode: CudaGraphMode, workload: Workload, repeat: int) -> None:
        self.events.append(("cell_starting", f"{mode.value}/{workload.name}#{repeat}"))

    def cell_finished(self, record: CellRecord) -> None:
        self.events.append(("cell_finished", f"{record.mode}/{record.workload}#{record.repeat}:{record.status}"))


def config(tmp_path: Path, modes: list[CudaGraphMode], **kw: object) -> ProfileConfig:
    base: dict[str, object] = dict(
        command=[sys.executable, str(FAKE_VLLM)], vllm_args=["--model", str(TINY_LLAMA), "--max-model-len", "2048"],
        modes=modes, workloads=[PREFILL, DECODE], dataset=tmp_path / "profile.sqlite", log_dir=tmp_path / "logs",
        # Generous deadlines: they cost nothing when all goes well and keep a loaded machine from failing cells.
        port=free_port(), scrape_interval_s=0.2, startup_timeout_s=60.0, stop_timeout_s=5.0, drain_grace_s=30.0,
        read_timeout_s=30.0, connect_timeout_s=30.0,
    )
    base.update(kw)
    return ProfileConfig(**base)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ProfileStore]:
    with ProfileStore(tmp_path / "profile.sqlite") as s:
        yield s


def _by_mode(rows: list[dict[str, object]]) -> dict[str, list[dict[str, object]]]:
    out: dict[str, list[dict[str, object]]] = {}
    for r in rows:
        out.setdefault(str(r["mode"]), []).append(r)
    return out


def test_fake_is_where_the_bench_expects_it() -> None:
    assert FAKE_VLLM.is_file()


def test_profile_two_modes_then_resume(tmp_path: Path, store: ProfileStore) -> None:
    cfg = config(tmp_path, [NONE, FULL])
    recorder = Recorder()
    profiler = Profiler(cfg, store, recorder)
    summary = profiler.run()

    assert isinstance(summary, ProfileSummary)
    assert (summary.ok, summary.failed, summary.skipped) == (4, 0, 0), summary.failures
    assert summary.engine_starts == 2  # one start per mode, not per cell
    assert set(summary.startup_s) == {"NONE", "FULL"}
    assert all(v is not None and 0 < v < 60 for v in summary.startup_s.values())
    assert summary.wall_s > 0 and summary.profile_key == profiler.key
    assert [e for e in recorder.events if e[0].startswith("mode")] == [
        ("mode_starting", "NONE:2"), ("mode_started", "NONE"), ("mode_starting", "FULL:2"), ("mode_started", "FULL")]
    assert [e[1] for e in recorder.events if e[0] == "cell_finished"] == [
        "NONE/tiny-prefill#0:ok", "NONE/tiny-decode#0:ok", "FULL/tiny-prefill#0:ok", "FULL/tiny-decode#0:ok"]

    rows = store.rows()
    assert len(rows) == 4
    hashes = {PREFILL.name: PREFILL.spec_hash(), DECODE.name: DECODE.spec_hash()}
    for row in rows:
        assert row["status"] == "ok" and row["reason"] is None
        assert row["run_id"] == summary.run_id and row["profile_key"] == profiler.key
        assert row["workload_hash"] == hashes[row["workload"]]
        assert json.loads(row["workload_spec"])["name"] == row["workload"]
        assert row["n_ok"] > 0 and row["n_err"] == 0 and row["n_sent"] == row["n_ok"]
        assert row["ttft_p50"] > 0 and row["itl_p50"] > 0 and row["e2e_p50"] > row["ttft_p50"]
        assert row["output_tok_s"] > 0 and row["request_throughput"] > 0
        # features from the fake's /metrics, scraped over the measured window (gauges need one sample,
        # rates two; a starved test machine may stretch the 0.2 s scrape interval, so only rows that got
        # two samples are held to the rates)
        assert row["obs_n_samples"] >= 1
        # where the server ran is read from /proc (no GPU here: its readings are None, not errors)
        assert row["engine_cpus"] and all(c.isdigit() for c in row["engine_cpus"].split(","))
        assert row["host_load_1m"] is not None and row["gpu_sm_clock_mhz_mean"] is None
        # the fake server spent CPU serving the cell; the probe and the host counters are always readable
        assert row["engine_cpu_cores"] is not None and row["engine_cpu_cores"] >= 0
        assert row["host_probe_ms"] > 0 and 0 <= row["host_busy_pct"] <= 100 and row["host_steal_pct"] >= 0
        assert row["obs_batch_mean"] is not None and row["obs_kv_usage_mean"] is not None
        if row["obs_n_samples"] >= 2:
            assert row["obs_generation_tokens_rate"] > 0 and row["obs_prompt_tokens_rate"] > 0
            assert row["obs_completion_rate"] > 0 and row["obs_iter_tokens_mean"] > 0
        if row["obs_n_samples"] >= 2 and row["workload"] == DECODE.name:
            # the fake's own timing from /metrics beside the client's: the same steps, though the client's
            # cell and the scrape window do not cover quite the same gaps (0.65x on a quiet run)
            assert row["itl_mean"] / 3 <= row["server_itl_mean"] <= 3 * row["itl_mean"]
        # start-up and fingerprint
        assert row["startup_s"] == summary.startup_s[row["mode"]]
        assert row["requested_mode"] == row["mode"]
        assert row["fp_vllm_version"] == "0.0.0+fake"
        assert row["fp_model_architecture"] == "LlamaForCausalLM"
        assert "--max-model-len" in json.loads(row["fp_vllm_args"])
    assert any(r["obs_n_samples"] >= 2 for r in rows)
    by = {(r["mode"], r["workload"]): r for r in rows}
    prefill, decode = by[("FULL", "tiny-prefill")], by[("FULL", "tiny-decode")]
    assert prefill["sent_input_tokens_mean"] > 150 and prefill["sent_output_tokens_mean"] == 4
    assert decode["sent_input_tokens_mean"] == 8 and decode["sent_output_tokens_mean"] > 10
    assert prefill["capture_s"] == 2.0 and prefill["graph_gib"] == 0.38 and prefill["effective_mode"] == "FULL"
    assert by[("NONE", "tiny-prefill")]["capture_s"] is None
    assert by[("NONE", "tiny-prefill")]["effective_mode"] == "NONE"
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == [f"{summary.run_id}-FULL-r0.log", f"{summary.run_id}-NONE-r0.log"]  # one log per engine start

    # --resume: nothing left to do, no engine is started, no row is added
    again = Profiler(dataclasses.replace(cfg, resume=True), store, Recorder())
    assert again.key == profiler.key
    assert all(not cells for cells in again.pending().values())
    resumed = again.run()
    assert (resumed.ok, resumed.failed, resumed.skipped, resumed.engine_starts) == (0, 0, 4, 0)
    assert store.count() == 4

    # a new mode, more repeats or a changed workload spec are pending; what was measured is not
    more = Profiler(dataclasses.replace(cfg, resume=True, modes=[NONE, FULL, PIECEWISE], repeats=2), store)
    pending = {m.value: [(w.name, r) for w, r in cells] for m, cells in more.pending().items()}
    assert pending == {
        "NONE": [("tiny-prefill", 1), ("tiny-decode", 1)],
        "FULL": [("tiny-prefill", 1), ("tiny-decode", 1)],
        "PIECEWISE": [("tiny-prefill", 0), ("tiny-prefill", 1), ("tiny-decode", 0), ("tiny-decode", 1)],
    }
    faster = PREFILL.model_copy(update={"rate": 11.0})
    changed = Profiler(dataclasses.replace(cfg, resume=True, workloads=[faster, DECODE]), store)
    assert {m.value: [w.name for w, _ in c] for m, c in changed.pending().items()} == {
        "NONE": ["tiny-prefill"], "FULL": ["tiny-prefill"]}
    # a vLLM upgrade under the same args keeps the key (fixed before vLLM starts), but rows measured under
    # the old release (the fake logs 0.0.0+fake) no longer count as done; another local build tag does
    upgraded = Profiler(dataclasses.replace(cfg, resume=True), store)
    upgraded.vllm_version = "0.25.0"
    assert upgraded.key == profiler.key and sum(len(c) for c in upgraded.pending().values()) == 4
    upgraded.vllm_version = "0.0.0+cu130"
    assert all(not c for c in upgraded.pending().values())
    # other vLLM args make another profile key: nothing of it is done
    other = Profiler(dataclasses.replace(cfg, resume=True, vllm_args=[*cfg.vllm_args, "--max-num-seqs", "8"]),
                     store)
    assert other.key != profiler.key
    assert sum(len(c) for c in other.pending().values()) == 4


def test_each_repeat_gets_its_own_engine_start_and_modes_take_turns(tmp_path: Path, store: ProfileStore) -> None:
    # Repeats replicate the engine start (per-start noise is the larger part), so repeat 1 must not reuse the
    # start that measured repeat 0; and the rounds interleave the modes so drift hits all of them alike.
    quick = DECODE.model_copy(update={"duration_s": 1.0, "warmup_s": 0.2})
    cfg = config(tmp_path, [NONE, FULL], workloads=[quick], repeats=2)
    recorder = Recorder()
    summary = Profiler(cfg, store, recorder).run()

    assert (summary.ok, summary.failed, summary.engine_starts) == (4, 0, 4), summary.failures
    assert [e[1] for e in recorder.events if e[0] == "cell_finished"] == [
        "NONE/tiny-decode#0:ok", "FULL/tiny-decode#0:ok", "NONE/tiny-decode#1:ok", "FULL/tiny-decode#1:ok"]
    assert [e[1] for e in recorder.events if e[0] == "mode_starting"] == ["NONE:1", "FULL:1", "NONE:1", "FULL:1"]
    assert sorted((str(r["mode"]), r["repeat"]) for r in store.rows()) == [
        ("FULL", 0), ("FULL", 1), ("NONE", 0), ("NONE", 1)]


def test_failures_fail_the_mode_and_the_run_goes_on(tmp_path: Path, store: ProfileStore) -> None:
    env = {"FAKE_VLLM_FAIL_AT_START": "NONE", "FAKE_VLLM_EXIT_AFTER": "4", "FAKE_VLLM_EXIT_MODE": "PIECEWISE"}
    cfg = config(tmp_path, [NONE, PIECEWISE, FULL], env=env)
    recorder = Recorder()
    summary = Profiler(cfg, store, recorder).run()

    assert summary.engine_starts == 3
    assert (summary.ok, summary.failed, summary.skipped) == (2, 4, 0)
    assert summary.startup_s["NONE"] is None and summary.startup_s["FULL"] is not None
    assert any(f.startswith("NONE: ") and "before it became healthy" in f for f in summary.failures)
    assert any(f.startswith("PIECEWISE: ") and "while serving" in f for f in summary.failures)
    assert ("mode_started", "NONE") not in recorder.events

    rows = _by_mode(store.rows())
    assert [r["status"] for r in rows["FULL"]] == ["ok", "ok"]
    # start-up failure: every cell of the mode failed, with the exit status and the root cause
    assert [r["workload"] for r in rows["NONE"]] == ["tiny-prefill", "tiny-decode"]
    for r in rows["NONE"]:
        assert r["status"] == "failed"
        reason = str(r["reason"])
        assert "vLLM exited with status 1 before it became healthy" in reason
        assert "ValueError: fake vLLM refuses cudagraph_mode NONE" in reason
    # death mid-run: the cell in flight and the rest of the mode failed, with the reason
    assert [r["workload"] for r in rows["PIECEWISE"]] == ["tiny-prefill", "tiny-decode"]
    for r in rows["PIECEWISE"]:
        assert r["status"] == "failed"
        reason = str(r["reason"])
        assert "vLLM exited with status 3 while serving" in reason
        assert "RuntimeError: fake engine core died" in reason
        assert r["startup_s"] is not None  # it did start
    assert rows["PIECEWISE"][0]["capture_s"] == 3.0

    # failed cells stay pending for --resume; the ok ones do not
    resume = Profiler(dataclasses.replace(cfg, resume=True, env={}), store)
    assert {m.value: len(c) for m, c in resume.pending().items()} == {"NONE": 2, "PIECEWISE": 2, "FULL": 0}


def test_adaptive_cells_stop_early_cut_in_flight_and_leave_the_server_idle(tmp_path: Path,
                                                                           store: ProfileStore) -> None:
    # Real processes on a real clock: when the stopping rule fires depends on how busy this machine is, so
    # the rule itself is tested in virtual time (test_the_stopping_rule_in_virtual_time) and here every
    # bound is derived from what the run measured. Long decodes at a steady rate: on a quiet machine the
    # ITL interval tightens within a few half-second batches, and requests are streaming when it stops.
    steady = Workload(name="steady-decode", rate=20, burstiness=1.0, input=LengthDist(mean=16),
                      output=LengthDist(mean=200), duration_s=20, warmup_s=3,
                      adaptive=AdaptiveWindow(min_s=1.5, ci={"itl_p50": 0.05}))
    # An interval that cannot tighten in time on any machine (TTFT at 2 req/s, ±1%: too few requests
    # arrive): the cell runs to its bound.
    capped = Workload(name="capped", rate=2, burstiness=1.0, input=LengthDist(mean=64, spread=0.5),
                      output=LengthDist(mean=8), duration_s=2.0, warmup_s=1.0,
                      adaptive=AdaptiveWindow(min_s=1.0, ci={"ttft_p50": 0.01}))
    assert steady.adaptive is not None and capped.adaptive is not None
    cfg = config(tmp_path, [FULL], workloads=[steady, capped])
    summary = Profiler(cfg, store).run()
    assert (summary.ok, summary.failed) == (2, 0), summary.failures
    rows = {r["workload"]: r for r in store.rows()}
    s, c = rows["steady-decode"], rows["capped"]

    if s["stopped_by"] == "ci":  # the interval met its target before the bound
        assert s["itl_p50_ci"] is not None and s["itl_p50_ci"] <= 0.05
        assert steady.adaptive.min_s <= s["duration_s"] < steady.duration_s
    else:  # a machine too loaded for the interval to tighten: the cell ran to its bound
        assert s["stopped_by"] == "max" and s["duration_s"] >= steady.duration_s
    # warm-up is one request lifetime: it ends before its cap unless requests here outlive the cap
    assert s["warmup_used_s"] >= steady.adaptive.min_warmup_s
    assert s["warmup_used_s"] < steady.warmup_s or s["e2e_p50"] >= steady.warmup_s
    assert s["n_cut"] > 0 and s["n_err"] == 0  # in-flight requests were cut, not counted as errors
    assert s["itl_p50"] > 0 and s["tpot_p50"] > 0 and s["output_tok_s"] > 0 and s["n_sent"] > 0
    assert s["e2e_p50"] is None or s["e2e_p50"] > s["ttft_p50"]

    # the controller checks every check_every_s; a loaded machine may wake it late, not early
    late = 4 * capped.adaptive.check_every_s
    assert c["stopped_by"] == "max" and capped.duration_s <= c["duration_s"] < capped.duration_s + late
    assert c["warmup_used_s"] <= capped.warmup_s + late
    assert c["ttft_p50"] is not None
    # the fake served nothing more once the run ended: the cut requests were aborted, not left running
    assert c["n_err"] == 0


def _virtual_load(rate: float, tokens: int, itl: float, noise: float) -> tuple[Any, Any, list[RequestResult]]:
    """A clock, a sleep that advances it, and request results that stream in as virtual time passes:
    requests arrive at ``rate``, each emits ``tokens`` gaps of ``itl`` ± ``noise`` (seeded)."""
    rng = random.Random(7)
    now = [0.0]
    results: list[RequestResult] = []
    plans: list[tuple[float, list[float]]] = []

    def advance(to: float) -> None:
        while len(plans) < int(to * rate) + 1:
            at = len(plans) / rate
            plans.append((at, [itl * (1 + rng.uniform(-noise, noise)) for _ in range(tokens)]))
        for i, (at, gaps) in enumerate(plans):
            if at > to:
                break
            if i == len(results):
                results.append(RequestResult(sent_at=at, input_tokens=16, max_tokens=tokens, started_at=at))
            r = results[i]
            t = at + itl + sum(r.itls)  # the first token after one step, then one gap per token
            if r.ttft is None and t <= to:
                r.ttft, r.first_at = itl, t
            while len(r.itls) < tokens and t + gaps[len(r.itls)] <= to:
                t += gaps[len(r.itls)]
                r.itls.append(gaps[len(r.itls)])
                r.itl_at.append(t)
            if len(r.itls) == tokens and r.done_at is None:
                r.done_at, r.ok = t, True
        now[0] = to

    async def sleep(dt: float) -> None:
        advance(now[0] + dt)
        await asyncio.sleep(0)

    return (lambda: now[0]), sleep, results


def test_a_race_cell_measures_the_same_window_on_a_fast_and_a_slow_engine() -> None:
    """A race cell's warm-up is fixed: the arms of a round measure one window of one plan, whatever their
    speed. (A warm-up of one request lifetime ended 4x later on the slow engine here.)"""
    from graphmode.profiling.race_design import race_cell

    cell = race_cell(Workload(name="v", rate=20, input=LengthDist(mean=16), output=LengthDist(mean=100),
                              duration_s=20, warmup_s=5), cell_s=3.0, warmup_s=2.0)
    windows = []
    for itl in (0.003, 0.012):  # first request done at ~0.3 s and ~1.2 s
        clock, sleep, results = _virtual_load(rate=20, tokens=100, itl=itl, noise=0.0)
        drive = _Drive(t0=0.0, t_measure=0.0, t_end=0.0, snapshots=[], results=results)
        asyncio.run(Profiler._control(cell, drive, asyncio.Event(), clock=clock, sleep=sleep))
        assert min(r.done_at for r in results if r.done_at is not None) < 2.0
        windows.append((drive.t_measure, drive.t_end))
    (m0, e0), (m1, e1) = windows
    assert m0 == pytest.approx(2.0, abs=1e-6) and m1 == pytest.approx(2.0, abs=1e-6)  # on the dot, not polled
    assert e0 - m0 == pytest.approx(3.0, abs=0.06) and e1 - m1 == pytest.approx(3.0, abs=0.06)


def _lagging(sleep: Callable[[float], Awaitable[None]], lag: float) -> Callable[[float], Awaitable[None]]:
    async def oversleep(dt: float) -> None:
        await sleep(dt + lag)
    return oversleep


def test_a_late_wake_up_does_not_move_a_fixed_window() -> None:
    """On a loaded host the event loop wakes late from the warm-up's sleep; a fixed window still starts at the
    planned instant (a clean-clone CI run once saw arms 10 ms apart), while the window's length is kept."""
    from graphmode.profiling.race_design import race_cell

    cell = race_cell(Workload(name="v", rate=20, input=LengthDist(mean=16), output=LengthDist(mean=100),
                              duration_s=20, warmup_s=5), cell_s=3.0, warmup_s=2.0)
    starts = []
    for lag in (0.0, 0.013, 0.041):
        clock, sleep, results = _virtual_load(rate=20, tokens=100, itl=0.003, noise=0.0)

        late = _lagging(sleep, lag)

        drive = _Drive(t0=0.0, t_measure=0.0, t_end=0.0, snapshots=[], results=results)
        asyncio.run(Profiler._control(cell, drive, asyncio.Event(), clock=clock, sleep=late))
        assert drive.t_end - drive.t_measure >= 3.0 - 1e-9
        starts.append(drive.t_measure)
    assert starts == [2.0, 2.0, 2.0]


@pytest.mark.parametrize(("noise", "target", "stopped_by"), [(0.2, 0.05, "ci"), (0.2, 0.001, "max")])
def test_the_stopping_rule_in_virtual_time(noise: float, target: float, stopped_by: str) -> None:
    """Warm-up ends with the first request's lifetime; the window stops when every interval meets its
    target, else at its bound. Virtual time: the same answer on any machine, at any load."""
    w = Workload(name="v", rate=20, input=LengthDist(mean=16), output=LengthDist(mean=100), duration_s=20,
                 warmup_s=3, adaptive=AdaptiveWindow(min_s=1.5, ci={"itl_p50": target}))
    assert w.adaptive is not None
    clock, sleep, results = _virtual_load(rate=20, tokens=100, itl=0.01, noise=noise)
    drive = _Drive(t0=0.0, t_measure=0.0, t_end=0.0, snapshots=[], results=results)
    asyncio.run(Profiler._control(w, drive, asyncio.Event(), clock=clock, sleep=sleep))
    first_done = min(r.done_at for r in results if r.done_at is not None)
    assert first_done <= drive.t_measure < first_done + 0.05 + 1e-9  # one request lifetime (checked every 50 ms)
    assert drive.stopped_by == stopped_by
    window = drive.t_end - drive.t_measure
    if stopped_by == "ci":
        assert w.adaptive.min_s <= window < 5  # a few half-second batches, far from the 20 s bound
    else:
        assert window == pytest.approx(w.duration_s)


def test_a_server_dying_inside_an_adaptive_cell_fails_the_mode_not_the_run(tmp_path: Path,
                                                                           store: ProfileStore) -> None:
    ad = AdaptiveWindow(min_s=1.0, ci={"itl_p50": 0.05})
    first = Workload(name="ad-1", rate=10, input=LengthDist(mean=16), output=LengthDist(mean=50),
                     duration_s=6, warmup_s=2, adaptive=ad)
    second = first.model_copy(update={"name": "ad-2"})
    env = {"FAKE_VLLM_EXIT_AFTER": "8", "FAKE_VLLM_EXIT_MODE": "PIECEWISE"}
    summary = Profiler(config(tmp_path, [PIECEWISE, FULL], workloads=[first, second], env=env), store).run()
    assert (summary.ok, summary.failed) == (2, 2), summary.failures
    rows = _by_mode(store.rows())
    assert [r["status"] for r in rows["PIECEWISE"]] == ["failed", "failed"]
    assert all("while serving" in str(r["reason"]) for r in rows["PIECEWISE"])
    assert [r["status"] for r in rows["FULL"]] == ["ok", "ok"]
    assert all(r["stopped_by"] in ("ci", "max") and r["n_err"] == 0 for r in rows["FULL"])


def test_a_closed_loop_cell_above_its_cap_measures_what_left_after_warm_up(tmp_path: Path,
                                                                         store: ProfileStore) -> None:
    # 2000 req/s against 4 slots: most requests wait for a slot, and those planned late never leave. The cell
    # counts requests by when they actually left (H200: 2000 req/s against 768 slots measured none by plan time).
    closed = Workload(name="closed-above-cap", rate=2000, burstiness=1.0, input=LengthDist(mean=8),
                      output=LengthDist(mean=16), duration_s=1.5, warmup_s=0.5, max_concurrency=4)
    summary = Profiler(config(tmp_path, [FULL], workloads=[closed], drain_grace_s=30.0), store).run()
    assert (summary.ok, summary.failed) == (1, 0), summary.failures
    (row,) = store.rows()
    # the backlog at the window's end is not sent, so the cell ends when what left has drained, not at the
    # deadline 30 s later
    assert row["finished_at"] - row["started_at"] < 15
    assert row["status"] == "ok" and row["n_ok"] > 0
    # the backlog still queued at the deadline is neither sent nor an error
    assert row["n_err"] == 0 and row["n_sent"] == row["n_ok"]
    assert row["sent_rate"] == pytest.approx(row["n_sent"] / 1.5) and row["sent_rate"] < 2000
